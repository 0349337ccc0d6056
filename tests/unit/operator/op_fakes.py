"""Example specs and a scripted replica fleet for the operator tests (no network)."""

from __future__ import annotations

from typing import Any

from eventfleet_operator.replicas import ReplicaStatus, ReplicaUnreachable


def status_doc(server_id, last_ids, peers=(), ready=True):
    return {
        "version": 1,
        "server_id": server_id,
        "status": "operational",
        "ready": ready,
        "last_ids": {
            str(sid): {"server": sid, "session": s, "instance": i}
            for sid, (s, i) in last_ids.items()
        },
        "peers": list(peers),
        "storage": {"events": 10, "db_bytes": 4096},
    }


class FakeReplicas:
    """``ReplicaClient`` look-alike: URLs are ``fake://<ordinal>``; records every call."""

    def __init__(self):
        self.docs: dict[int, dict] = {}
        self.down: set[int] = set()
        self.flush_fails: set[int] = set()
        self.calls: list[tuple] = []
        self.tokens: list[str | None] = []

    @staticmethod
    def ordinal(url):
        return int(url.rsplit("/", 1)[-1])

    async def status(self, url, token=None):
        ordinal = self.ordinal(url)
        self.tokens.append(token)
        self.calls.append(("status", ordinal))
        if ordinal in self.down or ordinal not in self.docs:
            raise ReplicaUnreachable(f"{url}: connection refused")
        return ReplicaStatus.parse(self.docs[ordinal])

    async def flush(self, url, peer, token=None):
        ordinal = self.ordinal(url)
        self.tokens.append(token)
        self.calls.append(("flush", ordinal, peer))
        if ordinal in self.down or ordinal in self.flush_fails:
            raise ReplicaUnreachable(f"{url}/flush: timeout")
        return {"flushed": True}


class FakeEndpoints:
    def __init__(self):
        self.trusted = {}  # (namespace, name) -> (CA PEM, https) as the reconciler set it

    def url(self, namespace, name, ordinal, port):
        return f"fake://{ordinal}"

    def trust(self, namespace, name, ca_pem, *, https):
        self.trusted[(namespace, name)] = (ca_pem, https)


FULL_SPEC: dict[str, Any] = {
    "replicas": 5,
    "image": "registry.example/eventfleet/server:1.2.3",
    "imagePullPolicy": "Always",
    "imagePullSecrets": [{"name": "regcred"}],
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    "storage": {
        "size": "20Gi",
        "storageClassName": "fast-ssd",
        "synchronous": "NORMAL",
        "retentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
    },
    "ports": {"eventer": 24012, "syncer": 24013, "bus": 24030, "http": 24080},
    "token": {"secretRef": {"name": "my-token", "key": "secret"}},
    "clients": {"allowTokenless": True, "tokenlessNetworks": ["10.1.0.0/16", "fd00::1"]},
    "tls": {"enabled": True},
    "protocols": {
        "bus": {"enabled": False},
        "replication": {
            "enabled": True,
            "tables": [
                {"name": "users", "columns": {"id": {}, "name": {"update": True}}, "delete": False},
                {"name": "phones", "key": "number"},
            ],
            "usersSecretRef": {"name": "repl-users"},
        },
    },
    "retention": {"maxAgeSeconds": 86400, "maxEvents": 1000000},
    "syncer": {"subscriptions": [["a", "*"], ["b", "?", "c"]]},
    "monitoring": {
        "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}
    },
    "aggregation": {
        "enabled": True,
        "schedule": "@every 5m",
        "timeZone": "Europe/Zagreb",
        "concurrencyPolicy": "Replace",
        "bucketSeconds": 30,
        "windowSeconds": 600,
        "output": "s3a://bucket/aggregates",
        "image": "registry.example/eventfleet/spark:1.2.3",
        "sparkVersion": "4.0.1",
        "serviceAccountName": "spark-driver",
        "driver": {"cores": 2, "memory": "1g"},
        "executor": {"instances": 3, "cores": 2, "memory": "2g"},
        "sparkConf": {"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.4.1"},
        "hadoopConf": {"fs.s3a.endpoint": "http://minio.storage:9000"},
        "env": [
            {
                "name": "AWS_ACCESS_KEY_ID",
                "valueFrom": {"secretKeyRef": {"name": "s3", "key": "access-key-id"}},
            },
            {"name": "AWS_REGION", "value": "eu-central-1"},
        ],
    },
    "nodeSelector": {"disktype": "ssd"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "events", "effect": "NoSchedule"}
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                ]
            }
        }
    },
    "priorityClassName": "high",
    "podLabels": {"team": "events"},
    "podAnnotations": {"example.com/owner": "events"},
    "securityContext": {"runAsUser": 2000, "runAsGroup": 2000, "fsGroup": 2000},
    "terminationGracePeriodSeconds": 120,
    "logLevel": "DEBUG",
    "hibernate": False,
    "updateStrategy": {"type": "RollingUpdate"},
    "backup": {
        "schedule": "0 3 * * *",
        "retention": 14,
        "s3": {
            "endpointURL": "http://minio.backup.svc:9000",
            "region": "eu-central-1",
            "bucket": "eventfleet-backups",
            "prefix": "prod/demo/",
            "addressingStyle": "path",
            "credentialsSecret": {"name": "s3-creds", "accessKeyIdKey": "id"},
        },
    },
    "bootstrap": {
        "fromBackup": {
            "s3": {
                "endpointURL": "http://minio.backup.svc:9000",
                "bucket": "old-backups",
                "credentialsSecret": {"name": "old-s3-creds"},
            },
            "key": "prod/demo/demo-20260101-0300.sqlite",
            "sha256": "ab" * 32,
        }
    },
    "podDisruptionBudget": {
        "enabled": True,
        "maxUnavailable": "20%",
        "unhealthyPodEvictionPolicy": "IfHealthyBudget",
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 2,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
    "networkPolicy": {
        "enabled": True,
        "clients": {"from": [{"namespaceSelector": {"matchLabels": {"team": "scada"}}}]},
        "monitoring": {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]},
    },
}
