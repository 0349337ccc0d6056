"""spec.backup / spec.bootstrap.fromBackup: parsing, and what reaches the replicas."""

from __future__ import annotations

import base64
import copy
import datetime

import kubernetes_validate
import op_k8s_schema as k8s_schema
import pytest
from eventfleet_operator import backups, builders, kube, model, naming
from eventfleet_operator.reconcilers import backup as backup_steps
from eventfleet_operator.replicas import PeerLink, ReplicaStatus
from op_fakes import FULL_SPEC, FakeReplicas, status_doc
from op_pass import LOG, Harness

BACKUP_CRD = k8s_schema.load_crd(
    k8s_schema.CRD_PATH.parent / "eventfleet.io_eventserverbackups.yaml"
)
BACKUP_SCHEMA = k8s_schema.crd_schema(BACKUP_CRD, "v1")


def fleet(spec, name="demo", namespace="events"):
    return model.parse(name, namespace, spec, uid="uid-1")


def test_backup_defaults_and_prefix():
    spec = fleet({"backup": {"s3": {"bucket": "bkt"}}})
    assert spec.backup.schedule is None and spec.backup.retention == 7
    assert spec.backup.s3.prefix == "events/demo/"  # one bucket, many fleets
    assert spec.backup.s3.region == "us-east-1" and spec.backup.s3.credentials is None
    assert fleet({}).backup is None and fleet({}).from_backup is None


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"backup": {}}, "spec.backup.s3"),
        ({"backup": {"s3": {"bucket": "b"}}}, "spec.backup.s3.bucket"),
        ({"backup": {"s3": {"bucket": "bkt", "endpointURL": "minio:9000"}}}, "endpointURL"),
        ({"backup": {"schedule": "every day", "s3": {"bucket": "bkt"}}}, "spec.backup.schedule"),
        ({"backup": {"retention": 0, "s3": {"bucket": "bkt"}}}, "spec.backup.retention"),
        (
            {"backup": {"s3": {"bucket": "bkt", "credentialsSecret": {}}}},
            "credentialsSecret.name",
        ),
        ({"bootstrap": {"fromBackup": {"s3": {"bucket": "bkt"}}}}, "fromBackup.key"),
        (
            {"bootstrap": {"fromBackup": {"s3": {"bucket": "bkt"}, "key": "k", "sha256": "x"}}},
            "fromBackup.sha256",
        ),
    ],
)
def test_spec_errors_name_the_field(spec, field):
    with pytest.raises(model.SpecError) as err:
        fleet(spec)
    assert field in str(err.value)


def test_replica_config_carries_target_and_restore_source_with_credential_files():
    spec = fleet(copy.deepcopy(FULL_SPEC))
    config = builders.replica_config(spec, peer_count=spec.replicas, allow_empty_start=True)
    target, restore = config["backup"]["target"], config["backup"]["restore_from"]
    assert target == {
        "endpoint_url": "http://minio.backup.svc:9000",
        "region": "eu-central-1",
        "bucket": "eventfleet-backups",
        "addressing_style": "path",
        "access_key_id_file": f"{naming.BACKUP_CREDENTIALS_DIR}/access-key-id",
        "secret_access_key_file": f"{naming.BACKUP_CREDENTIALS_DIR}/secret-access-key",
        "prefix": "prod/demo/",
    }
    assert restore["bucket"] == "old-backups" and restore["key"].endswith(".sqlite")
    assert restore["sha256"] == "ab" * 32
    assert restore["access_key_id_file"].startswith(naming.RESTORE_CREDENTIALS_DIR)
    # No credential value anywhere in the config (it is a ConfigMap).
    assert "s3-creds" not in str(config)


def test_credentials_are_secret_volumes_mounted_read_only():
    spec = fleet(copy.deepcopy(FULL_SPEC))
    sts = builders.statefulset(spec, replicas=spec.replicas, config_hash="h")
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["backup-s3"]["secret"] == {
        "secretName": "s3-creds",
        "items": [
            {"key": "id", "path": "access-key-id"},
            {"key": "AWS_SECRET_ACCESS_KEY", "path": "secret-access-key"},
        ],
        "defaultMode": 0o440,
    }
    assert volumes["restore-s3"]["secret"]["secretName"] == "old-s3-creds"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["backup-s3"] == {
        "name": "backup-s3",
        "mountPath": naming.BACKUP_CREDENTIALS_DIR,
        "readOnly": True,
    }
    assert mounts["restore-s3"]["mountPath"] == naming.RESTORE_CREDENTIALS_DIR


def test_no_backup_no_section_no_volumes():
    spec = fleet({})
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=True)
    assert "backup" not in config
    pod = builders.statefulset(spec, replicas=3, config_hash="h")["spec"]["template"]["spec"]
    assert not {"backup-s3", "restore-s3"} & {v["name"] for v in pod["volumes"]}


# -- EventServerBackup: schedule, pruning, replica choice, status ----------------------------

UTC = datetime.UTC


def t(text):
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    "schedule, since, now, slot",
    [
        ("0 3 * * *", "2026-11-20 03:00", "2026-11-21 02:59", None),
        ("0 3 * * *", "2026-11-20 03:00", "2026-11-21 03:00", "2026-11-21 03:00"),
        ("0 3 * * *", "2026-11-20 03:00", "2026-11-23 10:00", "2026-11-23 03:00"),  # one, latest
        ("*/15 * * * *", "2026-11-20 03:00", "2026-11-20 03:31", "2026-11-20 03:30"),
        ("@hourly", "2026-11-20 03:00", "2026-11-20 03:59", None),
        ("@hourly", "2026-11-20 03:00", "2026-11-20 04:00", "2026-11-20 04:00"),
        ("@every 6h", "2026-11-20 03:00", "2026-11-20 08:59", None),
        ("@every 6h", "2026-11-20 03:00", "2026-11-20 15:30", "2026-11-20 15:00"),
        ("0 0 * * MON", "2026-11-20 00:00", "2026-11-24 00:00", "2026-11-23 00:00"),  # Monday
        ("30 2 1 JAN-MAR *", "2026-01-01 00:00", "2026-02-05 00:00", "2026-02-01 02:30"),
        ("30 2 1 JAN-MAR *", "2026-01-01 00:00", "2026-02-10 00:00", None),  # past LOOKBACK
        ("0 0 1 * SUN", "2026-11-01 01:00", "2026-11-08 00:00", "2026-11-08 00:00"),  # either
    ],
)
def test_due_slot(schedule, since, now, slot):
    got = backups.due_slot(schedule, t(since), t(now))
    assert got == (t(slot) if slot else None)


def backup_obj(name, created, phase=None, scheduled=True):
    obj = backups.manifest("demo", "events", name, scheduled=scheduled)
    obj["metadata"]["creationTimestamp"] = created
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def test_manifest_is_a_valid_eventserverbackup_not_owned_by_the_fleet():
    obj = backups.manifest("demo", "events", "demo-202611210300", scheduled=True)
    assert kube.resource_of(obj) is backups.RESOURCE  # the client can create it
    assert k8s_schema.errors(BACKUP_SCHEMA, obj) == []
    assert "ownerReferences" not in obj["metadata"]  # a backup outlives its fleet
    assert obj["metadata"]["labels"][naming.BACKUP_FLEET_LABEL] == "demo"
    assert backups.scheduled_name("demo", t("2026-11-21 03:00")) == "demo-202611210300"


def test_scheduled_names_carry_the_seconds_only_for_an_interval_under_a_minute():
    slot = datetime.datetime(2026, 11, 21, 3, 0, 20, tzinfo=datetime.UTC)
    for schedule in ("", "0 3 * * *", "@daily", "@every 6h", "@every 1m", "@every 90s"):
        assert backups.scheduled_name("demo", slot, schedule) == "demo-202611210300", schedule
    # Two slots of `@every 10s` in one minute: two names (one name made the second the
    # first's object, skipped, and the schedule one backup a minute).
    later = slot + datetime.timedelta(seconds=10)
    names = {backups.scheduled_name("demo", s, "@every 10s") for s in (slot, later)}
    assert names == {"demo-20261121030020", "demo-20261121030030"}


def test_backup_crd_is_valid():
    kubernetes_validate.validate(BACKUP_CRD, "1.33.0", strict=True)
    assert (
        k8s_schema.errors(
            BACKUP_SCHEMA, {**backups.manifest("d", "n", "x", scheduled=False), "spec": {}}
        )
        != []
    )


def test_to_prune_keeps_the_newest_scheduled_and_every_on_demand_one():
    objs = [
        backup_obj("d-1", "2026-11-01T03:00:00Z", "Completed"),
        backup_obj("d-2", "2026-11-02T03:00:00Z", "Completed"),
        backup_obj("d-3", "2026-11-03T03:00:00Z", "Failed"),
        backup_obj("d-4", "2026-11-04T03:00:00Z", "Completed"),
        backup_obj("d-5", "2026-11-05T03:00:00Z", "Running"),
        backup_obj("manual", "2026-10-01T03:00:00Z", "Completed", scheduled=False),
    ]
    assert [b["metadata"]["name"] for b in backups.to_prune(objs, 2)] == ["d-1"]
    assert [b["metadata"]["name"] for b in backups.to_prune(objs, 1)] == ["d-1", "d-2"]
    assert backups.to_prune(objs, 7) == []
    assert backups.last_scheduled(objs) == t("2026-11-05 03:00")


def status(ready=True, peers=(("demo-1", "synced"),)):
    return ReplicaStatus(
        server_id=1,
        status="operational",
        ready=ready,
        last_ids={},
        peers=tuple(PeerLink(n, 2, s, None, 0, 0.0) for n, s in peers),
        events=0,
        db_bytes=0,
    )


def test_pick_replica_prefers_the_highest_ready_in_sync_one():
    assert backups.pick_replica([(0, status()), (1, status()), (2, None)]) == (1, "")
    ordinal, why = backups.pick_replica(
        [(0, status(peers=(("demo-1", "connecting"),))), (1, status(ready=False)), (2, None)]
    )
    assert ordinal is None
    assert "0: peers not synced (demo-1=connecting)" in why
    assert "1: not ready" in why and "2: unreachable" in why


def test_completed_status_from_the_replica_answer():
    answer = {
        "backed_up": True,
        "bucket": "bkt",
        "key": "events/demo/b1.sqlite",
        "sha256": "a" * 64,
        "size": 8192,
        "events": 51,
        "events_sha256": "b" * 64,
        "last_ids": {"1": {"server": 1, "session": 2, "instance": 51}},
        "started": "2026-11-21T03:00:00.123456+00:00",
        "finished": "2026-11-21T03:00:02.5+00:00",
    }
    st = backups.completed_status(answer, "demo-1", 1)
    assert st["phase"] == "Completed" and st["replica"] == "demo-1"
    assert st["digest"] == {
        "sha256": "a" * 64,
        "size": 8192,
        "events": 51,
        "eventsSha256": "b" * 64,
        "lastIds": {"1": 51},
    }
    assert st["startedAt"] == "2026-11-21T03:00:00Z"
    doc = backup_obj("b1", "2026-11-21T03:00:00Z")
    doc["status"] = {k: v for k, v in st.items() if v is not None}
    assert k8s_schema.errors(BACKUP_SCHEMA, doc) == []


def test_the_backup_examples_of_docs_operator_md_are_valid():
    import pathlib
    import re

    import yaml

    text = (pathlib.Path(__file__).parents[3] / "docs" / "operator.md").read_text()
    section = text[text.index("## Backup and restore") : text.index("## Metrics")]
    docs = [
        d
        for block in re.findall(r"```yaml\n(.*?)```", section, re.S)
        for d in yaml.safe_load_all(block.replace("3f0c...", "3f0c" + "0" * 60))
        if isinstance(d, dict) and d.get("kind") == "EventServer"
    ]
    assert len(docs) == 2
    for doc in docs:
        assert k8s_schema.errors(k8s_schema.crd_schema(k8s_schema.load_crd(), "v1"), doc) == []
        model.parse(doc["metadata"]["name"], "default", doc["spec"])


# -- the flow of one EventServerBackup and of the schedule, on the in-memory API ---------


class BackupReplicas(FakeReplicas):
    def __init__(self):
        super().__init__()
        self.deleted: list[tuple[int, str]] = []

    async def backup(self, url, name, token, *, timeout):
        ordinal = self.ordinal(url)
        self.calls.append(("backup", ordinal, name))
        self.tokens.append(token)
        return {
            "backed_up": True,
            "bucket": "bkt",
            "key": f"ns/demo/{name}.sqlite",
            "sha256": "a" * 64,
            "size": 4096,
            "events": 7,
            "events_sha256": "b" * 64,
            "last_ids": {"1": {"server": 1, "session": 1, "instance": 7}},
            "started": "2026-11-21T03:00:00+00:00",
            "finished": "2026-11-21T03:00:01+00:00",
        }

    async def delete_backup(self, url, name, token):
        self.deleted.append((self.ordinal(url), name))


def harness(spec):
    h = Harness(spec)
    h.replicas = h.ctx.replicas = BackupReplicas()
    # The replicas' admin routes take the peer token, never the client token.
    for secret, token in (("demo-token", b"client-token"), ("demo-peer-token", b"fleet-token")):
        h.kube.put(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": "ns"},
                "data": {"token": base64.b64encode(token).decode()},
            }
        )
    for ordinal, server in ((0, 1), (1, 2)):
        other = "demo-1" if ordinal == 0 else "demo-0"
        h.replicas.docs[ordinal] = status_doc(
            server, {}, peers=[{"name": other, "server_id": 3 - server, "state": "synced"}]
        )
    return h


WITH_BACKUP = {"replicas": 2, "backup": {"s3": {"bucket": "bkt"}}}


async def step(h, name="b1"):
    body = h.kube.obj("EventServerBackup", name) or h.kube.put(
        backups.manifest("demo", "ns", name, scheduled=False)
    )
    return await backup_steps.run(h.ctx, body, LOG, h.emit)


async def test_a_backup_runs_on_the_highest_in_sync_replica_with_the_peer_token():
    h = harness(WITH_BACKUP)
    status = await step(h)
    assert status["phase"] == "Completed" and status["replica"] == "demo-1"
    assert ("backup", 1, "b1") in h.replicas.calls
    assert set(h.replicas.tokens) == {"fleet-token"}
    assert h.events[-1][:2] == ("Normal", "BackupCompleted")


async def test_a_backup_waits_for_a_synced_replica_then_gives_up():
    h = harness(WITH_BACKUP)
    h.replicas.docs[0]["peers"][0]["state"] = "connecting"
    h.replicas.down.add(1)
    h.kube.put(backups.manifest("demo", "ns", "b1", scheduled=False))
    for attempt in range(1, backups.MAX_ATTEMPTS + 1):
        body = h.kube.obj("EventServerBackup", "b1")
        status = await backup_steps.run(h.ctx, body, LOG, h.emit)
        body["status"] = status
        if attempt < backups.MAX_ATTEMPTS:
            assert status["phase"] == "Pending" and status["attempts"] == attempt
            assert "1: unreachable" in status["error"] and "demo-1=connecting" in status["error"]
    assert status["phase"] == "Failed" and "gave up after" in status["error"]
    assert not any(c[0] == "backup" for c in h.replicas.calls)
    assert h.events[-1][:2] == ("Warning", "BackupFailed")


async def test_a_backup_of_a_missing_fleet_or_one_without_spec_backup_fails():
    h = harness({"replicas": 2})
    status = await step(h)
    assert status["phase"] == "Failed" and "no spec.backup" in status["error"]
    other = backups.manifest("gone", "ns", "b2", scheduled=False)
    status = await backup_steps.run(h.ctx, h.kube.put(other), LOG, h.emit)
    assert status["phase"] == "Failed" and "'gone' not found" in status["error"]
    done = h.kube.put({**other, "metadata": {**other["metadata"], "name": "b3"}})
    done["status"] = {"phase": "Completed"}
    assert await backup_steps.run(h.ctx, done, LOG, h.emit) is None  # finished: left alone


async def test_the_schedule_creates_one_backup_per_slot_and_prunes_beyond_retention():
    backup = {"schedule": "@every 1h", "retention": 1, "s3": {"bucket": "bkt"}}
    spec = {"replicas": 2, "backup": backup}
    h = harness(spec)
    fleet = model.parse("demo", "ns", spec)
    created = "2026-01-01T00:00:00Z"  # long ago: one slot is due now, not one per hour
    await backup_steps.tick(h.ctx, fleet, created, LOG, h.emit)
    await backup_steps.tick(h.ctx, fleet, created, LOG, h.emit)  # the same slot: nothing new
    names = [n for k, _, n in h.kube.objects if k == "EventServerBackup"]
    assert len(names) == 1 and names[0].startswith("demo-")
    # Two completed scheduled backups, retention 1: the older one goes, object first.
    for name, when in (("demo-old", "2025-12-01T00:00:00Z"), (names[0], None)):
        obj = h.kube.obj("EventServerBackup", name) or h.kube.put(
            backups.manifest("demo", "ns", name, scheduled=True)
        )
        if when:
            obj["metadata"]["creationTimestamp"] = when
        obj["status"] = {"phase": "Completed"}
    await backup_steps.tick(h.ctx, fleet, created, LOG, h.emit)
    assert h.replicas.deleted == [(1, "demo-old")]
    assert h.kube.obj("EventServerBackup", "demo-old") is None
    assert h.kube.obj("EventServerBackup", names[0]) is not None
    assert ("Normal", "BackupPruned") == h.events[-1][:2]
