"""The parsed, validated ``EventServer`` spec.

The CRD schema (``crds/eventfleet.io_eventservers.yaml``) rejects most bad input at the
API server and applies the defaults. :func:`parse` applies the same defaults again, read
from the same schema (:mod:`~eventfleet_operator.crd`: the operator must not depend on
API-server defaulting, e.g. for objects stored before a CRD upgrade), then builds one
frozen dataclass per spec section from the defaulted spec and checks what a structural
schema cannot: cron syntax, port overlaps, cross-field rules, name limits. No default,
integer bound or choice list the CRD states is repeated here; the defaults written below
are the ones the CRD cannot state (the image of this version, the fleet's backup prefix).
Every problem is a :class:`SpecError` naming the field and the bad value.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from eventfleet_operator import __version__, constants, crd
from eventfleet_operator.constants import ProtocolPort, Service

DEFAULT_SERVER_IMAGE = f"eventfleet/server:{__version__}"
DEFAULT_SPARK_IMAGE = f"eventfleet/spark:{__version__}"

# StatefulSet pods get a `controller-revision-hash: <name>-<hash>` label (<= 63 chars,
# hash up to 10) and Services need DNS-1035 names: the CRD has the same CEL rules.
MAX_NAME_LENGTH = 52
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?)([KMGTPE]i?|[numk])?$")
_SPARK_MEMORY = re.compile(r"^[0-9]+[kmgt]?$")
_DURATION = re.compile(r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$")
_CRON_DESCRIPTORS = {
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
}
_CRON_FIELD = re.compile(r"^(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?$")
# The choices of the enum fields, as the CRD lists them.
SYNCHRONOUS_MODES = crd.choices("spec.storage.synchronous")
RETENTION_POLICIES = crd.choices("spec.storage.retentionPolicy.whenDeleted")
PULL_POLICIES = crd.choices("spec.imagePullPolicy")
CONCURRENCY_POLICIES = crd.choices("spec.aggregation.concurrencyPolicy")
LOG_LEVELS = crd.choices("spec.logLevel")
UPDATE_STRATEGIES = crd.choices("spec.updateStrategy.type")
TLS_PROVIDERS = crd.choices("spec.tls.provider")
ISSUER_KINDS = crd.choices("spec.tls.issuerRef.kind")
EVICTION_POLICIES = crd.choices("spec.podDisruptionBudget.unhealthyPodEvictionPolicy")
ADDRESSING_STYLES = crd.choices("spec.backup.s3.addressingStyle")


class SpecError(ValueError):
    """An ``EventServer`` spec the operator cannot act on; ``field`` is its JSON path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclasses.dataclass(frozen=True)
class Ports:
    """``spec.ports``: the base port of every :data:`PROTOCOL_PORTS` entry.

    Read as ``ports["eventer"]`` or ``ports.eventer``.
    """

    bases: tuple[tuple[str, int], ...]

    def __getitem__(self, protocol: str) -> int:
        for name, port in self.bases:
            if name == protocol:
                return port
        raise KeyError(f"no protocol port entry {protocol!r}")

    def __getattr__(self, protocol: str) -> int:
        if protocol.startswith("_") or protocol == "bases":
            raise AttributeError(protocol)  # copy/pickle probe dunders before fields exist
        try:
            return self[protocol]
        except KeyError as e:
            raise AttributeError(protocol) from e


@dataclasses.dataclass(frozen=True)
class Storage:
    size: str
    storage_class_name: str | None
    synchronous: str
    when_deleted: str
    when_scaled: str


@dataclasses.dataclass(frozen=True)
class TokenRef:
    """Where the replicas' token lives: a user Secret, or the generated ``<name>-token``."""

    secret_name: str
    key: str
    generated: bool = True


@dataclasses.dataclass(frozen=True)
class ClientsSpec:
    """``spec.clients``: the hat-compatible mode (docs/security.md).

    Hat components have no token setting; ``allow_tokenless`` admits Eventer clients
    that present no token (a wrong token is still refused), only from
    ``tokenless_networks`` (addresses or CIDRs) when that is not empty.
    """

    allow_tokenless: bool
    tokenless_networks: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class IssuerRef:
    """A cert-manager issuer (``spec.tls.issuerRef``)."""

    name: str
    kind: str
    group: str


@dataclasses.dataclass(frozen=True)
class TlsSpec:
    """``spec.tls`` (docs/security.md, "TLS on Kubernetes").

    ``provider``: ``Auto`` uses cert-manager when its CRDs are installed and else the
    operator's own CA; ``CertManager`` or ``Operator`` force one. ``issuer`` (cert-manager
    only): sign with this issuer instead of a per-fleet CA the operator sets up in
    cert-manager. ``http``: HTTPS on the HTTP port too (probes follow).
    """

    enabled: bool
    provider: str
    http: bool
    issuer: IssuerRef | None


@dataclasses.dataclass(frozen=True)
class BusCurveSpec:
    """``spec.protocols.bus.curve`` (docs/security.md, "Event BUS CURVE").

    On: the replicas serve CURVE on the BUS ports with the server key pair the operator
    issues in the Secret ``<name>-bus-curve`` (``server.key``, ``server.pub``); clients
    are admitted by the public keys of ``allowed_keys_secret`` (every key of that Secret
    a file of keys) and/or, with ``tokens``, by the key pair derived from the fleet token.
    ``plain_port`` adds PLAIN listeners (the fleet token in clear text) on plain_port ..
    +2 for clients without CURVE, from ``plain_networks`` only when that is not empty.
    """

    enabled: bool
    tokens: bool
    allowed_keys_secret: str | None
    plain_port: int | None = None
    plain_networks: tuple[str, ...] = ()

    def plain_ports(self) -> tuple[tuple[str, int], ...]:
        """``(port name, port)`` of the PLAIN listeners (none without ``plain_port``):
        named as the replica's /status names them."""
        if self.plain_port is None:
            return ()
        names = ("plain-snapshot", "plain-publisher", "plain-collector")
        return tuple((name, self.plain_port + i) for i, name in enumerate(names))


@dataclasses.dataclass(frozen=True)
class Retention:
    max_age_seconds: int | None = None
    max_events: int | None = None


@dataclasses.dataclass(frozen=True)
class JetstreamSpec:
    """``spec.protocols.jetstream``: served on the HTTP port (websocket), so no ports."""

    enabled: bool
    path: str
    type_prefix: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ServiceMonitorSpec:
    enabled: bool
    interval: str
    labels: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class SparkPod:
    cores: int
    memory: str
    instances: int  # executors only (a driver's is 1)


# Where spec.aggregation.outputVolume's claim is mounted in the driver and executors.
AGGREGATION_OUTPUT_DIR = "/var/lib/eventfleet/aggregates"
# The job's output when neither spec.aggregation.output nor an outputVolume is set: the
# driver pod's filesystem, lost with the pod (the status says so).
EPHEMERAL_AGGREGATION_OUTPUT = "/tmp/eventfleet/aggregates"
# Environment variables the operator sets itself in the Spark pods (the job reads them).
RESERVED_SPARK_ENV = ("EVENTFLEET_TOKEN", "EVENTFLEET_TLS_CA")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """``spec.aggregation``: the scheduled Spark job and where it writes."""

    enabled: bool
    schedule: str
    time_zone: str
    concurrency_policy: str
    suspend: bool
    bucket_seconds: int
    window_seconds: int
    output: str
    image: str
    spark_version: str
    service_account_name: str
    driver: SparkPod
    executor: SparkPod
    # outputVolume.persistentVolumeClaim.claimName, mounted at AGGREGATION_OUTPUT_DIR.
    output_claim: str
    spark_conf: Mapping[str, str]
    hadoop_conf: Mapping[str, str]
    env: tuple[Mapping[str, Any], ...]  # core/v1 EnvVar, driver and executors

    @property
    def output_is_ephemeral(self) -> bool:
        """The output is a local path on no volume: it dies with the driver pod."""
        return not self.output_claim and not _URL_SCHEME.match(self.output)


# Who scrapes /metrics by default: prometheus-operator labels its Prometheus pods so.
DEFAULT_MONITORING_FROM: tuple[Mapping[str, Any], ...] = (
    {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    },
)


@dataclasses.dataclass(frozen=True)
class NetworkPolicySpec:
    """``spec.networkPolicy``: one NetworkPolicy per fleet, on unless disabled.

    ``client_from`` empty means the client ports are open to every source;
    ``http_from`` adds sources for the HTTP port (websocket clients) beyond the
    operator, the monitoring sources and the fleet itself.
    """

    enabled: bool
    client_from: tuple[Mapping[str, Any], ...]
    monitoring_from: tuple[Mapping[str, Any], ...]
    http_from: tuple[Mapping[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class DisruptionBudget:
    """``spec.podDisruptionBudget``. AlwaysAllow: a crash-looping pod can still be
    drained (with IfHealthyBudget an unhealthy pod blocks node drains)."""

    enabled: bool
    max_unavailable: int | str
    unhealthy_pod_eviction_policy: str


@dataclasses.dataclass(frozen=True)
class SecurityContext:
    run_as_user: int
    run_as_group: int
    fs_group: int


@dataclasses.dataclass(frozen=True)
class ReplicationSpec:
    """``spec.protocols.replication``: tables published over Replication (HTTP port)."""

    enabled: bool
    type_prefix: tuple[str, ...]
    # Each: {"name", "key", "columns" (or None), "add", "delete"}, in the replica's terms.
    tables: tuple[Mapping[str, Any], ...]
    users_secret: str | None
    users_key: str


@dataclasses.dataclass(frozen=True)
class S3Credentials:
    """A Secret with the access key pair; mounted as files into the replicas."""

    secret_name: str
    access_key_id_key: str
    secret_access_key_key: str


@dataclasses.dataclass(frozen=True)
class S3Location:
    """``spec.backup.s3`` and ``spec.bootstrap.fromBackup.s3``."""

    bucket: str
    endpoint_url: str | None
    region: str
    prefix: str
    addressing_style: str
    credentials: S3Credentials | None


@dataclasses.dataclass(frozen=True)
class BackupSpec:
    """``spec.backup``: where copies go, how often, how many scheduled ones to keep."""

    s3: S3Location
    schedule: str | None  # cron (5 fields), a descriptor or "@every 6h"; None: on demand
    retention: int
    suspend: bool


@dataclasses.dataclass(frozen=True)
class FromBackup:
    """``spec.bootstrap.fromBackup``: the copy a new fleet starts from."""

    s3: S3Location
    key: str
    sha256: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class FleetSpec:
    """Everything the builders need, immutable, with every default applied."""

    name: str
    namespace: str
    uid: str = ""
    replicas: int
    image: str = DEFAULT_SERVER_IMAGE
    image_pull_policy: str
    image_pull_secrets: tuple[str, ...] = ()
    resources: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    storage: Storage
    ports: Ports
    token: TokenRef | None = None
    # spec.peerToken: the peer credential; None = the generated `<name>-peer-token`.
    peer_token: TokenRef | None = None
    clients: ClientsSpec
    tls: TlsSpec
    # Optional protocols (PROTOCOL_PORTS entries with optional=True) that are enabled
    # and implemented: served, their ports rendered.
    enabled_protocols: tuple[str, ...] = ()
    # Fields that enable a protocol this version does not implement (e.g.
    # "spec.protocols.bus.enabled"): reported as Ready=False/ProtocolNotImplemented,
    # never served, their ports never rendered.
    not_implemented: tuple[str, ...] = ()
    replication: ReplicationSpec
    jetstream: JetstreamSpec
    bus_curve: BusCurveSpec
    retention: Retention = Retention()
    subscriptions: tuple[tuple[str, ...], ...]
    service_monitor: ServiceMonitorSpec
    aggregation: Aggregation
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    priority_class_name: str | None = None
    pod_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pod_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    security: SecurityContext
    termination_grace_period_seconds: int
    log_level: str
    network_policy: NetworkPolicySpec
    # Flush, verify, scale the StatefulSet to 0 and keep the claims; false wakes it.
    hibernate: bool
    pdb: DisruptionBudget
    # None: the default zone spread; (): none at all.
    topology_spread: tuple[Mapping[str, Any], ...] | None = None
    # Managed: StatefulSet OnDelete, the operator replaces pods one at a time.
    update_strategy: str
    backup: BackupSpec | None = None
    from_backup: FromBackup | None = None
    # The EventServer's eventfleet.io/restart annotation (not in the spec): a new value
    # changes the pod template, which rolls every pod.
    restart: str = ""

    @property
    def token_ref(self) -> TokenRef:
        return self.token or TokenRef(
            secret_name=f"{self.name}-token", key=crd.default("spec.token.secretRef.key")
        )

    @property
    def peer_token_ref(self) -> TokenRef:
        """The peer credential's Secret: the user's, or the generated ``<name>-peer-token``."""
        return self.peer_token or TokenRef(
            secret_name=f"{self.name}-peer-token",
            key=crd.default("spec.peerToken.secretRef.key"),
        )

    def serves(self, entry: ProtocolPort) -> bool:
        """Does a replica of this fleet listen on ``entry``'s ports?"""
        return not entry.optional or entry.protocol in self.enabled_protocols

    def served_ports(self, service: Service | None = None) -> list[tuple[ProtocolPort, str, int]]:
        """``(entry, port name, port)`` of every served port, in table order.

        With ``service``, only the ports that Service exposes.
        """
        return [
            (entry, name, port)
            for entry in constants.PROTOCOL_PORTS
            if self.serves(entry) and (service is None or service in entry.services)
            for name, port in entry.ports(self.ports[entry.protocol])
        ]


def _get(spec: Mapping[str, Any], key: str, path: str, kind: type | tuple[type, ...]) -> Any:
    value = spec.get(key)
    if value is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; a spec `replicas: true` must not pass as 1.
    if isinstance(value, bool) and bool not in kinds:
        raise SpecError(f"{path}.{key}", f"expected {_kind_name(kind)}, got {_shown(value)}")
    if not isinstance(value, kind):
        raise SpecError(f"{path}.{key}", f"expected {_kind_name(kind)}, got {_shown(value)}")
    return value


_SHOWN_CHARS = 80


def _shown(value: Any) -> str:
    """A bad value for a message: its type and (shortened) repr."""
    text = repr(value)
    if len(text) > _SHOWN_CHARS:
        text = text[: _SHOWN_CHARS - 3] + "..."
    kind = "a boolean" if isinstance(value, bool) else type(value).__name__
    return f"{kind} {text}"


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        int: "an integer",
        bool: "a boolean",
    }
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _obj(spec: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    return _get(spec, key, path, dict) or {}


def _int(spec: Mapping[str, Any], key: str, path: str) -> Any:
    """The integer at ``key`` within the CRD's ``minimum``/``maximum`` for it (None when
    absent: the CRD states no default)."""
    value = _get(spec, key, path, int)
    if value is None:
        return None
    schema = crd.schema_at(f"{path}.{key}")
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise SpecError(f"{path}.{key}", f"must be {bound}, got {value}")
    return value


def _str(
    spec: Mapping[str, Any],
    key: str,
    path: str,
    default: Any = None,
    *,
    choices: Sequence[str] = (),
) -> Any:
    """The string at ``key``, one of ``choices`` if given. ``default`` is only for what
    the CRD cannot state (the image of this version): the CRD's defaults are in the spec."""
    value = _get(spec, key, path, str)
    if value is None or (value == "" and default is not None):
        return default
    if choices and value not in choices:
        raise SpecError(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def _bool(spec: Mapping[str, Any], key: str, path: str) -> Any:
    """The boolean at ``key`` (None when absent: the CRD states no default)."""
    return _get(spec, key, path, bool)


def _str_map(spec: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    value = _obj(spec, key, path)
    for k, v in value.items():
        if not isinstance(v, str):
            raise SpecError(f"{path}.{key}.{k}", f"expected a string, got {_shown(v)}")
    return dict(value)


def validate_name(name: str) -> None:
    """Names feed every child's name: the same limits as the CRD's CEL rules."""
    if len(name) > MAX_NAME_LENGTH:
        raise SpecError(
            "metadata.name", f"must be at most {MAX_NAME_LENGTH} characters, got {len(name)}"
        )
    if not _DNS1035.match(name):
        raise SpecError(
            "metadata.name",
            f"must be a DNS-1035 label (a-z, 0-9, '-', starts with a letter), got {name!r}",
        )


def validate_cron(schedule: str, field: str) -> None:
    """The schedule syntax robfig/cron (spark-operator) accepts: 5 fields or a descriptor."""
    text = schedule.strip()
    if text in _CRON_DESCRIPTORS:
        return
    if text.startswith("@every "):
        if not _DURATION.match(text[len("@every ") :].strip()) or text.endswith(" 0"):
            raise SpecError(
                field, f"'@every' needs a positive duration such as 10m, got {schedule!r}"
            )
        return
    fields = text.split()
    if len(fields) != 5:
        raise SpecError(
            field, f"must have 5 cron fields or be a descriptor like @hourly, got {schedule!r}"
        )
    for item in fields:
        for part in item.split(","):
            if not _CRON_FIELD.match(part):
                raise SpecError(field, f"invalid cron field {part!r} in {schedule!r}")


def _validate_ports(ports: Ports) -> None:
    """No two ports of the table may overlap, served or not (a disabled protocol keeps
    its block reserved, so enabling it later never collides)."""
    used: dict[int, ProtocolPort] = {}
    for entry in constants.PROTOCOL_PORTS:
        for _, port in entry.ports(ports[entry.protocol]):
            other = used.get(port)
            if other is not None:
                blocks = [
                    f"spec.ports.{e.protocol} is a block of {e.width} ports"
                    for e in (other, entry)
                    if e.width > 1
                ]
                raise SpecError(
                    f"spec.ports.{entry.protocol}",
                    f"port {port} collides with spec.ports.{other.protocol}"
                    + (f" ({'; '.join(blocks)})" if blocks else ""),
                )
            used[port] = entry


def _parse_resources(spec: Mapping[str, Any]) -> dict[str, Any]:
    resources = _obj(spec, "resources", "spec")
    out: dict[str, Any] = {}
    for section in ("requests", "limits"):
        values = _obj(resources, section, "spec.resources")
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise SpecError(
                    f"spec.resources.{section}.{key}",
                    f"must be a quantity such as 500m or 1Gi, got {_shown(value)}",
                )
            if isinstance(value, str) and not _QUANTITY.match(value):
                raise SpecError(
                    f"spec.resources.{section}.{key}",
                    f"{value!r} is not a quantity such as 500m or 1Gi",
                )
        if values:
            out[section] = dict(values)
    return out


def _parse_storage(spec: Mapping[str, Any]) -> Storage:
    storage = _obj(spec, "storage", "spec")
    size = _str(storage, "size", "spec.storage")
    if not _QUANTITY.match(size):
        raise SpecError("spec.storage.size", f"{size!r} is not a quantity such as 1Gi")
    policy = _obj(storage, "retentionPolicy", "spec.storage")
    return Storage(
        size=size,
        storage_class_name=_str(storage, "storageClassName", "spec.storage") or None,
        synchronous=_str(storage, "synchronous", "spec.storage", choices=SYNCHRONOUS_MODES),
        when_deleted=_str(
            policy, "whenDeleted", "spec.storage.retentionPolicy", choices=RETENTION_POLICIES
        ),
        when_scaled=_str(
            policy,
            "whenScaled",
            "spec.storage.retentionPolicy",
            choices=crd.choices("spec.storage.retentionPolicy.whenScaled"),
        ),
    )


def _parse_ports(spec: Mapping[str, Any]) -> Ports:
    ports = _obj(spec, "ports", "spec")
    parsed = Ports(
        tuple(
            (
                entry.protocol,
                _int(ports, entry.protocol, "spec.ports"),
            )
            for entry in constants.PROTOCOL_PORTS
        )
    )
    _validate_ports(parsed)
    return parsed


def _parse_token(spec: Mapping[str, Any], field: str = "token") -> TokenRef | None:
    path = f"spec.{field}.secretRef"
    ref = _obj(_obj(spec, field, "spec"), "secretRef", f"spec.{field}")
    if not ref:
        return None
    name = _str(ref, "name", path)
    if not name:
        raise SpecError(f"{path}.name", "is required when secretRef is given")
    return TokenRef(secret_name=name, key=_str(ref, "key", path), generated=False)


def _parse_peer_token(spec: Mapping[str, Any]) -> TokenRef | None:
    ref = _parse_token(spec, "peerToken")
    client = _parse_token(spec)
    if (
        ref is not None
        and client is not None
        and (ref.secret_name, ref.key)
        == (
            client.secret_name,
            client.key,
        )
    ):
        # One credential for both would let every client act as a peer (docs/security.md).
        raise SpecError(
            "spec.peerToken.secretRef",
            f"must differ from spec.token.secretRef (both are {ref.secret_name}/{ref.key})",
        )
    return ref


def _parse_clients(spec: Mapping[str, Any]) -> ClientsSpec:
    path = "spec.clients"
    section = _obj(spec, "clients", "spec")
    allow = _bool(section, "allowTokenless", path)
    networks = _get(section, "tokenlessNetworks", path, list) or []
    for i, value in enumerate(networks):
        # As the replica reads them (listener.parse_networks).
        _network(value, f"{path}.tokenlessNetworks[{i}]")
    if networks and not allow:
        raise SpecError(
            f"{path}.tokenlessNetworks", "applies only with spec.clients.allowTokenless: true"
        )
    return ClientsSpec(allow_tokenless=allow, tokenless_networks=tuple(networks))


def _parse_subscriptions(spec: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    subs = _get(_obj(spec, "syncer", "spec"), "subscriptions", "spec.syncer", list)
    if not subs:
        raise SpecError("spec.syncer.subscriptions", "must list at least one event type")
    out = []
    for i, sub in enumerate(subs):
        field = f"spec.syncer.subscriptions[{i}]"
        if not isinstance(sub, list) or not sub or not all(isinstance(s, str) for s in sub):
            raise SpecError(field, f"must be a non-empty list of strings, got {_shown(sub)}")
        if "*" in sub[:-1]:
            # hat-event semantics: '*' matches the rest and is only valid last.
            raise SpecError(field, f"'*' is only valid as the last segment, got {sub!r}")
        out.append(tuple(sub))
    return tuple(out)


def _parse_monitoring(spec: Mapping[str, Any]) -> ServiceMonitorSpec:
    sm = _obj(_obj(spec, "monitoring", "spec"), "serviceMonitor", "spec.monitoring")
    interval = _str(sm, "interval", "spec.monitoring.serviceMonitor")
    if not _DURATION.match(interval):
        raise SpecError(
            "spec.monitoring.serviceMonitor.interval", f"{interval!r} is not a duration such as 30s"
        )
    labels = _str_map(sm, "labels", "spec.monitoring.serviceMonitor")
    return ServiceMonitorSpec(
        enabled=_bool(sm, "enabled", "spec.monitoring.serviceMonitor"),
        interval=interval,
        labels=tuple(sorted(labels.items())),
    )


def _parse_spark_pod(agg: Mapping[str, Any], key: str) -> SparkPod:
    path = f"spec.aggregation.{key}"
    pod = _obj(agg, key, "spec.aggregation")
    memory = _str(pod, "memory", path)
    if not _SPARK_MEMORY.match(memory):
        raise SpecError(
            f"{path}.memory", f"{memory!r} is not a Spark memory size such as 512m or 2g"
        )
    return SparkPod(
        cores=_int(pod, "cores", path),
        memory=memory,
        instances=_int(pod, "instances", path) if key == "executor" else 1,
    )


def _parse_output_claim(agg: Mapping[str, Any]) -> str:
    path = "spec.aggregation.outputVolume"
    volume = _obj(agg, "outputVolume", "spec.aggregation")
    if agg.get("outputVolume") is None:
        return ""
    if volume.get("persistentVolumeClaim") is None:
        raise SpecError(f"{path}.persistentVolumeClaim", "is required in outputVolume")
    claim = _obj(volume, "persistentVolumeClaim", path)
    name = _str(claim, "claimName", f"{path}.persistentVolumeClaim")
    if not name:
        raise SpecError(f"{path}.persistentVolumeClaim.claimName", "is required")
    return str(name)


def _parse_output(agg: Mapping[str, Any], claim: str) -> str:
    """The job's --output: the spec's, else the claim's mount, else the ephemeral path."""
    field = "spec.aggregation.output"
    output = _str(agg, "output", "spec.aggregation")
    if output is None:
        return AGGREGATION_OUTPUT_DIR if claim else EPHEMERAL_AGGREGATION_OUTPUT
    if _URL_SCHEME.match(output):
        if claim:
            raise SpecError(
                field,
                f"{output!r} is a URL, but spec.aggregation.outputVolume mounts a claim: "
                "write to the claim (leave output unset or a path under "
                f"{AGGREGATION_OUTPUT_DIR}) or drop outputVolume",
            )
        return str(output)
    if not output.startswith("/"):
        raise SpecError(field, f"must be an absolute path or a URL such as s3a://, got {output!r}")
    if claim and not (output + "/").startswith(AGGREGATION_OUTPUT_DIR + "/"):
        raise SpecError(
            field,
            f"{output!r} is not on the claim of spec.aggregation.outputVolume, which is "
            f"mounted at {AGGREGATION_OUTPUT_DIR}",
        )
    return str(output)


def _parse_spark_env(agg: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """``spec.aggregation.env``: core/v1 EnvVars with a value or a Secret/ConfigMap key."""
    entries = _get(agg, "env", "spec.aggregation", list) or []
    out, seen = [], set()
    for i, entry in enumerate(entries):
        path = f"spec.aggregation.env[{i}]"
        if not isinstance(entry, dict):
            raise SpecError(path, f"expected an object, got {_shown(entry)}")
        name = _str(entry, "name", path)
        if not name or not _ENV_NAME.match(name):
            raise SpecError(f"{path}.name", f"{name!r} is not a valid environment variable name")
        if name in RESERVED_SPARK_ENV:
            raise SpecError(f"{path}.name", f"{name} is set by the operator")
        if name in seen:
            raise SpecError(f"{path}.name", f"{name} is listed twice")
        seen.add(name)
        value = _get(entry, "value", path, str)
        value_from = _obj(entry, "valueFrom", path)
        if (value is None) == (not value_from):
            raise SpecError(path, f"{name}: set exactly one of value and valueFrom")
        item: dict[str, Any] = {"name": name}
        if value is not None:
            item["value"] = value
        else:
            if len(value_from) != 1 or next(iter(value_from)) not in (
                "secretKeyRef",
                "configMapKeyRef",
            ):
                raise SpecError(
                    f"{path}.valueFrom", "must hold exactly one of secretKeyRef, configMapKeyRef"
                )
            ((kind, ref),) = value_from.items()
            ref_path = f"{path}.valueFrom.{kind}"
            if not isinstance(ref, dict):
                raise SpecError(ref_path, f"expected an object, got {_shown(ref)}")
            ref_name, key = _str(ref, "name", ref_path), _str(ref, "key", ref_path)
            if not ref_name or not key:
                raise SpecError(ref_path, "needs name and key")
            out_ref: dict[str, Any] = {"name": ref_name, "key": key}
            optional = _get(ref, "optional", ref_path, bool)
            if optional is not None:
                out_ref["optional"] = optional
            item["valueFrom"] = {kind: out_ref}
        out.append(item)
    return tuple(out)


def _parse_aggregation(spec: Mapping[str, Any]) -> Aggregation:
    agg = _obj(spec, "aggregation", "spec")
    path = "spec.aggregation"
    claim = _parse_output_claim(agg)
    parsed = Aggregation(
        enabled=_bool(agg, "enabled", path),
        schedule=_str(agg, "schedule", path),
        time_zone=_str(agg, "timeZone", path),
        concurrency_policy=_str(agg, "concurrencyPolicy", path, choices=CONCURRENCY_POLICIES),
        suspend=_bool(agg, "suspend", path),
        bucket_seconds=_int(agg, "bucketSeconds", path),
        window_seconds=_int(agg, "windowSeconds", path),
        output=_parse_output(agg, claim),
        image=_str(agg, "image", path, DEFAULT_SPARK_IMAGE),
        spark_version=_str(agg, "sparkVersion", path),
        service_account_name=_str(agg, "serviceAccountName", path),
        driver=_parse_spark_pod(agg, "driver"),
        executor=_parse_spark_pod(agg, "executor"),
        output_claim=claim,
        spark_conf=_str_map(agg, "sparkConf", path),
        hadoop_conf=_str_map(agg, "hadoopConf", path),
        env=_parse_spark_env(agg),
    )
    if parsed.enabled:
        validate_cron(parsed.schedule, f"{path}.schedule")
        if parsed.window_seconds < parsed.bucket_seconds:
            raise SpecError(
                f"{path}.windowSeconds",
                f"must be at least bucketSeconds ({parsed.bucket_seconds}), "
                f"got {parsed.window_seconds}",
            )
    return parsed


def _parse_protocols(protocols: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(enabled optional protocols, fields enabling unimplemented ones).

    The CRD accepts protocols this version does not implement, so manifests written for
    later versions stay valid; enabling one is reported, not served.
    """
    enabled, not_implemented = [], []
    for entry in constants.PROTOCOL_PORTS:
        if not entry.optional:
            continue
        path = f"spec.protocols.{entry.protocol}"
        section = _obj(protocols, entry.protocol, "spec.protocols")
        switch = _bool(section, "enabled", path)
        # A registry protocol the CRD does not list yet (a new one): the registry's default.
        if not (entry.enabled_by_default if switch is None else switch):
            continue
        if entry.implemented:
            enabled.append(entry.protocol)
        else:
            not_implemented.append(f"{path}.enabled")
    return tuple(enabled), tuple(not_implemented)


def _peers(section: Mapping[str, Any], key: str, path: str) -> tuple[Mapping[str, Any], ...] | None:
    """A list of NetworkPolicyPeer objects (``None`` when absent)."""
    value = _get(section, key, path, list)
    if value is None:
        return None
    allowed = {"podSelector", "namespaceSelector", "ipBlock"}
    for i, peer in enumerate(value):
        field = f"{path}.{key}[{i}]"
        if not isinstance(peer, dict) or not peer:
            raise SpecError(field, f"must be a NetworkPolicyPeer object, got {_shown(peer)}")
        unknown = sorted(set(peer) - allowed)
        if unknown:
            raise SpecError(
                field, f"unknown key {unknown[0]!r} (podSelector, namespaceSelector, ipBlock)"
            )
    return tuple(dict(p) for p in value)


def _parse_network_policy(spec: Mapping[str, Any]) -> NetworkPolicySpec:
    path = "spec.networkPolicy"
    np = _obj(spec, "networkPolicy", "spec")
    clients = _obj(np, "clients", path)
    monitoring = _obj(np, "monitoring", path)
    http = _obj(np, "http", path)
    monitoring_from = _peers(monitoring, "from", f"{path}.monitoring")
    return NetworkPolicySpec(
        enabled=_bool(np, "enabled", path),
        client_from=_peers(clients, "from", f"{path}.clients") or (),
        monitoring_from=DEFAULT_MONITORING_FROM if monitoring_from is None else monitoring_from,
        http_from=_peers(http, "from", f"{path}.http") or (),
    )


_PERCENT = re.compile(r"^[0-9]+%$")


def _parse_pdb(spec: Mapping[str, Any]) -> DisruptionBudget:
    path = "spec.podDisruptionBudget"
    pdb = _obj(spec, "podDisruptionBudget", "spec")
    max_unavailable = _get(pdb, "maxUnavailable", path, (int, str))
    if isinstance(max_unavailable, int) and max_unavailable < 0:
        raise SpecError(f"{path}.maxUnavailable", f"must be at least 0, got {max_unavailable}")
    elif isinstance(max_unavailable, str) and not _PERCENT.match(max_unavailable):
        raise SpecError(
            f"{path}.maxUnavailable", f"must be a number or a percentage, got {max_unavailable!r}"
        )
    return DisruptionBudget(
        enabled=_bool(pdb, "enabled", path),
        max_unavailable=max_unavailable,
        unhealthy_pod_eviction_policy=_str(
            pdb, "unhealthyPodEvictionPolicy", path, choices=EVICTION_POLICIES
        ),
    )


def _parse_topology_spread(spec: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...] | None:
    items = _get(spec, "topologySpreadConstraints", "spec", list)
    if items is None:
        return None
    for i, item in enumerate(items):
        field = f"spec.topologySpreadConstraints[{i}]"
        if not isinstance(item, dict):
            raise SpecError(field, f"must be an object, got {_shown(item)}")
        for key in ("maxSkew", "topologyKey", "whenUnsatisfiable"):
            if key not in item:
                raise SpecError(f"{field}.{key}", "is required")
    return tuple(dict(i) for i in items)


def _parse_replication(protocols: Mapping[str, Any]) -> ReplicationSpec:
    path = "spec.protocols.replication"
    section = _obj(protocols, "replication", "spec.protocols")
    prefix = _get(section, "typePrefix", path, list)
    if not prefix or not all(isinstance(p, str) and p for p in prefix):
        raise SpecError(
            f"{path}.typePrefix", f"must be a list of non-empty strings, got {prefix!r}"
        )
    tables = []
    seen: set[str] = set()
    for i, table in enumerate(_get(section, "tables", path, list) or []):
        where = f"{path}.tables[{i}]"
        if not isinstance(table, dict):
            raise SpecError(where, f"must be an object, got {_shown(table)}")
        name = _str(table, "name", where)
        if not name or "?" in name or "*" in name:
            raise SpecError(f"{where}.name", f"must be a non-empty name without ?/*, got {name!r}")
        if name in seen:
            raise SpecError(f"{where}.name", f"table {name!r} is listed twice")
        seen.add(name)
        columns = _get(table, "columns", where, dict)
        if columns is not None:
            for col, flags in columns.items():
                if not isinstance(flags, dict) or not isinstance(flags.get("update", False), bool):
                    raise SpecError(f"{where}.columns.{col}", "must be an object {update: bool}")
        tables.append(
            {
                "name": name,
                "key": _str(table, "key", where),
                "columns": {c: {"update": bool(f.get("update", False))} for c, f in columns.items()}
                if columns is not None
                else None,
                "add": _bool(table, "add", where),
                "delete": _bool(table, "delete", where),
            }
        )
    users_path = f"{path}.usersSecretRef"
    users = _obj(section, "usersSecretRef", path)
    users_secret = _str(users, "name", users_path) or None
    if users and not users_secret:
        raise SpecError(f"{users_path}.name", "is required")
    return ReplicationSpec(
        enabled=_bool(section, "enabled", path),
        type_prefix=tuple(prefix),
        tables=tuple(tables),
        users_secret=users_secret,
        # No usersSecretRef: its key's default, as a ref {name} alone would have.
        users_key=_str(users, "key", users_path) or crd.default(f"{users_path}.key"),
    )


def _parse_bus_curve(protocols: Mapping[str, Any]) -> BusCurveSpec:
    path = "spec.protocols.bus.curve"
    section = _obj(_obj(protocols, "bus", "spec.protocols"), "curve", "spec.protocols.bus")
    ref_path = f"{path}.allowedKeysSecretRef"
    ref = _obj(section, "allowedKeysSecretRef", path)
    secret = _str(ref, "name", ref_path) or None
    if ref and not secret:
        raise SpecError(f"{ref_path}.name", "is required")
    if secret is not None and not _DNS1123_SUBDOMAIN.match(secret):
        raise SpecError(f"{ref_path}.name", f"must be a Secret name, got {secret!r}")
    networks = _get(section, "plainNetworks", path, list) or []
    for i, value in enumerate(networks):
        _network(value, f"{path}.plainNetworks[{i}]")
    parsed = BusCurveSpec(
        enabled=_bool(section, "enabled", path),
        tokens=_bool(section, "tokens", path),
        allowed_keys_secret=secret,
        plain_port=_int(section, "plainPort", path),
        plain_networks=tuple(networks),
    )
    if parsed.enabled and not parsed.tokens and parsed.allowed_keys_secret is None:
        raise SpecError(
            path, "no client could connect: set allowedKeysSecretRef or leave tokens true"
        )
    if parsed.plain_port is not None and not parsed.enabled:
        raise SpecError(
            f"{path}.plainPort",
            f"{parsed.plain_port}: PLAIN listeners beside CURVE need {path}.enabled: true "
            "(without CURVE the BUS ports speak PLAIN already)",
        )
    if networks and parsed.plain_port is None:
        raise SpecError(f"{path}.plainNetworks", f"applies only with {path}.plainPort")
    return parsed


def _network(value: Any, field: str) -> None:
    """An address or CIDR network as the replica reads it (host bits allowed)."""
    try:
        # A number would pass ip_network (an integer address): text only.
        if not isinstance(value, str):
            raise TypeError(value)
        ipaddress.ip_network(value, strict=False)
    except (TypeError, ValueError):
        raise SpecError(
            field, f"must be an IP address or a CIDR network such as 10.1.0.0/16, got {value!r}"
        ) from None


def _validate_plain_port(ports: Ports, curve: BusCurveSpec) -> None:
    """The PLAIN block (3 ports) may overlap no block of ``spec.ports``, served or not
    (as ``_validate_ports``: enabling a protocol later must not collide)."""
    plain = dict(curve.plain_ports())
    for entry in constants.PROTOCOL_PORTS:
        for _, port in entry.ports(ports[entry.protocol]):
            if port in plain.values():
                width = f" (a block of {entry.width} ports)" if entry.width > 1 else ""
                raise SpecError(
                    "spec.protocols.bus.curve.plainPort",
                    f"{curve.plain_port}: the PLAIN ports {curve.plain_port}.."
                    f"{curve.plain_port + 2} overlap port {port} of "
                    f"spec.ports.{entry.protocol}{width}",
                )


_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_JETSTREAM_PATH = re.compile(r"^/[A-Za-z0-9_./-]*[A-Za-z0-9_.-]$")


def _parse_tls(spec: Mapping[str, Any]) -> TlsSpec:
    path = "spec.tls"
    section = _obj(spec, "tls", "spec")
    provider = _str(section, "provider", path, choices=TLS_PROVIDERS)
    issuer = None
    if section.get("issuerRef") is not None:
        ref = _obj(section, "issuerRef", path)
        name = _str(ref, "name", f"{path}.issuerRef")
        if not name:
            raise SpecError(f"{path}.issuerRef.name", "is required")
        issuer = IssuerRef(
            name=name,
            kind=_str(ref, "kind", f"{path}.issuerRef", choices=ISSUER_KINDS),
            group=_str(ref, "group", f"{path}.issuerRef"),
        )
        if provider == "Operator":
            raise SpecError(
                f"{path}.issuerRef",
                "is a cert-manager issuer: it needs provider CertManager or Auto, not Operator",
            )
    return TlsSpec(
        enabled=_bool(section, "enabled", path),
        provider=provider,
        http=_bool(section, "http", path),
        issuer=issuer,
    )


def _parse_jetstream(protocols: Mapping[str, Any]) -> JetstreamSpec:
    path = "spec.protocols.jetstream"
    section = _obj(protocols, "jetstream", "spec.protocols")
    url_path = _str(section, "path", path)
    if not _JETSTREAM_PATH.match(url_path):
        raise SpecError(f"{path}.path", f"must be a URL path like /jetstream, got {url_path!r}")
    prefix = _get(section, "typePrefix", path, list) or []
    for i, segment in enumerate(prefix):
        if not isinstance(segment, str) or not segment or segment in ("?", "*"):
            raise SpecError(
                f"{path}.typePrefix[{i}]", f"must be an event type segment, got {segment!r}"
            )
    return JetstreamSpec(
        enabled=_bool(section, "enabled", path),
        path=url_path,
        type_prefix=tuple(prefix),
    )


def _parse_tolerations(spec: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    tolerations = _get(spec, "tolerations", "spec", list) or []
    for i, tol in enumerate(tolerations):
        if not isinstance(tol, dict):
            raise SpecError(f"spec.tolerations[{i}]", f"must be an object, got {_shown(tol)}")
    return tuple(dict(t) for t in tolerations)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _parse_s3(parent: Mapping[str, Any], path: str, *, default_prefix: str = "") -> S3Location:
    s3 = _get(parent, "s3", path, dict)
    path = f"{path}.s3"
    if not s3:
        raise SpecError(path, "is required")
    bucket = _str(s3, "bucket", path)
    if not bucket or not 3 <= len(bucket) <= 63:
        raise SpecError(f"{path}.bucket", f"must be a 3-63 character bucket name, got {bucket!r}")
    endpoint = _str(s3, "endpointURL", path) or None
    if endpoint is not None and not re.match(r"^https?://[^/\s]+", endpoint):
        raise SpecError(f"{path}.endpointURL", f"must be an http(s) URL, got {endpoint!r}")
    creds = _get(s3, "credentialsSecret", path, dict)
    credentials = None
    if creds is not None:
        where = f"{path}.credentialsSecret"
        secret = _str(creds, "name", where)
        if not secret:
            raise SpecError(f"{where}.name", "is required")
        credentials = S3Credentials(
            secret_name=secret,
            access_key_id_key=_str(creds, "accessKeyIdKey", where),
            secret_access_key_key=_str(creds, "secretAccessKeyKey", where),
        )
    prefix = _str(s3, "prefix", path)
    return S3Location(
        bucket=bucket,
        endpoint_url=endpoint,
        region=_str(s3, "region", path),
        prefix=default_prefix if prefix is None else prefix,
        addressing_style=_str(s3, "addressingStyle", path, choices=ADDRESSING_STYLES),
        credentials=credentials,
    )


def _parse_backup(spec: Mapping[str, Any], name: str, namespace: str) -> BackupSpec | None:
    backup = _get(spec, "backup", "spec", dict)
    if backup is None:
        return None
    path = "spec.backup"
    schedule = _str(backup, "schedule", path) or None
    if schedule is not None:
        validate_cron(schedule, f"{path}.schedule")
    return BackupSpec(
        s3=_parse_s3(backup, path, default_prefix=f"{namespace}/{name}/"),
        schedule=schedule,
        retention=_int(backup, "retention", path),
        suspend=_bool(backup, "suspend", path),
    )


def _parse_from_backup(spec: Mapping[str, Any]) -> FromBackup | None:
    bootstrap = _obj(spec, "bootstrap", "spec")
    source = _get(bootstrap, "fromBackup", "spec.bootstrap", dict)
    if source is None:
        return None
    path = "spec.bootstrap.fromBackup"
    key = _str(source, "key", path)
    if not key:
        raise SpecError(f"{path}.key", "is required (the object key of the copy)")
    sha256 = _str(source, "sha256", path) or None
    if sha256 is not None and not _SHA256.match(sha256):
        raise SpecError(f"{path}.sha256", f"must be 64 lower-case hex digits, got {sha256!r}")
    return FromBackup(s3=_parse_s3(source, path), key=key, sha256=sha256)


def parse(name: str, namespace: str, spec: Mapping[str, Any] | None, *, uid: str = "") -> FleetSpec:
    """Parse and validate an ``EventServer`` spec; raises :class:`SpecError`."""
    validate_name(name)
    spec = spec or {}
    if not isinstance(spec, Mapping):
        raise SpecError("spec", f"must be an object, got {_shown(spec)}")
    spec = crd.with_defaults(spec)
    pull_secrets = _get(spec, "imagePullSecrets", "spec", list) or []
    for i, ref in enumerate(pull_secrets):
        if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not ref["name"]:
            raise SpecError(f"spec.imagePullSecrets[{i}].name", "is required")
    security = _obj(spec, "securityContext", "spec")
    retention = _obj(spec, "retention", "spec")
    protocols = _obj(spec, "protocols", "spec")
    affinity = _get(spec, "affinity", "spec", dict)
    enabled_protocols, not_implemented = _parse_protocols(protocols)
    ports = _parse_ports(spec)
    bus_curve = _parse_bus_curve(protocols)
    _validate_plain_port(ports, bus_curve)
    return FleetSpec(
        name=name,
        namespace=namespace,
        uid=uid,
        replicas=_int(spec, "replicas", "spec"),
        image=_str(spec, "image", "spec", DEFAULT_SERVER_IMAGE),
        image_pull_policy=_str(spec, "imagePullPolicy", "spec", choices=PULL_POLICIES),
        image_pull_secrets=tuple(ref["name"] for ref in pull_secrets),
        resources=_parse_resources(spec),
        storage=_parse_storage(spec),
        ports=ports,
        token=_parse_token(spec),
        peer_token=_parse_peer_token(spec),
        clients=_parse_clients(spec),
        tls=_parse_tls(spec),
        enabled_protocols=enabled_protocols,
        not_implemented=not_implemented,
        replication=_parse_replication(protocols),
        jetstream=_parse_jetstream(protocols),
        bus_curve=bus_curve,
        retention=Retention(
            max_age_seconds=_int(retention, "maxAgeSeconds", "spec.retention"),
            max_events=_int(retention, "maxEvents", "spec.retention"),
        ),
        subscriptions=_parse_subscriptions(spec),
        service_monitor=_parse_monitoring(spec),
        aggregation=_parse_aggregation(spec),
        node_selector=_str_map(spec, "nodeSelector", "spec"),
        tolerations=_parse_tolerations(spec),
        affinity=dict(affinity) if affinity else None,
        priority_class_name=_str(spec, "priorityClassName", "spec") or None,
        pod_labels=_str_map(spec, "podLabels", "spec"),
        pod_annotations=_str_map(spec, "podAnnotations", "spec"),
        security=SecurityContext(
            run_as_user=_int(security, "runAsUser", "spec.securityContext"),
            run_as_group=_int(security, "runAsGroup", "spec.securityContext"),
            fs_group=_int(security, "fsGroup", "spec.securityContext"),
        ),
        termination_grace_period_seconds=_int(spec, "terminationGracePeriodSeconds", "spec"),
        log_level=_str(spec, "logLevel", "spec", choices=LOG_LEVELS),
        network_policy=_parse_network_policy(spec),
        hibernate=_bool(spec, "hibernate", "spec"),
        pdb=_parse_pdb(spec),
        topology_spread=_parse_topology_spread(spec),
        update_strategy=_str(
            _obj(spec, "updateStrategy", "spec"),
            "type",
            "spec.updateStrategy",
            choices=UPDATE_STRATEGIES,
        ),
        backup=_parse_backup(spec, name, namespace),
        from_backup=_parse_from_backup(spec),
    )
