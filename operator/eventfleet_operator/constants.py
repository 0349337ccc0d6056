"""The operator's fixed vocabulary: the protocol port table, conditions and reasons.

``PROTOCOL_PORTS`` is the one place that says which ports a replica listens on. It is
built from the protocol registry (`eventfleet_server.registry`, pure data: the one
module of the replica the operator reads) plus the HTTP port. The CRD parser
(:mod:`~eventfleet_operator.model`), the port validation, the replica config, the
container ports and both Services iterate it, so a protocol that needs its own ports is
one registry entry (plus its ``spec.ports`` key in the CRD, which
tests/unit/operator/test_op_registry.py keeps in step with the registry). Protocols
served over the HTTP port (websockets) have no ports.

Condition types, reasons, phases and the kinds of child writes are enums rather than
strings scattered over the modules, so that code branches on members, never on text.
They are ``StrEnum``: each member *is* its string, which is what goes into the status,
Kubernetes Events and metric labels.
"""

from __future__ import annotations

import dataclasses
import enum

from eventfleet_server import registry

from eventfleet_operator import crd


class Service(enum.StrEnum):
    """The Services that expose replica ports (see :mod:`~eventfleet_operator.naming`)."""

    CLIENT = "client"  # ClusterIP, serving replicas only: what clients connect to
    PEERS = "peers"  # headless, every pod: the Syncer mesh and per-pod HTTP (/status, scrape)


@dataclasses.dataclass(frozen=True)
class ProtocolPort:
    """A protocol's block of ``width`` consecutive ports starting at ``spec.ports.<protocol>``.

    ``protocol`` is the key under ``spec.ports`` and the replica config section it
    configures; ``name`` the port name in the container and the Services (an
    IANA_SVC_NAME: at most 15 characters). A block wider than one port names its ports
    ``port_names`` (``name-0``, ``name-1``... when not given). ``optional`` protocols are
    served only when ``spec.protocols.<protocol>.enabled`` is true; an optional protocol
    that this version does not ``implement`` keeps its ports reserved (validation still
    checks them for overlaps) but enabling it is reported as
    ``Ready=False/ProtocolNotImplemented`` and nothing of it is rendered.
    """

    protocol: str
    name: str
    default: int
    width: int = 1
    services: tuple[Service, ...] = (Service.CLIENT,)
    optional: bool = False
    implemented: bool = True
    enabled_by_default: bool = False  # optional protocols: spec.protocols.<p>.enabled default
    port_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = self.names
        if len(names) != self.width:
            raise ValueError(f"{self.protocol}: {len(names)} port names for width {self.width}")
        for name in names:
            if not 1 <= len(name) <= 15:
                raise ValueError(f"{self.protocol}: port name {name!r} must be 1-15 characters")

    @property
    def names(self) -> tuple[str, ...]:
        if self.port_names:
            return self.port_names
        if self.width == 1:
            return (self.name,)
        return tuple(f"{self.name}-{i}" for i in range(self.width))

    @property
    def max_base(self) -> int:
        """The highest base port that still fits the whole block below 65536."""
        return 65535 - (self.width - 1)

    def ports(self, base: int) -> tuple[tuple[str, int], ...]:
        """``(port name, port)`` of every port of the block starting at ``base``."""
        return tuple((name, base + i) for i, name in enumerate(self.names))


MIN_PORT = 1024  # replicas run as non-root: no privileged ports

# One entry per protocol of the registry that listens on ports of its own (in the
# registry's order; protocols on the HTTP port need none), then the HTTP port.
PROTOCOL_PORTS: tuple[ProtocolPort, ...] = (
    *(
        ProtocolPort(
            p.name,
            p.name,
            p.port,
            width=p.width,
            services=tuple(Service(s) for s in p.services),
            optional=p.optional,
            enabled_by_default=p.optional and p.enabled_by_default,
            port_names=p.port_names,
        )
        for p in registry.PROTOCOLS
        if p.port is not None
    ),
    # /metrics, /healthz, /readyz, /status, /flush and the websocket protocols.
    ProtocolPort(
        "http", "http", crd.default("spec.ports.http"), services=(Service.CLIENT, Service.PEERS)
    ),
)


def protocol_port(protocol: str) -> ProtocolPort:
    """The table entry of ``protocol``; ``KeyError`` naming it if there is none."""
    for entry in PROTOCOL_PORTS:
        if entry.protocol == protocol:
            return entry
    raise KeyError(f"no protocol port entry {protocol!r}")


class ConditionType(enum.StrEnum):
    READY = "Ready"
    PEERS_SYNCED = "PeersSynced"
    SCALE_DOWN_HELD = "ScaleDownHeld"
    AGGREGATION_SCHEDULED = "AggregationScheduled"
    MONITORING_CONFIGURED = "MonitoringConfigured"
    RECONCILE_PAUSED = "ReconcilePaused"
    HIBERNATED = "Hibernated"
    PROGRESSING = "Progressing"
    STORAGE_RESIZING = "StorageResizing"
    TOKENS_LOADED = "TokensLoaded"
    CERTIFICATE_READY = "CertificateReady"


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Reason(enum.StrEnum):
    """Every condition reason (also the reason of the Kubernetes Event it causes)."""

    # Ready
    INVALID_SPEC = "InvalidSpec"
    APPLY_FAILED = "ApplyFailed"
    TOKEN_SECRET_NOT_FOUND = "TokenSecretNotFound"
    IMMUTABLE_FIELD_CHANGED = "ImmutableFieldChanged"
    PROTOCOL_NOT_IMPLEMENTED = "ProtocolNotImplemented"
    SCALE_DOWN_HELD = "ScaleDownHeld"
    SCALING = "Scaling"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    STATEFULSET_STATUS_STALE = "StatefulSetStatusStale"
    CHILD_NOT_OWNED = "ChildNotOwned"
    HIBERNATING = "Hibernating"
    HIBERNATED = "Hibernated"
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    STORAGE_SCHEMA_TOO_NEW = "StorageSchemaTooNew"
    # Progressing
    ROLLING_OUT = "RollingOut"
    ROLLOUT_COMPLETE = "RolloutComplete"
    REPLICA_RESTARTED = "ReplicaRestarted"  # the Event of each replaced pod
    FLUSH_VERIFIED = "FlushVerified"  # the Event answering eventfleet.io/flush
    # StorageResizing
    RESIZING = "Resizing"
    RESIZED = "Resized"
    NOT_RESIZING = "NotResizing"
    EXPANSION_NOT_ALLOWED = "ExpansionNotAllowed"
    # ReconcilePaused
    PAUSED = "Paused"
    NOT_PAUSED = "NotPaused"
    # Hibernated (also HIBERNATING)
    NOT_HIBERNATING = "NotHibernating"
    ALL_REPLICAS_READY = "AllReplicasReady"
    # TokensLoaded (also the Event when a token Secret changed: TOKENS_CHANGED)
    ALL_TOKENS_LOADED = "AllTokensLoaded"
    TOKENS_RELOADING = "TokensReloading"
    TOKENS_UNKNOWN = "TokensUnknown"
    TOKENS_CHANGED = "TokensChanged"
    # CertificateReady (spec.tls); CERTIFICATE_ISSUED is also the Event of each issue
    CERTIFICATE_ISSUED = "CertificateIssued"
    CERTIFICATE_VALID = "CertificateValid"
    CERTIFICATE_PENDING = "CertificatePending"
    CERTIFICATE_FAILED = "CertificateFailed"
    TLS_DISABLED = "TLSDisabled"
    # Events of eventfleet.io/rotate-peer-token
    PEER_TOKEN_ROTATION = "PeerTokenRotation"  # a step written
    PEER_TOKEN_ROTATED = "PeerTokenRotated"
    PEER_TOKEN_ROTATION_REFUSED = "PeerTokenRotationRefused"
    # PeersSynced
    NO_REPLICAS = "NoReplicas"
    STATUS_UNAVAILABLE = "StatusUnavailable"
    PEERS_SYNCING = "PeersSyncing"
    ALL_PEERS_SYNCED = "AllPeersSynced"
    # ScaleDownHeld (the decision of scaling.plan)
    NOT_SCALING_DOWN = "NotScalingDown"
    SCALE_DOWN_FORCED = "ScaleDownForced"
    SCALE_DOWN_VERIFIED = "ScaleDownVerified"
    REPLICA_UNREACHABLE = "ReplicaUnreachable"
    WRONG_REPLICA = "WrongReplica"
    FLUSH_FAILED = "FlushFailed"
    EVENTS_NOT_REPLICATED = "EventsNotReplicated"
    # AggregationScheduled, MonitoringConfigured
    DISABLED = "Disabled"
    APPLIED = "Applied"
    PENDING = "Pending"
    SPARK_OPERATOR_NOT_INSTALLED = "SparkOperatorNotInstalled"
    PROMETHEUS_OPERATOR_NOT_INSTALLED = "PrometheusOperatorNotInstalled"


# Ready reasons that are a problem with the spec or the cluster (a Warning Event even
# when the fleet was never ready), as opposed to a fleet that is still starting.
READY_PROBLEMS = frozenset(
    {
        Reason.INVALID_SPEC,
        Reason.APPLY_FAILED,
        Reason.TOKEN_SECRET_NOT_FOUND,
        Reason.IMMUTABLE_FIELD_CHANGED,
        Reason.STORAGE_SCHEMA_TOO_NEW,
        Reason.PROTOCOL_NOT_IMPLEMENTED,
        Reason.CHILD_NOT_OWNED,
    }
)
# Reasons of an optional child (aggregation, monitoring) that deserve a Warning Event.
OPTIONAL_CHILD_PROBLEMS = frozenset(
    {
        Reason.SPARK_OPERATOR_NOT_INSTALLED,
        Reason.PROMETHEUS_OPERATOR_NOT_INSTALLED,
        Reason.APPLY_FAILED,
    }
)


class Phase(enum.StrEnum):
    """``status.phase``: for display only; automation reads the conditions."""

    PENDING = "Pending"
    RUNNING = "Running"
    SCALING = "Scaling"
    DEGRADED = "Degraded"
    FAILED = "Failed"
    HIBERNATED = "Hibernated"


class EventType(enum.StrEnum):
    """The ``type`` of a Kubernetes Event."""

    NORMAL = "Normal"
    WARNING = "Warning"


class Operation(enum.StrEnum):
    """What the operator did to a child (the ``operation`` label of child writes)."""

    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"

    @property
    def event_reason(self) -> str:
        """The Kubernetes Event reason for it: ``Created``, ``Updated``, ``Deleted``."""
        return self.value.capitalize()


class PassResult(enum.StrEnum):
    """The ``result`` label of ``eventfleet_operator_reconciles_total``."""

    OK = "ok"
    INVALID_SPEC = "invalid_spec"
    APPLY_FAILED = "apply_failed"
    ERROR = "error"
