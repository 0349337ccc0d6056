"""Names, labels and paths shared by the builders, the scaling logic and the status."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import GROUP, KIND, VERSION

MANAGER = "eventfleet-operator"
FIELD_MANAGER = "eventfleet-operator"
FINALIZER = f"{GROUP}/cleanup"
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# On every child: hash of the manifest last applied (detects fields the operator dropped).
APPLIED_HASH_ANNOTATION = f"{GROUP}/applied-hash"
# Pod template: hash of the rest of the template; every pod carries the one it was made from.
REVISION_ANNOTATION = f"{GROUP}/revision"
# On the EventServer (copied to the pod template): a new value replaces every pod.
RESTART_ANNOTATION = f"{GROUP}/restart"
# On the EventServer: a new value asks for one flush of every replica to every other one;
# the result goes to status.lastFlush (kubectl eventfleet flush).
FLUSH_ANNOTATION = f"{GROUP}/flush"
# On the EventServer: a new value rotates the generated peer token (tokens.rotation_step);
# progress in status.peerTokenRotation.
ROTATE_PEER_TOKEN_ANNOTATION = f"{GROUP}/rotate-peer-token"
# `eventfleet.io/reconcile: paused` on an EventServer: observe and report, write nothing.
PAUSE_ANNOTATION = f"{GROUP}/reconcile"
PAUSED = "paused"
# The annotations above that ask the operator for something. They share the eventfleet.io/
# prefix with Kopf's progress annotations, and Kopf leaves every annotation of that prefix
# out of the changes it reports (no update handler runs): the handlers watch these
# themselves (handlers.requests_changed), or a request waited for the next resync.
REQUEST_ANNOTATIONS = (
    RESTART_ANNOTATION,
    FLUSH_ANNOTATION,
    ROTATE_PEER_TOKEN_ANNOTATION,
    PAUSE_ANNOTATION,
)


def requests(meta: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The request annotations an EventServer's metadata carries, with their values."""
    notes = meta.get("annotations") or {}
    return tuple((key, str(notes[key])) for key in REQUEST_ANNOTATIONS if key in notes)


SERVING_LABEL = f"{GROUP}/serving"  # client Service selects only serving="true" pods

CONFIG_DIR = "/etc/eventfleet"
CONFIG_FILE = "config.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
TOKEN_DIR = "/var/run/secrets/eventfleet"
TOKEN_PATH = f"{TOKEN_DIR}/token"
# The peer credential (Syncer links, /flush, the full /status): a separate Secret and
# mount, so a client token never opens the replicas' peer and admin doors.
PEER_TOKEN_DIR = "/var/run/secrets/eventfleet-peer"
PEER_TOKEN_PATH = f"{PEER_TOKEN_DIR}/token"
# spec.tls: the fleet certificate Secret (cert-manager's layout), mounted read-only.
TLS_DIR = "/var/run/secrets/eventfleet-tls"
TLS_CERT_PATH = f"{TLS_DIR}/tls.crt"
TLS_KEY_PATH = f"{TLS_DIR}/tls.key"
TLS_CA_PATH = f"{TLS_DIR}/ca.crt"
# The Event BUS CURVE server key pair (spec.protocols.bus.curve) and the client keys.
BUS_CURVE_DIR = "/var/run/secrets/eventfleet-bus-curve"
BUS_CURVE_KEY_PATH = f"{BUS_CURVE_DIR}/server.key"
BUS_CLIENT_KEYS_DIR = "/var/run/secrets/eventfleet-bus-clients"
REPLICATION_USERS_DIR = "/var/run/secrets/eventfleet-replication"
REPLICATION_USERS_PATH = f"{REPLICATION_USERS_DIR}/users.yaml"
DATA_DIR = "/var/lib/eventfleet"
# The S3 access key pairs of spec.backup.s3 and spec.bootstrap.fromBackup.s3 (files).
BACKUP_CREDENTIALS_DIR = "/var/run/secrets/eventfleet-backup"
RESTORE_CREDENTIALS_DIR = "/var/run/secrets/eventfleet-restore"
S3_ACCESS_KEY_FILE = "access-key-id"
S3_SECRET_KEY_FILE = "secret-access-key"
# EventServerBackup objects: the fleet they belong to and whether the schedule made them.
BACKUP_FLEET_LABEL = f"{GROUP}/eventserver"
BACKUP_SCHEDULED_LABEL = f"{GROUP}/scheduled"
SPARK_MAIN = "local:///opt/eventfleet/aggregate.py"
# The job image's class-data-sharing archive of the driver JVM's classes and the jar
# that fixes the class path it was written with (eventfleet_spark.image_archive).
SPARK_CLASS_ARCHIVE = "/opt/eventfleet/cds/spark-driver.jsa"
SPARK_CLASSPATH_JAR = "/opt/eventfleet/cds/spark-classpath.jar"
# spec.tls with aggregation: the fleet CA (only ca.crt) in the driver and executors.
SPARK_TLS_CA_DIR = "/var/run/secrets/eventfleet-ca"

# spark-operator names each run `<name>-<unix nanos>` (+20 characters) and derives the
# driver pod and the UI Service (a 63-character DNS label) from it.
MAX_SPARK_APP_NAME = 30


# Kubernetes' default terminationMessagePath: what a container writes there is kept in
# its status (at most 4096 bytes) after it ends.
TERMINATION_LOG = "/dev/termination-log"
# Labels Spark and spark-operator put on the driver pod of a run.
SPARK_ROLE_LABEL = "spark-role"
SPARK_APP_NAME_LABEL = "sparkoperator.k8s.io/app-name"


def aggregation_driver_selector(name: str) -> str:
    """Label selector of the aggregation runs' driver pods of fleet ``name``."""
    own = labels(name, "aggregation")
    keys = ("app.kubernetes.io/instance", "app.kubernetes.io/component")
    return ",".join([*(f"{k}={own[k]}" for k in keys), f"{SPARK_ROLE_LABEL}=driver"])


def statefulset(name: str) -> str:
    return name


def peer_service(name: str) -> str:
    return f"{name}-peers"


def client_service(name: str) -> str:
    return name


def configmap(name: str) -> str:
    return f"{name}-config"


def token_secret(name: str) -> str:
    return f"{name}-token"


def peer_token_secret(name: str) -> str:
    return f"{name}-peer-token"


def bus_curve_secret(name: str) -> str:
    """The Event BUS CURVE server key pair (server.key, server.pub; Z85)."""
    return f"{name}-bus-curve"


def tls_secret(name: str) -> str:
    """The fleet certificate (tls.crt, tls.key, ca.crt); also the cert-manager Certificate."""
    return f"{name}-tls"


def ca_secret(name: str) -> str:
    """The fleet CA: the operator's own (provider Operator) or cert-manager's CA Certificate."""
    return f"{name}-ca"


def selfsigned_issuer(name: str) -> str:
    """cert-manager: the self-signed Issuer that signs the fleet CA."""
    return f"{name}-selfsigned"


def ca_issuer(name: str) -> str:
    """cert-manager: the CA Issuer that signs the fleet certificate."""
    return f"{name}-ca"


def tls_names(name: str, namespace: str) -> list[str]:
    """Every name a fleet certificate carries: each pod under the headless peer Service
    (Syncer peers, the operator), and the client Service, short and long forms."""
    peers, client = peer_service(name), client_service(name)
    return [
        f"*.{peers}.{namespace}.svc",
        f"*.{peers}.{namespace}.svc.cluster.local",
        client,
        f"{client}.{namespace}",
        f"{client}.{namespace}.svc",
        f"{client}.{namespace}.svc.cluster.local",
    ]


def pdb(name: str) -> str:
    return name


def network_policy(name: str) -> str:
    return name


def service_monitor(name: str) -> str:
    return name


def spark_app(name: str) -> str:
    """A short, stable name for the ScheduledSparkApplication (see MAX_SPARK_APP_NAME)."""
    full = f"{name}-agg"
    if len(full) <= MAX_SPARK_APP_NAME:
        return full
    digest = hashlib.sha256(name.encode()).hexdigest()[:5]
    prefix = name[: MAX_SPARK_APP_NAME - len(digest) - 5].rstrip("-")
    return f"{prefix}-{digest}-agg"


def pod(name: str, ordinal: int) -> str:
    return f"{name}-{ordinal}"


def server_id(ordinal: int) -> int:
    """Server ids are ordinal + 1 (0 is not a valid Hat server id)."""
    return ordinal + 1


def peer_host(name: str, namespace: str, ordinal: int) -> str:
    # Stop at `.svc`: the pods' resolv.conf search list completes the cluster domain,
    # which is not always cluster.local.
    return f"{pod(name, ordinal)}.{peer_service(name)}.{namespace}.svc"


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select the replica pods (immutable in the StatefulSet selector)."""
    return {
        "app.kubernetes.io/name": "eventfleet",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "replica",
    }


def selector_string(name: str) -> str:
    """``status.selector`` for the scale subresource (what HPA and kubectl use)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(name).items())


def labels(name: str, component: str) -> dict[str, str]:
    """Labels of every child; ``instance`` is what cleanup selects on."""
    return {
        "app.kubernetes.io/name": "eventfleet",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGER,
        "app.kubernetes.io/part-of": "eventfleet",
    }


def owned_by(obj: Mapping[str, Any] | None, uid: str) -> bool:
    """Does ``obj`` carry an owner reference to the EventServer with ``uid``?

    The only proof that the operator made an object: a same-named object without it was
    made by someone else (or for another EventServer of that name) and is never
    overwritten, adopted or deleted.
    """
    if not obj or not uid:
        return False
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("kind") == KIND for r in refs)


def claim_ordinal(name: str, claim: str) -> int | None:
    """The ordinal of a StatefulSet volume claim ``data-NAME-N``, else None."""
    prefix = f"data-{name}-"
    rest = claim[len(prefix) :] if claim.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None


def owner_reference(name: str, uid: str) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
