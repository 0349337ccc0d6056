"""Pure builders of the child manifests of one ``EventServer``.

Every function takes the parsed :class:`~eventfleet_operator.model.FleetSpec` (plus the
few facts that are not in the spec, such as how many replicas the StatefulSet may run
right now) and returns a plain dict ready to send to the API server. No I/O, no clock,
no randomness: the same input always gives the same manifest, which is what makes the
reconciliation idempotent and the builders testable against the real schemas.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
from collections.abc import Mapping
from typing import Any

import yaml

from eventfleet_operator import constants, naming
from eventfleet_operator.constants import Service
from eventfleet_operator.model import AGGREGATION_OUTPUT_DIR, FleetSpec

# Keys of the replica config that the replica re-reads without a restart. They stay
# out of the config hash so that scaling never restarts the surviving replicas.
HOT_RELOADED_KEYS = ("peers", "allow_empty_start")


def _metadata(spec: FleetSpec, name: str, component: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": spec.namespace,
        "labels": naming.labels(spec.name, component),
    }
    if spec.uid:
        meta["ownerReferences"] = [naming.owner_reference(spec.name, spec.uid)]
    return meta


def peers(spec: FleetSpec, count: int) -> list[dict[str, Any]]:
    """The Syncer mesh for ``count`` replicas; each replica skips its own server id."""
    return [
        {
            "name": naming.pod(spec.name, ordinal),
            "host": naming.peer_host(spec.name, spec.namespace, ordinal),
            "port": spec.ports.syncer,
            "server_id": naming.server_id(ordinal),
        }
        for ordinal in range(count)
    ]


def replica_config(spec: FleetSpec, *, peer_count: int, allow_empty_start: bool) -> dict[str, Any]:
    """The replica's YAML config (schema: eventfleet_server/config/schema.json).

    ``server_id`` is absent on purpose: each replica derives it from its pod name
    (``EVENTFLEET_POD_NAME``, ordinal + 1), so one ConfigMap serves every pod.
    """
    retention = {
        "max_age_seconds": spec.retention.max_age_seconds,
        "max_events": spec.retention.max_events,
    }
    config: dict[str, Any] = {
        "host": "0.0.0.0",
        "data_dir": naming.DATA_DIR,
        "token_file": naming.TOKEN_PATH,
        "peer_token_file": naming.PEER_TOKEN_PATH,
        "allow_empty_start": allow_empty_start,
    }
    for entry in constants.PROTOCOL_PORTS:
        section: dict[str, Any] = {"port": spec.ports[entry.protocol]}
        if entry.optional:
            # Off unless enabled and implemented: the replica refuses to start a
            # protocol it does not implement.
            section["enabled"] = spec.serves(entry)
        config[entry.protocol] = section
    config["syncer"]["subscriptions"] = [list(s) for s in spec.subscriptions]
    # The hat-compatible mode: off unless spec.clients says so (docs/security.md).
    config["eventer"]["allow_tokenless_clients"] = spec.clients.allow_tokenless
    config["eventer"]["tokenless_client_networks"] = list(spec.clients.tokenless_networks)
    # Jetstream rides on the HTTP port (websocket at `path`): a section, no ports.
    config["jetstream"] = {
        "enabled": spec.jetstream.enabled,
        "path": spec.jetstream.path,
        "type_prefix": list(spec.jetstream.type_prefix),
    }
    config.update(
        {
            "storage": {"synchronous": spec.storage.synchronous, "retention": retention},
            "log": {"level": spec.log_level, "format": "json"},
            "peers": peers(spec, peer_count),
        }
    )
    if spec.replication.enabled:
        config["replication"] = replication_config(spec)
    backup = backup_config(spec)
    if backup:
        config["backup"] = backup
    if _bus_curve(spec):
        config["bus"]["curve"] = bus_curve_config(spec)
    if spec.tls.enabled:
        config["tls"] = {
            "enabled": True,
            "cert_file": naming.TLS_CERT_PATH,
            "key_file": naming.TLS_KEY_PATH,
            "ca_file": naming.TLS_CA_PATH,
            "http": spec.tls.http,
        }
    return config


def _s3_section(location: Any, credentials_dir: str) -> dict[str, Any]:
    section: dict[str, Any] = {
        "endpoint_url": location.endpoint_url,
        "region": location.region,
        "bucket": location.bucket,
        "addressing_style": location.addressing_style,
    }
    if location.credentials is not None:
        section["access_key_id_file"] = f"{credentials_dir}/{naming.S3_ACCESS_KEY_FILE}"
        section["secret_access_key_file"] = f"{credentials_dir}/{naming.S3_SECRET_KEY_FILE}"
    return section


def backup_config(spec: FleetSpec) -> dict[str, Any]:
    """The replica's ``backup`` section: ``target`` from ``spec.backup.s3`` (POST /backup
    uploads there) and ``restore_from`` from ``spec.bootstrap.fromBackup`` (an empty
    replica of a new fleet starts from it; see docs/backup.md). Empty without either."""
    section: dict[str, Any] = {}
    if spec.backup is not None:
        target = _s3_section(spec.backup.s3, naming.BACKUP_CREDENTIALS_DIR)
        target["prefix"] = spec.backup.s3.prefix
        section["target"] = target
    source = spec.from_backup
    if source is not None:
        restore = _s3_section(source.s3, naming.RESTORE_CREDENTIALS_DIR)
        restore["key"] = source.key
        restore["sha256"] = source.sha256
        section["restore_from"] = restore
    return section


def _s3_credentials_volumes(spec: FleetSpec) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(volume, mount)`` of each S3 credentials Secret the replicas read."""
    out = []
    for name, location, directory in (
        ("backup-s3", spec.backup.s3 if spec.backup else None, naming.BACKUP_CREDENTIALS_DIR),
        (
            "restore-s3",
            spec.from_backup.s3 if spec.from_backup else None,
            naming.RESTORE_CREDENTIALS_DIR,
        ),
    ):
        if location is None or location.credentials is None:
            continue
        creds = location.credentials
        volume = {
            "name": name,
            "secret": {
                "secretName": creds.secret_name,
                "items": [
                    {"key": creds.access_key_id_key, "path": naming.S3_ACCESS_KEY_FILE},
                    {"key": creds.secret_access_key_key, "path": naming.S3_SECRET_KEY_FILE},
                ],
                "defaultMode": 0o440,
            },
        }
        out.append((volume, {"name": name, "mountPath": directory, "readOnly": True}))
    return out


def _service_ports(spec: FleetSpec, service: Service) -> list[dict[str, Any]]:
    plain = _bus_plain_ports(spec) if service is Service.CLIENT else ()
    return [
        {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
        for name, port in (*((n, p) for _, n, p in spec.served_ports(service)), *plain)
    ]


def _bus_plain_ports(spec: FleetSpec) -> tuple[tuple[str, int], ...]:
    """``(name, port)`` of the Event BUS PLAIN listeners beside CURVE (client ports,
    like the CURVE ones: container, client Service, NetworkPolicy); none without them."""
    return spec.bus_curve.plain_ports() if _bus_curve(spec) else ()


def replication_config(spec: FleetSpec) -> dict[str, Any]:
    """The replica's ``replication`` section: the websocket on the HTTP port; passwords
    from the user-list Secret (mounted) or else the fleet token."""
    repl = spec.replication
    section: dict[str, Any] = {
        "enabled": True,
        "type_prefix": list(repl.type_prefix),
        "tables": [dict(t) for t in repl.tables],
    }
    if repl.users_secret:
        section["users_file"] = naming.REPLICATION_USERS_PATH
    return section


def config_hash(spec: FleetSpec, config: dict[str, Any]) -> str:
    """Hash of what needs a restart: the config minus hot-reloaded keys, plus the token ref."""
    restart_relevant = {k: v for k, v in config.items() if k not in HOT_RELOADED_KEYS}
    token, peer = spec.token_ref, spec.peer_token_ref
    restart_relevant["_token_secret"] = [token.secret_name, token.key]
    restart_relevant["_peer_token_secret"] = [peer.secret_name, peer.key]
    canonical = json.dumps(restart_relevant, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def configmap(spec: FleetSpec, config: dict[str, Any]) -> dict[str, Any]:
    """ConfigMap holding ``config.yaml`` (mounted as a directory so kubelet updates it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, naming.configmap(spec.name), "config"),
        "data": {naming.CONFIG_FILE: yaml.safe_dump(config, sort_keys=False)},
    }


def token_secret(spec: FleetSpec, token: str) -> dict[str, Any]:
    """The generated client token Secret; ``token`` comes from the live Secret once it
    exists."""
    return _secret(spec, naming.token_secret(spec.name), "token", token)


def peer_token_secret(spec: FleetSpec, tokens: str) -> dict[str, Any]:
    """The generated peer token Secret (Syncer links, ``/flush``, the full ``/status``).

    ``tokens`` is the file's text: one token per line, the first presented to peers.
    """
    return _secret(spec, naming.peer_token_secret(spec.name), "peer-token", tokens)


def _secret(spec: FleetSpec, name: str, component: str, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, name, component),
        "type": "Opaque",
        # `data`, not `stringData`: the live object only ever has `data`, so the
        # drift check can compare like with like.
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }


def bus_curve_config(spec: FleetSpec) -> dict[str, Any]:
    """The replica's ``bus.curve`` section: the mounted server key, the mounted client
    keys (a directory: every key of the allowed-keys Secret is a file of keys); with
    ``plainPort`` the PLAIN listeners, whose password is the fleet token (always there on
    Kubernetes: the operator generates one when spec.token names none)."""
    section: dict[str, Any] = {
        "enabled": True,
        "secret_key_file": naming.BUS_CURVE_KEY_PATH,
        "allowed_keys": naming.BUS_CLIENT_KEYS_DIR if spec.bus_curve.allowed_keys_secret else None,
        "tokens": spec.bus_curve.tokens,
    }
    if spec.bus_curve.plain_port is not None:
        section["plain_port"] = spec.bus_curve.plain_port
        section["plain_networks"] = list(spec.bus_curve.plain_networks)
    return section


def bus_curve_secret(spec: FleetSpec, secret_z85: str, public_z85: str) -> dict[str, Any]:
    """The Event BUS CURVE server key pair the operator issued: ``server.key`` (mounted
    into the replicas) and ``server.pub`` (what clients configure as the server key)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, naming.bus_curve_secret(spec.name), "bus-curve"),
        "type": "Opaque",
        "data": _b64({"server.key": secret_z85 + "\n", "server.pub": public_z85 + "\n"}),
    }


def tls_secret(spec: FleetSpec, cert_pem: str, key_pem: str, ca_pem: str) -> dict[str, Any]:
    """The fleet certificate the operator issued (provider Operator), in cert-manager's
    layout so replicas read either the same way."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, naming.tls_secret(spec.name), "tls"),
        "type": "kubernetes.io/tls",
        "data": _b64({"tls.crt": cert_pem, "tls.key": key_pem, "ca.crt": ca_pem}),
    }


def ca_secret(spec: FleetSpec, cert_pem: str, key_pem: str) -> dict[str, Any]:
    """The operator's CA of this fleet (provider Operator); never mounted into a pod."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, naming.ca_secret(spec.name), "ca"),
        "type": "kubernetes.io/tls",
        "data": _b64({"tls.crt": cert_pem, "tls.key": key_pem}),
    }


def _b64(data: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}


CERT_MANAGER_API = "cert-manager.io/v1"
# cert-manager durations: 90 days, renewed with 30 left (as the operator's own CA does).
CERT_DURATION, CERT_RENEW_BEFORE = "2160h", "720h"


def cm_selfsigned_issuer(spec: FleetSpec) -> dict[str, Any]:
    """cert-manager: signs the fleet CA only (no issuerRef given)."""
    return {
        "apiVersion": CERT_MANAGER_API,
        "kind": "Issuer",
        "metadata": _metadata(spec, naming.selfsigned_issuer(spec.name), "tls"),
        "spec": {"selfSigned": {}},
    }


def cm_ca_certificate(spec: FleetSpec) -> dict[str, Any]:
    """cert-manager: the fleet CA (10 years), kept by cert-manager in ``<name>-ca``."""
    return {
        "apiVersion": CERT_MANAGER_API,
        "kind": "Certificate",
        "metadata": _metadata(spec, naming.ca_secret(spec.name), "tls"),
        "spec": {
            "isCA": True,
            "commonName": f"{spec.name}.{spec.namespace} eventfleet CA",
            "secretName": naming.ca_secret(spec.name),
            "duration": "87600h",
            "privateKey": {"algorithm": "ECDSA", "size": 256},
            "issuerRef": {
                "name": naming.selfsigned_issuer(spec.name),
                "kind": "Issuer",
                "group": "cert-manager.io",
            },
        },
    }


def cm_ca_issuer(spec: FleetSpec) -> dict[str, Any]:
    """cert-manager: the CA Issuer signing the fleet certificate (fills ``ca.crt``)."""
    return {
        "apiVersion": CERT_MANAGER_API,
        "kind": "Issuer",
        "metadata": _metadata(spec, naming.ca_issuer(spec.name), "tls"),
        "spec": {"ca": {"secretName": naming.ca_secret(spec.name)}},
    }


def cm_certificate(spec: FleetSpec) -> dict[str, Any]:
    """cert-manager: the fleet certificate, written to ``<name>-tls`` and renewed by
    cert-manager; server and client use (mutual TLS between peers)."""
    issuer = spec.tls.issuer
    ref = (
        {"name": issuer.name, "kind": issuer.kind, "group": issuer.group}
        if issuer
        else {"name": naming.ca_issuer(spec.name), "kind": "Issuer", "group": "cert-manager.io"}
    )
    return {
        "apiVersion": CERT_MANAGER_API,
        "kind": "Certificate",
        "metadata": _metadata(spec, naming.tls_secret(spec.name), "tls"),
        "spec": {
            "secretName": naming.tls_secret(spec.name),
            "commonName": f"{naming.client_service(spec.name)}.{spec.namespace}.svc",
            "dnsNames": naming.tls_names(spec.name, spec.namespace),
            "duration": CERT_DURATION,
            "renewBefore": CERT_RENEW_BEFORE,
            "usages": ["digital signature", "server auth", "client auth"],
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "issuerRef": ref,
        },
    }


def cm_manifests(spec: FleetSpec) -> list[dict[str, Any]]:
    """Every cert-manager object of the fleet, in apply order (issuers before use)."""
    if spec.tls.issuer is not None:
        return [cm_certificate(spec)]
    return [
        cm_selfsigned_issuer(spec),
        cm_ca_certificate(spec),
        cm_ca_issuer(spec),
        cm_certificate(spec),
    ]


def peer_service(spec: FleetSpec) -> dict[str, Any]:
    """Headless Service giving every pod a stable DNS name for the Syncer mesh."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, naming.peer_service(spec.name), "peers"),
        "spec": {
            "clusterIP": "None",
            # Replicas are ready only after their initial sync, which needs the peers:
            # DNS must resolve pods before they are ready, or a new fleet never starts.
            "publishNotReadyAddresses": True,
            "selector": naming.selector_labels(spec.name),
            "ports": _service_ports(spec, Service.PEERS),
        },
    }


def client_service(spec: FleetSpec) -> dict[str, Any]:
    """ClusterIP Service for clients; only serving (not draining) replicas get traffic."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, naming.client_service(spec.name), "client"),
        "spec": {
            "type": "ClusterIP",
            "selector": {**naming.selector_labels(spec.name), naming.SERVING_LABEL: "true"},
            "ports": _service_ports(spec, Service.CLIENT),
        },
    }


def _probe(path: str, spec: FleetSpec) -> dict[str, Any]:
    probe: dict[str, Any] = {"path": path, "port": "http"}
    if spec.tls.enabled and spec.tls.http:
        probe["scheme"] = "HTTPS"  # the kubelet does not verify the certificate
    return probe


def _container(spec: FleetSpec) -> dict[str, Any]:
    ports = [
        {"name": name, "containerPort": port, "protocol": "TCP"}
        for name, port in (*((n, p) for _, n, p in spec.served_ports()), *_bus_plain_ports(spec))
    ]
    container: dict[str, Any] = {
        "name": "replica",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["eventfleet", "server", "--config", naming.CONFIG_PATH],
        "env": [
            # The replica's server id is its ordinal + 1, read from the pod name.
            {
                "name": "EVENTFLEET_POD_NAME",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
            },
            {
                "name": "EVENTFLEET_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
        ],
        "ports": ports,
        # A replica that refuses to start (a damaged store, a store of a newer schema)
        # logs one line and exits: that line becomes the container's termination
        # message, where the operator reads why (docs/operator.md, "Storage schema").
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Liveness only asks "is the loop alive"; readiness waits for the initial sync, so a
        # slow sync never gets the pod killed. The startup probe covers opening a big DB.
        "startupProbe": {
            "httpGet": _probe("/healthz", spec),
            "periodSeconds": 5,
            "failureThreshold": 60,
            "timeoutSeconds": 3,
        },
        "livenessProbe": {
            "httpGet": _probe("/healthz", spec),
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 2,
        },
        # failureThreshold 1: a stopping replica turns /readyz 503 at once and must
        # leave the client Service at once (docs/observability.md).
        "readinessProbe": {
            "httpGet": _probe("/readyz", spec),
            "periodSeconds": 5,
            "failureThreshold": 1,
            "timeoutSeconds": 2,
        },
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": naming.DATA_DIR},
            # A directory mount, never subPath: kubelet only refreshes directory mounts,
            # and the replica hot-reloads the peer list from this file.
            {"name": "config", "mountPath": naming.CONFIG_DIR, "readOnly": True},
            {"name": "token", "mountPath": naming.TOKEN_DIR, "readOnly": True},
            {"name": "peer-token", "mountPath": naming.PEER_TOKEN_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if spec.replication.enabled and spec.replication.users_secret:
        container["volumeMounts"].append(
            {
                "name": "replication-users",
                "mountPath": naming.REPLICATION_USERS_DIR,
                "readOnly": True,
            }
        )
    for _, mount in _s3_credentials_volumes(spec):
        container["volumeMounts"].append(mount)
    if spec.tls.enabled:
        container["volumeMounts"].append(
            {"name": "tls", "mountPath": naming.TLS_DIR, "readOnly": True}
        )
    if _bus_curve(spec):
        container["volumeMounts"].append(
            {"name": "bus-curve", "mountPath": naming.BUS_CURVE_DIR, "readOnly": True}
        )
        if spec.bus_curve.allowed_keys_secret:
            container["volumeMounts"].append(
                {"name": "bus-clients", "mountPath": naming.BUS_CLIENT_KEYS_DIR, "readOnly": True}
            )
    if spec.resources:
        container["resources"] = {k: dict(v) for k, v in spec.resources.items()}
    return container


def _bus_curve(spec: FleetSpec) -> bool:
    """Is the Event BUS served, with CURVE?"""
    return spec.bus_curve.enabled and "bus" in spec.enabled_protocols


def _affinity(spec: FleetSpec) -> dict[str, Any]:
    if spec.affinity:
        return dict(spec.affinity)
    # Redundancy is the point: prefer one replica per node unless the user decides.
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": naming.selector_labels(spec.name)},
                    },
                }
            ]
        }
    }


ZONE_KEY = "topology.kubernetes.io/zone"


def topology_spread(spec: FleetSpec) -> list[dict[str, Any]]:
    """Spread over zones by default: every replica holds every event, so one zone must
    not hold every copy. ScheduleAnyway: a single-zone cluster still schedules."""
    selector = {"matchLabels": naming.selector_labels(spec.name)}
    if spec.topology_spread is None:
        return [
            {
                "maxSkew": 1,
                "topologyKey": ZONE_KEY,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": selector,
            }
        ]
    # The user's constraints; one without a selector would count unrelated pods.
    return [{"labelSelector": selector, **c} for c in spec.topology_spread]


def statefulset(spec: FleetSpec, *, replicas: int, config_hash: str) -> dict[str, Any]:
    """The replicas. ``replicas`` is what is safe right now, not always ``spec.replicas``."""
    token, peer = spec.token_ref, spec.peer_token_ref
    pod_labels = {
        **spec.pod_labels,
        **naming.selector_labels(spec.name),
        naming.SERVING_LABEL: "true",
    }
    pod_annotations = {**spec.pod_annotations, naming.CONFIG_HASH_ANNOTATION: config_hash}
    if spec.restart:
        pod_annotations[naming.RESTART_ANNOTATION] = spec.restart
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # replicas never talk to the API server
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": spec.security.run_as_user,
            "runAsGroup": spec.security.run_as_group,
            "fsGroup": spec.security.fs_group,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": _affinity(spec),
        "containers": [_container(spec)],
        "volumes": [
            {"name": "config", "configMap": {"name": naming.configmap(spec.name)}},
            {
                "name": "token",
                "secret": {
                    "secretName": token.secret_name,
                    "items": [{"key": token.key, "path": "token"}],
                    "defaultMode": 0o440,
                },
            },
            {
                "name": "peer-token",
                "secret": {
                    "secretName": peer.secret_name,
                    "items": [{"key": peer.key, "path": "token"}],
                    "defaultMode": 0o440,
                },
            },
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    }
    spread = topology_spread(spec)
    if spread:
        pod_spec["topologySpreadConstraints"] = spread
    repl = spec.replication
    if repl.enabled and repl.users_secret:
        pod_spec["volumes"].append(
            {
                "name": "replication-users",
                "secret": {
                    "secretName": repl.users_secret,
                    "items": [{"key": repl.users_key, "path": "users.yaml"}],
                    "defaultMode": 0o440,
                },
            }
        )
    for volume, _ in _s3_credentials_volumes(spec):
        pod_spec["volumes"].append(volume)
    if spec.tls.enabled:
        # Renewal rewrites the Secret; the kubelet swaps the files and the replica
        # reloads them (a directory mount, never subPath, or the files never change).
        pod_spec["volumes"].append(
            {
                "name": "tls",
                "secret": {
                    "secretName": naming.tls_secret(spec.name),
                    "items": [{"key": k, "path": k} for k in ("tls.crt", "tls.key", "ca.crt")],
                    "defaultMode": 0o440,
                },
            }
        )
    if _bus_curve(spec):
        # A directory mount like TLS: a rotation rewrites the Secret, the kubelet swaps
        # the files and the replica picks the new key up without a restart.
        pod_spec["volumes"].append(
            {
                "name": "bus-curve",
                "secret": {
                    "secretName": naming.bus_curve_secret(spec.name),
                    "items": [{"key": "server.key", "path": "server.key"}],
                    "defaultMode": 0o440,
                },
            }
        )
        if spec.bus_curve.allowed_keys_secret:
            pod_spec["volumes"].append(
                {
                    "name": "bus-clients",
                    "secret": {
                        "secretName": spec.bus_curve.allowed_keys_secret,
                        "defaultMode": 0o440,
                    },
                }
            )
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": spec.storage.size}},
    }
    if spec.storage.storage_class_name:
        claim_spec["storageClassName"] = spec.storage.storage_class_name
    template = {
        "metadata": {"labels": pod_labels, "annotations": pod_annotations},
        "spec": pod_spec,
    }
    pod_annotations[naming.REVISION_ANNOTATION] = template_revision(template)
    if spec.update_strategy == "Managed":
        # The operator replaces pods itself (rollout.py): flushed first, one at a time,
        # and a pod stuck on a bad revision is replaced once the spec is fixed.
        strategy: dict[str, Any] = {"type": "OnDelete"}
    else:
        strategy = {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(spec, naming.statefulset(spec.name), "replica"),
        "spec": {
            "replicas": replicas,
            "serviceName": naming.peer_service(spec.name),
            "podManagementPolicy": "Parallel",
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": naming.selector_labels(spec.name)},
            "updateStrategy": strategy,
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": spec.storage.when_deleted,
                "whenScaled": spec.storage.when_scaled,
            },
            "template": template,
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data", "labels": naming.selector_labels(spec.name)},
                    "spec": claim_spec,
                }
            ],
        },
    }


def template_revision(template: Mapping[str, Any]) -> str:
    """Hash of a pod template without its own revision annotation (10 hex digits)."""
    meta = dict(template.get("metadata") or {})
    meta["annotations"] = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != naming.REVISION_ANNOTATION
    }
    canonical = json.dumps({**template, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def pod_disruption_budget(spec: FleetSpec) -> dict[str, Any]:
    """At most ``maxUnavailable`` replicas evicted at once; unhealthy pods always may be."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(spec, naming.pdb(spec.name), "replica"),
        "spec": {
            "maxUnavailable": spec.pdb.max_unavailable,
            "unhealthyPodEvictionPolicy": spec.pdb.unhealthy_pod_eviction_policy,
            "selector": {"matchLabels": naming.selector_labels(spec.name)},
        },
    }


def operator_peer(namespace: str | None, labels: Mapping[str, str]) -> dict[str, Any]:
    """The NetworkPolicyPeer matching the operator's pods (any namespace when unknown)."""
    ns_selector: dict[str, Any] = (
        {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {}
    )
    return {"namespaceSelector": ns_selector, "podSelector": {"matchLabels": dict(labels)}}


def network_policy(spec: FleetSpec, operator: Mapping[str, Any]) -> dict[str, Any]:
    """Ingress rules of the fleet's pods (egress is not restricted).

    Syncer only from the fleet's own pods; the HTTP port (``/flush``, ``/status``,
    ``/metrics``) from the operator (``operator``: a NetworkPolicyPeer), the monitoring
    sources and ``spec.networkPolicy.http.from``; the client ports from
    ``spec.networkPolicy.clients.from``, or from anywhere when that is empty. The Event
    BUS PLAIN ports (``spec.protocols.bus.curve.plainPort``) only from
    ``plainNetworks`` when given (a policy cannot intersect them with clients.from; the
    replica checks plainNetworks itself too), else as the other client ports.
    """
    np = spec.network_policy

    def ports(service: Service | None, protocols: tuple[str, ...]) -> list[dict[str, Any]]:
        return [
            {"protocol": "TCP", "port": port}
            for entry, _, port in spec.served_ports(service)
            if entry.protocol in protocols
        ]

    own = {"podSelector": {"matchLabels": naming.selector_labels(spec.name)}}
    client_protocols = tuple(
        e.protocol
        for e in constants.PROTOCOL_PORTS
        if Service.CLIENT in e.services and e.protocol != "http"
    )
    http_from = [dict(operator), *(dict(p) for p in np.monitoring_from)]
    if spec.aggregation.enabled:
        # The Spark job reads the events through GET /export on the HTTP port.
        http_from.append({"podSelector": {"matchLabels": _aggregation_pod_labels(spec)}})
    http_from += [dict(p) for p in np.http_from]
    clients: dict[str, Any] = {"ports": ports(Service.CLIENT, client_protocols)}
    plain_ports = [{"protocol": "TCP", "port": port} for _, port in _bus_plain_ports(spec)]
    plain: list[dict[str, Any]] = []
    if plain_ports and spec.bus_curve.plain_networks:
        plain = [{"from": _ip_blocks(spec.bus_curve.plain_networks), "ports": plain_ports}]
    else:
        clients["ports"] += plain_ports
    if np.client_from:
        clients["from"] = [dict(p) for p in np.client_from]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(spec, naming.network_policy(spec.name), "replica"),
        "spec": {
            "podSelector": {"matchLabels": naming.selector_labels(spec.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [own], "ports": ports(Service.PEERS, ("syncer",))},
                {"from": http_from, "ports": ports(None, ("http",))},
                clients,
                *plain,
            ],
        },
    }


def _ip_blocks(networks: tuple[str, ...]) -> list[dict[str, Any]]:
    """NetworkPolicyPeers for addresses or networks as the replica reads them (host bits
    allowed, a bare address is its own network): written canonical, ``10.1.0.0/16``."""
    return [{"ipBlock": {"cidr": str(ipaddress.ip_network(n, strict=False))}} for n in networks]


def service_monitor(spec: FleetSpec) -> dict[str, Any]:
    """prometheus-operator ServiceMonitor scraping every replica through the peer Service.

    With TLS on the HTTP port (``spec.tls.enabled`` and ``spec.tls.http``) the port
    speaks HTTPS only, so Prometheus scrapes ``https`` and verifies the replicas against
    the fleet CA: ``ca.crt`` of the fleet's TLS Secret, which every provider fills (the
    per-fleet ``<name>-ca`` Secret does not exist when a user's issuer signs). Prometheus
    connects to pod addresses, so the name checked is the client Service's, which every
    fleet certificate carries. The HTTP port asks for no client certificate.
    """
    labels = {**naming.labels(spec.name, "monitoring"), **dict(spec.service_monitor.labels)}
    meta = _metadata(spec, naming.service_monitor(spec.name), "monitoring")
    meta["labels"] = labels
    endpoint: dict[str, Any] = {
        "port": "http",
        "path": "/metrics",
        "scheme": "http",
        "interval": spec.service_monitor.interval,
    }
    if spec.tls.enabled and spec.tls.http:
        endpoint["scheme"] = "https"
        endpoint["tlsConfig"] = {
            "ca": {"secret": {"name": naming.tls_secret(spec.name), "key": "ca.crt"}},
            "serverName": f"{naming.client_service(spec.name)}.{spec.namespace}.svc",
        }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": naming.labels(spec.name, "peers")},
            "endpoints": [endpoint],
        },
    }


def _aggregation_pod_labels(spec: FleetSpec) -> dict[str, str]:
    """Labels of the Spark driver and executor pods (also what the NetworkPolicy admits)."""
    return naming.labels(spec.name, "aggregation")


# The Spark image's user and group (the official image's `spark`, uid and gid 185).
SPARK_UID = 185
SPARK_GID = 185


# The driver maps the image's class-data-sharing archive (a cold run's JVM then loads
# Spark's classes from it instead of parsing and verifying them: docs/aggregation.md).
# -Xshare:auto, the JVM's default, runs without it, after one [warning][cds] line, when
# the image has none or another JDK/Spark; the JVM's log lines go to stderr, as stdout
# carries the job's summary lines.
SPARK_DRIVER_JAVA_OPTIONS = (
    f"-XX:SharedArchiveFile={naming.SPARK_CLASS_ARCHIVE}"
    " -Xlog:disable -Xlog:all=warning:stderr:uptime,level,tags"
)


def driver_class_archive_conf(user_conf: Mapping[str, str]) -> dict[str, str]:
    """`user_conf` (spec.aggregation.sparkConf) with the driver's archive settings.

    Ours come first in both values, so the user's own options and class path still
    apply and can override (``-Xshare:off`` turns the archive off). The class path must
    start with the image's classpath jar: the archive is only valid for the class path
    it was written with.
    """
    conf = dict(user_conf)
    merged = {
        "spark.driver.extraJavaOptions": (SPARK_DRIVER_JAVA_OPTIONS, " "),
        "spark.driver.extraClassPath": (naming.SPARK_CLASSPATH_JAR, ":"),
    }
    for key, (ours, sep) in merged.items():
        theirs = conf.get(key, "").strip()
        conf[key] = f"{ours}{sep}{theirs}" if theirs else ours
    return conf


def scheduled_spark_application(spec: FleetSpec) -> dict[str, Any]:
    """spark-operator ScheduledSparkApplication running the aggregation job.

    ``spec.aggregation`` adds the user's ``sparkConf``, ``hadoopConf`` (S3A endpoint and
    options) and ``env`` (credentials from Secrets) and, with ``outputVolume``, mounts a
    PersistentVolumeClaim into the driver and every executor where ``--output`` points.
    """
    agg = spec.aggregation
    client_host = f"{naming.client_service(spec.name)}.{spec.namespace}.svc"
    eventer = f"{client_host}:{spec.ports.eventer}"
    # The Arrow read path (GET /export); the job falls back to Eventer per slice when a
    # replica does not serve it.
    http = f"{client_host}:{spec.ports.http}"
    token = spec.token_ref
    token_env = [
        {
            "name": "EVENTFLEET_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": token.secret_name, "key": token.key}},
        },
        # The user's (S3 credentials from a Secret...): the executors write the Parquet
        # files, so they need them as much as the driver.
        *(dict(e) for e in agg.env),
    ]
    pod_labels = _aggregation_pod_labels(spec)
    arguments = ["--eventer", eventer]
    if not spec.tls.enabled or spec.tls.http:
        arguments += ["--http", http]  # https with TLS (the job follows --tls-ca)
    arguments += [
        "--bucket",
        str(agg.bucket_seconds),
        "--output",
        agg.output,
        "--window",
        str(agg.window_seconds),
        # The run's result and counts become the driver's termination message, which
        # the operator reads into status.aggregation.lastResult (no log scraping).
        "--result-file",
        naming.TERMINATION_LOG,
    ]
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    # The `restricted` Pod Security Standard, which the namespaces the fleets run in may
    # enforce (the tests' do): without these the API server refuses the driver pod and
    # no run ever starts. The image's user is numeric (185), so runAsNonRoot holds.
    pod_security_context: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": SPARK_UID,
        "runAsGroup": SPARK_GID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container_security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    if spec.tls.enabled:
        # Only the CA (never the fleet's key): the job verifies the replicas.
        arguments += ["--tls-ca", f"{naming.SPARK_TLS_CA_DIR}/ca.crt"]
        volumes.append(
            {
                "name": "fleet-ca",
                "secret": {
                    "secretName": naming.tls_secret(spec.name),
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                },
            }
        )
        mounts.append({"name": "fleet-ca", "mountPath": naming.SPARK_TLS_CA_DIR, "readOnly": True})
    if agg.output_claim:
        # Parquet is written by the executors and committed by the driver: every pod
        # mounts the same claim at the same path.
        volumes.append(
            {
                "name": "aggregates",
                "persistentVolumeClaim": {"claimName": agg.output_claim},
            }
        )
        mounts.append({"name": "aggregates", "mountPath": AGGREGATION_OUTPUT_DIR})
        # The Spark image runs as uid 185: the volume's files get its group, writable.
        pod_security_context["fsGroup"] = SPARK_GID
    pod_security = {
        "podSecurityContext": pod_security_context,
        "securityContext": container_security,
    }
    app_volumes: dict[str, Any] = {"volumes": volumes} if volumes else {}
    pod_mounts: dict[str, Any] = {"volumeMounts": mounts} if mounts else {}
    conf: dict[str, Any] = {"sparkConf": driver_class_archive_conf(agg.spark_conf)}
    if agg.hadoop_conf:
        # spark-operator passes each as spark.hadoop.<key> (e.g. fs.s3a.endpoint).
        conf["hadoopConf"] = dict(agg.hadoop_conf)
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "ScheduledSparkApplication",
        "metadata": _metadata(spec, naming.spark_app(spec.name), "aggregation"),
        "spec": {
            "schedule": agg.schedule,
            "timeZone": agg.time_zone,
            # Always explicit: spark-operator skips every run after the first when unset.
            "concurrencyPolicy": agg.concurrency_policy,
            "suspend": agg.suspend,
            "successfulRunHistoryLimit": 3,
            "failedRunHistoryLimit": 3,
            "template": {
                "type": "Python",
                "pythonVersion": "3",
                "mode": "cluster",
                "image": agg.image,
                "imagePullPolicy": spec.image_pull_policy,
                "mainApplicationFile": naming.SPARK_MAIN,
                "arguments": arguments,
                **app_volumes,
                **conf,
                "sparkVersion": agg.spark_version,
                "restartPolicy": {"type": "Never"},
                "driver": {
                    "cores": agg.driver.cores,
                    "memory": agg.driver.memory,
                    "serviceAccount": agg.service_account_name,
                    "labels": pod_labels,
                    "env": token_env,
                    **pod_mounts,
                    **pod_security,
                },
                "executor": {
                    "instances": agg.executor.instances,
                    "cores": agg.executor.cores,
                    "memory": agg.executor.memory,
                    "labels": pod_labels,
                    "env": token_env,
                    **pod_mounts,
                    **pod_security,
                },
            },
        },
    }


# StatefulSet fields the API server refuses to change after creation.
IMMUTABLE_STATEFULSET_FIELDS = (
    "serviceName",
    "podManagementPolicy",
    "selector",
    "volumeClaimTemplates",
)


def keep_immutable(
    desired: dict[str, Any], live: dict[str, Any] | None
) -> tuple[dict[str, Any], list[str]]:
    """Desired StatefulSet with the live values of immutable fields, and what differed.

    Applying a changed ``volumeClaimTemplates`` (``spec.storage``) would be rejected
    and block every other change; keeping the live value lets the rest apply while the
    caller reports the storage change as not applicable.
    """
    if not live:
        return desired, []
    out = {**desired, "spec": dict(desired["spec"])}
    changed = []
    for field in IMMUTABLE_STATEFULSET_FIELDS:
        want, have = desired["spec"].get(field), (live.get("spec") or {}).get(field)
        if have is None or want is None:
            continue
        if field == "volumeClaimTemplates":
            same = [_claim_essence(c) for c in want] == [_claim_essence(c) for c in have]
        else:
            same = want == have
        if not same:
            out["spec"][field] = have
            changed.append(field)
    return out, changed


def _claim_essence(claim: dict[str, Any]) -> tuple[Any, ...]:
    spec = claim.get("spec") or {}
    return (
        (claim.get("metadata") or {}).get("name"),
        ((spec.get("resources") or {}).get("requests") or {}).get("storage"),
        spec.get("storageClassName"),
    )
