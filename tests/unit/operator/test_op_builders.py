"""Every builder's output against the real Kubernetes 1.33 schemas and external CRDs."""

from __future__ import annotations

import base64
import json

import jsonschema
import kubernetes_validate
import op_k8s_schema as k8s_schema
import pytest
import yaml
from eventfleet_operator import builders, model, naming

K8S_VERSION = "1.33.0"


def validate_k8s(doc):
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:  # the full schema dump is unreadable
        pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {e.message} at {list(e.path)}")


def fleet(spec, name="demo", namespace="events"):
    return model.parse(name, namespace, spec, uid="0b8a7d5e-5c1e-4b7e-9d6f-3a2c1b0e9f8d")


def all_core_children(spec: model.FleetSpec, replicas=None):
    config = builders.replica_config(spec, peer_count=spec.replicas, allow_empty_start=True)
    digest = builders.config_hash(spec, config)
    return [
        builders.configmap(spec, config),
        builders.token_secret(spec, "s3cr3t"),
        builders.peer_service(spec),
        builders.client_service(spec),
        builders.statefulset(spec, replicas=replicas or spec.replicas, config_hash=digest),
        builders.pod_disruption_budget(spec),
    ]


def test_core_children_are_valid_kubernetes_1_33(any_spec):
    for doc in all_core_children(fleet(any_spec)):
        validate_k8s(doc)


def test_validation_is_strict_really():
    # Guard against a validator that accepts anything (unknown kinds are skipped by the CLI).
    doc = builders.peer_service(fleet({}))
    doc["spec"]["bogus"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_child_is_owned_labelled_and_namespaced(any_spec):
    spec = fleet(any_spec)
    docs = [*all_core_children(spec), builders.service_monitor(spec)]
    docs.append(builders.scheduled_spark_application(spec))
    for doc in docs:
        meta = doc["metadata"]
        assert meta["namespace"] == "events"
        assert meta["labels"]["app.kubernetes.io/instance"] == "demo"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "eventfleet-operator"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "eventfleet.io/v1",
            "kind": "EventServer",
            "name": "demo",
            "uid": spec.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_service_monitor_is_valid_against_prometheus_operator_crd(any_spec):
    schema = k8s_schema.external_crd("monitoring.coreos.com_servicemonitors.yaml")
    doc = builders.service_monitor(fleet(any_spec))
    assert k8s_schema.errors(schema, doc) == []
    validate_k8s_meta(doc)


@pytest.mark.parametrize("tls", [{"enabled": True}, {"enabled": True, "http": True}])
def test_service_monitor_scrapes_https_with_the_fleet_ca_when_the_http_port_has_tls(tls):
    # With TLS on the HTTP port the port speaks HTTPS only: an `http` scrape fails and
    # every replica alert goes quiet.
    schema = k8s_schema.external_crd("monitoring.coreos.com_servicemonitors.yaml")
    spec = fleet({"tls": tls, "monitoring": {"serviceMonitor": {"enabled": True}}})
    doc = builders.service_monitor(spec)
    assert k8s_schema.errors(schema, doc) == []
    (endpoint,) = doc["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": naming.tls_secret("demo"), "key": "ca.crt"}},
        "serverName": "demo.events.svc",
    }
    # The name Prometheus checks is one the fleet certificate carries.
    assert endpoint["tlsConfig"]["serverName"] in naming.tls_names("demo", "events")
    # ... and the CA key is one the replicas mount from the same Secret.
    sts = builders.statefulset(spec, replicas=1, config_hash="x")
    (tls_volume,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert tls_volume["secret"]["secretName"] == naming.tls_secret("demo")
    assert {"key": "ca.crt", "path": "ca.crt"} in tls_volume["secret"]["items"]


@pytest.mark.parametrize("tls", [{}, {"enabled": False}, {"enabled": True, "http": False}])
def test_service_monitor_scrapes_plain_http_when_the_http_port_has_no_tls(tls):
    schema = k8s_schema.external_crd("monitoring.coreos.com_servicemonitors.yaml")
    doc = builders.service_monitor(fleet({"tls": tls}))
    assert k8s_schema.errors(schema, doc) == []
    (endpoint,) = doc["spec"]["endpoints"]
    assert endpoint["scheme"] == "http"
    assert "tlsConfig" not in endpoint


def validate_k8s_meta(doc):
    # Custom resources' metadata is plain ObjectMeta: validate it via a ConfigMap wrapper.
    validate_k8s({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]})


def test_scheduled_spark_application_is_valid_against_spark_operator_crd(any_spec):
    schema = k8s_schema.external_crd("sparkoperator.k8s.io_scheduledsparkapplications.yaml")
    doc = builders.scheduled_spark_application(fleet(any_spec))
    assert k8s_schema.errors(schema, doc) == []
    validate_k8s_meta(doc)


def test_external_schema_check_is_strict():
    schema = k8s_schema.external_crd("sparkoperator.k8s.io_scheduledsparkapplications.yaml")
    doc = builders.scheduled_spark_application(fleet({}))
    doc["spec"]["template"]["pythonVersion"] = 3  # must be the string "3"
    doc["spec"]["template"]["driver"]["coresTypo"] = 1
    errors = k8s_schema.errors(schema, doc)
    assert any("pythonVersion" in e for e in errors)
    assert any("coresTypo" in e for e in errors)


def test_spark_application_contract():
    spec = fleet({"aggregation": {"enabled": True, "bucketSeconds": 60, "windowSeconds": 900}})
    doc = builders.scheduled_spark_application(spec)
    tmpl = doc["spec"]["template"]
    assert doc["spec"]["concurrencyPolicy"] == "Forbid"  # never unset
    assert tmpl["pythonVersion"] == "3"
    assert tmpl["type"] == "Python"
    assert tmpl["mainApplicationFile"] == "local:///opt/eventfleet/aggregate.py"
    assert tmpl["image"] == model.DEFAULT_SPARK_IMAGE
    assert tmpl["arguments"] == [
        "--eventer",
        "demo.events.svc:23012",
        "--http",
        "demo.events.svc:23080",
        "--bucket",
        "60",
        "--output",
        "/tmp/eventfleet/aggregates",
        "--window",
        "900",
        "--result-file",
        "/dev/termination-log",
    ]


@pytest.mark.parametrize("length", [1, 20, 26, 27, 40, 52])
def test_spark_app_names_leave_room_for_run_suffixes(length):
    name = "a" * length
    app = naming.spark_app(name)
    assert len(app) <= naming.MAX_SPARK_APP_NAME
    # spark-operator: run = `<app>-<19 digit nanos>`, UI Service `<run>-ui-svc` <= 63.
    assert len(f"{app}-{'9' * 19}-ui-svc") <= 63
    assert app == naming.spark_app(name)  # stable


def test_statefulset_shape():
    spec = fleet({"replicas": 3})
    sts = builders.statefulset(spec, replicas=2, config_hash="abc")
    s = sts["spec"]
    assert s["replicas"] == 2  # what is safe now, not spec.replicas
    assert s["podManagementPolicy"] == "Parallel"
    assert s["serviceName"] == "demo-peers"
    assert s["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    pod = s["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == model.DEFAULT_SERVER_IMAGE
    assert c["command"] == ["eventfleet", "server", "--config", "/etc/eventfleet/config.yaml"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    env = {e["name"]: e for e in c["env"]}
    assert env["EVENTFLEET_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["data"]["mountPath"] == "/var/lib/eventfleet"
    assert "subPath" not in mounts["config"]  # kubelet refreshes only directory mounts
    assert s["template"]["metadata"]["annotations"][naming.CONFIG_HASH_ANNOTATION] == "abc"
    # The selector is immutable and must not contain the serving label pods toggle.
    assert naming.SERVING_LABEL not in s["selector"]["matchLabels"]
    assert s["template"]["metadata"]["labels"][naming.SERVING_LABEL] == "true"


def test_full_spec_reaches_the_pods(full_spec):
    spec = fleet(full_spec)
    pod = builders.statefulset(spec, replicas=5, config_hash="x")["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"disktype": "ssd"}
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"
    assert "nodeAffinity" in pod["spec"]["affinity"]
    assert pod["spec"]["priorityClassName"] == "high"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["metadata"]["labels"]["team"] == "events"
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"]["memory"] == "1Gi"
    assert not any(p["name"].startswith("bus") for p in c["ports"])  # bus disabled
    token = next(v for v in pod["spec"]["volumes"] if v["name"] == "token")["secret"]
    assert token == {
        "secretName": "my-token",
        "items": [{"key": "secret", "path": "token"}],
        "defaultMode": 0o440,
    }


def test_peers_and_config():
    spec = fleet({"replicas": 3})
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=False)
    assert config["peers"] == [
        {
            "name": f"demo-{i}",
            "host": f"demo-{i}.demo-peers.events.svc",
            "port": 23013,
            "server_id": i + 1,
        }
        for i in range(3)
    ]
    assert "server_id" not in config  # from EVENTFLEET_POD_NAME, per pod
    assert config["token_file"] == naming.TOKEN_PATH
    cm = builders.configmap(spec, config)
    assert yaml.safe_load(cm["data"]["config.yaml"]) == config


def test_config_matches_the_replica_schema(any_spec):
    # The composed schema: the core plus every protocol package's fragment.
    from eventfleet_server.config import SCHEMA as schema

    spec = fleet(any_spec)
    config = builders.replica_config(spec, peer_count=spec.replicas, allow_empty_start=True)
    jsonschema.Draft202012Validator(schema).validate(config)


def test_config_hash_ignores_hot_reloaded_keys():
    spec = fleet({"replicas": 3})
    h3 = builders.config_hash(
        spec, builders.replica_config(spec, peer_count=3, allow_empty_start=True)
    )
    h5 = builders.config_hash(
        spec, builders.replica_config(spec, peer_count=5, allow_empty_start=False)
    )
    assert h3 == h5, "scaling must not restart the surviving replicas"
    other = fleet({"replicas": 3, "storage": {"synchronous": "NORMAL"}})
    assert (
        builders.config_hash(
            other, builders.replica_config(other, peer_count=3, allow_empty_start=True)
        )
        != h3
    )
    token = fleet({"replicas": 3, "token": {"secretRef": {"name": "t"}}})
    assert (
        builders.config_hash(
            token, builders.replica_config(token, peer_count=3, allow_empty_start=True)
        )
        != h3
    )


def test_builders_are_pure():
    spec = fleet({"replicas": 3})
    assert all_core_children(spec) == all_core_children(spec)


def test_token_secret_carries_data_not_string_data():
    secret = builders.token_secret(fleet({}), "tok")
    assert base64.b64decode(secret["data"]["token"]) == b"tok"
    assert "stringData" not in secret


def test_services():
    spec = fleet({})
    peers = builders.peer_service(spec)["spec"]
    assert peers["clusterIP"] == "None"
    assert peers["publishNotReadyAddresses"] is True
    client = builders.client_service(spec)["spec"]
    assert client["selector"][naming.SERVING_LABEL] == "true"
    # Eventer, the Event BUS (SNAPSHOT, PUBLISHER, COLLECTOR), HTTP.
    assert [p["port"] for p in client["ports"]] == [23012, 23030, 23031, 23032, 23080]
    pdb = builders.pod_disruption_budget(spec)["spec"]
    assert pdb["maxUnavailable"] == 1


def test_immutable_statefulset_fields_keep_their_live_values():
    before = builders.statefulset(fleet({"storage": {"size": "1Gi"}}), replicas=3, config_hash="a")
    after = builders.statefulset(
        fleet({"storage": {"size": "5Gi"}, "replicas": 4}), replicas=4, config_hash="b"
    )
    live = json.loads(json.dumps(before))
    # Servers add defaults to the live claim template: not a change.
    live["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"] = "Filesystem"
    assert builders.keep_immutable(before, live) == (before, [])
    kept, changed = builders.keep_immutable(after, live)
    assert changed == ["volumeClaimTemplates"]
    assert kept["spec"]["volumeClaimTemplates"] == live["spec"]["volumeClaimTemplates"]
    assert kept["spec"]["replicas"] == 4  # everything else still applies
    assert builders.keep_immutable(after, None) == (after, [])


def test_bus_is_served_by_default_and_can_be_turned_off():
    bus = ["bus-snapshot", "bus-publisher", "bus-collector"]
    on = fleet({})
    pod = builders.statefulset(on, replicas=3, config_hash="x")["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert [p["name"] for p in c["ports"]] == ["eventer", "syncer", *bus, "http"]
    ports = builders.client_service(on)["spec"]["ports"]
    assert [p["name"] for p in ports] == ["eventer", *bus, "http"]
    config = builders.replica_config(on, peer_count=3, allow_empty_start=False)
    assert config["bus"] == {"port": 23030, "enabled": True}

    off = fleet({"protocols": {"bus": {"enabled": False}}})
    pod = builders.statefulset(off, replicas=3, config_hash="x")["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert [p["name"] for p in c["ports"]] == ["eventer", "syncer", "http"]
    ports = builders.client_service(off)["spec"]["ports"]
    assert [p["name"] for p in ports] == ["eventer", "http"]
    config = builders.replica_config(off, peer_count=3, allow_empty_start=False)
    assert config["bus"] == {"port": 23030, "enabled": False}


def test_replication_renders_tables_and_mounts_the_user_list():
    spec = fleet(
        {
            "protocols": {
                "replication": {
                    "enabled": True,
                    "tables": [{"name": "users", "columns": {"name": {"update": True}}}],
                    "usersSecretRef": {"name": "repl-users", "key": "list.yaml"},
                }
            }
        }
    )
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=True)
    assert config["replication"] == {
        "enabled": True,
        "type_prefix": ["replication"],
        "tables": [
            {
                "name": "users",
                "key": "id",
                "columns": {"name": {"update": True}},
                "add": True,
                "delete": True,
            }
        ],
        "users_file": naming.REPLICATION_USERS_PATH,
    }
    pod = builders.statefulset(spec, replicas=3, config_hash="h")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "replication-users"]
    assert volume["secret"]["secretName"] == "repl-users"
    assert volume["secret"]["items"] == [{"key": "list.yaml", "path": "users.yaml"}]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {
        "name": "replication-users",
        "mountPath": naming.REPLICATION_USERS_DIR,
        "readOnly": True,
    } in mounts
    # Without a user list the fleet token is the password; off by default.
    plain = fleet({"protocols": {"replication": {"enabled": True, "tables": [{"name": "t"}]}}})
    config = builders.replica_config(plain, peer_count=1, allow_empty_start=True)
    assert "users_file" not in config["replication"]
    assert "replication" not in builders.replica_config(
        fleet({}), peer_count=1, allow_empty_start=True
    )


def test_replication_spec_errors_name_the_field():
    with pytest.raises(model.SpecError, match=r"spec\.protocols\.replication\.tables\[1\]\.name"):
        fleet({"protocols": {"replication": {"tables": [{"name": "a"}, {"name": "a"}]}}})
    with pytest.raises(model.SpecError, match=r"usersSecretRef\.name"):
        fleet({"protocols": {"replication": {"usersSecretRef": {"key": "x"}}}})
