"""spec.backup / spec.bootstrap.fromBackup: parsing, and what reaches the replicas."""

from __future__ import annotations

import copy

import pytest
from eventfleet_operator import builders, model, naming
from op_fakes import FULL_SPEC


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
