"""spec.aggregation on Kubernetes: durable output (a claim or s3a://), Spark and Hadoop
configuration, credentials from Secrets, and the last run in the EventServer status.

Every ScheduledSparkApplication built here is validated against spark-operator v2.5.2's
CRD (vendored, e2e/k8s/external-crds) and every spec against our own CRD.
"""

from __future__ import annotations

import re

import kubernetes_validate
import op_k8s_schema as k8s_schema
import pytest
import yaml
from eventfleet_operator import builders, model, naming, status
from eventfleet_operator.constants import ConditionType
from op_pass import Harness

SPARK_CRD = "sparkoperator.k8s.io_scheduledsparkapplications.yaml"

S3_ENV = [
    {
        "name": "AWS_ACCESS_KEY_ID",
        "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": "access-key-id"}},
    },
    {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": "secret-access-key"}},
    },
]


def fleet(aggregation, **spec):
    return model.parse(
        "demo", "events", {"aggregation": {"enabled": True, **aggregation}, **spec}, uid="u-1"
    )


def spark_app(spec):
    doc = builders.scheduled_spark_application(spec)
    errors = k8s_schema.errors(k8s_schema.external_crd(SPARK_CRD), doc)
    assert errors == []
    return doc


def crd_errors(spec):
    schema = k8s_schema.crd_schema(k8s_schema.load_crd())
    doc = {
        "apiVersion": "eventfleet.io/v1",
        "kind": "EventServer",
        "metadata": {"name": "demo", "namespace": "events"},
        "spec": spec,
    }
    return k8s_schema.errors(schema, k8s_schema.apply_defaults(schema, doc))


def argument(template, option):
    args = template["arguments"]
    return args[args.index(option) + 1]


def test_claim_is_mounted_in_driver_and_executors_and_is_the_default_output():
    aggregation = {"outputVolume": {"persistentVolumeClaim": {"claimName": "aggregates"}}}
    assert crd_errors({"aggregation": {"enabled": True, **aggregation}}) == []
    spec = fleet(aggregation)
    assert not spec.aggregation.output_is_ephemeral
    tmpl = spark_app(spec)["spec"]["template"]
    assert tmpl["volumes"] == [
        {"name": "aggregates", "persistentVolumeClaim": {"claimName": "aggregates"}}
    ]
    mount = {"name": "aggregates", "mountPath": model.AGGREGATION_OUTPUT_DIR}
    for pod in (tmpl["driver"], tmpl["executor"]):
        # Executors write the Parquet parts and the driver commits them: both need it.
        assert pod["volumeMounts"] == [mount]
        assert pod["podSecurityContext"]["fsGroup"] == builders.SPARK_GID
    assert argument(tmpl, "--output") == model.AGGREGATION_OUTPUT_DIR


def test_claim_with_tls_mounts_the_ca_and_the_claim():
    spec = fleet(
        {
            "outputVolume": {"persistentVolumeClaim": {"claimName": "agg"}},
            "output": f"{model.AGGREGATION_OUTPUT_DIR}/fleet-a",
        },
        tls={"enabled": True},
    )
    tmpl = spark_app(spec)["spec"]["template"]
    assert [v["name"] for v in tmpl["volumes"]] == ["fleet-ca", "aggregates"]
    for pod in (tmpl["driver"], tmpl["executor"]):
        assert [m["name"] for m in pod["volumeMounts"]] == ["fleet-ca", "aggregates"]
    assert argument(tmpl, "--output") == f"{model.AGGREGATION_OUTPUT_DIR}/fleet-a"


def test_s3a_output_with_credentials_from_a_secret_and_hadoop_conf():
    aggregation = {
        "output": "s3a://events/aggregates",
        "sparkConf": {"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.4.1"},
        "hadoopConf": {"fs.s3a.endpoint": "http://minio:9000", "fs.s3a.path.style.access": "true"},
        "env": S3_ENV,
    }
    assert crd_errors({"aggregation": {"enabled": True, **aggregation}}) == []
    spec = fleet(aggregation)
    assert not spec.aggregation.output_is_ephemeral
    tmpl = spark_app(spec)["spec"]["template"]
    assert argument(tmpl, "--output") == "s3a://events/aggregates"
    assert tmpl["sparkConf"] == {
        **aggregation["sparkConf"],
        **builders.driver_class_archive_conf({}),
    }
    # spark-operator adds the spark.hadoop. prefix itself.
    assert tmpl["hadoopConf"] == aggregation["hadoopConf"]
    assert "volumes" not in tmpl
    for pod in (tmpl["driver"], tmpl["executor"]):
        names = [e["name"] for e in pod["env"]]
        assert names == ["EVENTFLEET_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        assert pod["env"][1:] == S3_ENV
        assert "volumeMounts" not in pod and "fsGroup" not in pod["podSecurityContext"]


def test_default_output_is_ephemeral_and_nothing_extra_is_rendered():
    spec = fleet({})
    assert spec.aggregation.output == model.EPHEMERAL_AGGREGATION_OUTPUT
    assert spec.aggregation.output_is_ephemeral
    tmpl = spark_app(spec)["spec"]["template"]
    for key in ("volumes", "hadoopConf"):
        assert key not in tmpl
    # Only the driver's class archive settings (test_driver_maps_the_image_class_archive).
    assert tmpl["sparkConf"] == builders.driver_class_archive_conf({})
    assert [e["name"] for e in tmpl["driver"]["env"]] == ["EVENTFLEET_TOKEN"]


def test_driver_and_executors_meet_the_restricted_pod_security_standard():
    """A namespace enforcing `restricted` (the e2e tests' do) refuses a pod without
    these: spark-operator's driver would never start and no run would ever happen."""
    for tls in ({}, {"enabled": True}):
        tmpl = spark_app(fleet({}, tls=tls))["spec"]["template"]
        for pod in (tmpl["driver"], tmpl["executor"]):
            assert pod["podSecurityContext"] == {
                "runAsNonRoot": True,
                "runAsUser": builders.SPARK_UID,
                "runAsGroup": builders.SPARK_GID,
                "seccompProfile": {"type": "RuntimeDefault"},
            }
            assert pod["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }


@pytest.mark.parametrize(
    ("aggregation", "field", "words"),
    [
        (
            {
                "output": "s3a://b/p",
                "outputVolume": {"persistentVolumeClaim": {"claimName": "c"}},
            },
            "spec.aggregation.output",
            "is a URL",
        ),
        (
            {"output": "/data/out", "outputVolume": {"persistentVolumeClaim": {"claimName": "c"}}},
            "spec.aggregation.output",
            "/var/lib/eventfleet/aggregates",
        ),
        ({"output": "relative/out"}, "spec.aggregation.output", "'relative/out'"),
        ({"outputVolume": {}}, "spec.aggregation.outputVolume.persistentVolumeClaim", "required"),
        (
            {"outputVolume": {"persistentVolumeClaim": {}}},
            "spec.aggregation.outputVolume.persistentVolumeClaim.claimName",
            "required",
        ),
        (
            {"env": [{"name": "EVENTFLEET_TOKEN", "value": "x"}]},
            "spec.aggregation.env[0].name",
            "set by the operator",
        ),
        (
            {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
            "spec.aggregation.env[1].name",
            "twice",
        ),
        ({"env": [{"name": "A"}]}, "spec.aggregation.env[0]", "exactly one"),
        (
            {"env": [{"name": "A", "value": "1", "valueFrom": S3_ENV[0]["valueFrom"]}]},
            "spec.aggregation.env[0]",
            "exactly one",
        ),
        (
            {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
            "spec.aggregation.env[0].valueFrom",
            "secretKeyRef",
        ),
        (
            {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
            "spec.aggregation.env[0].valueFrom.secretKeyRef",
            "name and key",
        ),
        ({"sparkConf": {"spark.executor.cores": 2}}, "spec.aggregation.sparkConf", "string"),
        ({"hadoopConf": {"fs.s3a.path.style.access": True}}, "spec.aggregation.hadoopConf", ""),
    ],
)
def test_bad_aggregation_specs_name_the_field(aggregation, field, words):
    with pytest.raises(model.SpecError) as e:
        fleet(aggregation)
    assert e.value.field.startswith(field)
    assert words in e.value.message


@pytest.mark.parametrize(
    "aggregation",
    [
        {"outputVolume": {}},
        {"outputVolume": {"persistentVolumeClaim": {"claimName": ""}}},
        {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
        {"env": [{"name": "1=bad", "value": "x"}]},
        {"sparkConf": {"spark.executor.cores": 2}},
        {"output": ""},
    ],
)
def test_the_crd_refuses_what_the_operator_refuses(aggregation):
    assert crd_errors({"aggregation": {"enabled": True, **aggregation}}) != []


def test_the_crd_env_rule_is_declared():
    # jsonschema does not run CEL; the rule text is what the API server evaluates.
    agg = k8s_schema.crd_schema(k8s_schema.load_crd())["properties"]["spec"]["properties"][
        "aggregation"
    ]
    item = agg["properties"]["env"]["items"]
    assert item["x-kubernetes-validations"] == [
        {
            "rule": "has(self.value) != has(self.valueFrom)",
            "message": "set exactly one of value and valueFrom",
        }
    ]


# A ScheduledSparkApplication status as spark-operator v2.5.2 writes it.
SPARK_STATUS = {
    "lastRun": "2026-11-26T21:10:00Z",
    "lastRunName": "demo-agg-1795900200000000000",
    "nextRun": "2026-11-26T21:20:00Z",
    "scheduleState": "Scheduled",
    "pastSuccessfulRunNames": ["demo-agg-1795900200000000000"],
}


def test_spark_status_fixture_is_valid_against_spark_operator():
    doc = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "ScheduledSparkApplication"}
    doc["metadata"] = {"name": "demo-agg"}
    doc["spec"] = builders.scheduled_spark_application(fleet({}))["spec"]
    doc["status"] = SPARK_STATUS
    assert k8s_schema.errors(k8s_schema.external_crd(SPARK_CRD), doc) == []


def test_aggregation_report_takes_spark_operators_fields():
    report = status.aggregation_report({"status": SPARK_STATUS}, "s3a://b/p")
    assert report == {
        "output": "s3a://b/p",
        "lastRun": "2026-11-26T21:10:00Z",
        "lastRunName": "demo-agg-1795900200000000000",
        "nextRun": "2026-11-26T21:20:00Z",
        "state": "Scheduled",
        "pastSuccessfulRunNames": ["demo-agg-1795900200000000000"],
    }
    # Before spark-operator's first pass there is nothing to report but the output.
    assert status.aggregation_report({"spec": {}}, "/x") == {"output": "/x"}
    assert status.aggregation_report(None, "/x") == {"output": "/x"}


def status_errors(doc):
    schema = k8s_schema.crd_schema(k8s_schema.load_crd())["properties"]["status"]
    return k8s_schema.errors(schema, doc)


async def test_status_reports_the_last_run_from_the_scheduled_spark_application():
    claim = {"outputVolume": {"persistentVolumeClaim": {"claimName": "agg"}}}
    h = Harness({"aggregation": {"enabled": True, **claim}})
    first = await h.run()
    # Applied, not yet scheduled by spark-operator: only where it writes.
    assert first["aggregation"] == {"output": model.AGGREGATION_OUTPUT_DIR}
    app = h.kube.obj("ScheduledSparkApplication", "demo-agg")
    assert app is not None
    app["status"] = dict(SPARK_STATUS)  # what spark-operator writes
    second = await h.run()
    assert second["aggregation"]["lastRunName"] == SPARK_STATUS["lastRunName"]
    assert second["aggregation"]["lastRun"] == SPARK_STATUS["lastRun"]
    assert second["aggregation"]["state"] == "Scheduled"
    assert status_errors(second) == []
    assert h.condition(ConditionType.AGGREGATION_SCHEDULED)["status"] == "True"
    assert "lost" not in h.condition(ConditionType.AGGREGATION_SCHEDULED)["message"]
    # Level-based: turned off, the report goes with the child.
    h.set_spec({})
    third = await h.run()
    assert "aggregation" not in third
    assert h.kube.obj("ScheduledSparkApplication", "demo-agg") is None


async def test_ephemeral_output_is_called_out_in_the_condition():
    h = Harness({"aggregation": {"enabled": True}})
    await h.run()
    c = h.condition(ConditionType.AGGREGATION_SCHEDULED)
    assert c["status"] == "True"
    assert "/tmp/eventfleet/aggregates is in the driver pod and lost" in c["message"]
    assert "spec.aggregation.outputVolume" in c["message"]


def _doc_objects():
    text = (k8s_schema.ROOT / "docs" / "aggregation.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return [d for b in blocks for d in yaml.safe_load_all(b) if d]


def test_walkthrough_eventservers_are_valid_and_render_valid_spark_applications():
    fleets = [d for d in _doc_objects() if d["kind"] == "EventServer"]
    assert len(fleets) == 2  # the claim and the S3 variant
    outputs = []
    for doc in fleets:
        assert crd_errors(doc["spec"]) == []
        spec = model.parse(doc["metadata"]["name"], doc["metadata"]["namespace"], doc["spec"])
        assert not spec.aggregation.output_is_ephemeral
        outputs.append(argument(spark_app(spec)["spec"]["template"], "--output"))
    assert outputs == [model.AGGREGATION_OUTPUT_DIR, "s3a://events-archive/aggregates"]


def test_walkthrough_kubernetes_objects_are_valid_and_agree_with_the_fleet():
    docs = {d["kind"]: d for d in _doc_objects() if d["kind"] != "EventServer"}
    assert set(docs) == {"PersistentVolumeClaim", "Secret", "Pod"}
    for doc in docs.values():
        kubernetes_validate.validate(doc, "1.33.0", strict=True)
    claim = docs["PersistentVolumeClaim"]["metadata"]["name"]
    (volume,) = docs["Pod"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim
    (mount,) = docs["Pod"]["spec"]["containers"][0]["volumeMounts"]
    assert mount["mountPath"] == model.AGGREGATION_OUTPUT_DIR
    # The Secret's keys are the ones the S3 fleet's env refers to.
    fleet_env = next(
        d
        for d in _doc_objects()
        if d["kind"] == "EventServer" and "env" in d["spec"]["aggregation"]
    )["spec"]["aggregation"]["env"]
    keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in fleet_env}
    assert keys == set(docs["Secret"]["stringData"])


# What the job writes with --result-file (spark/eventfleet_spark/job.py run_result).
RUN_RESULT = {
    "result": "Succeeded",
    "window": ["2026-11-26T21:00:00Z", "2026-11-26T21:10:00Z"],
    "windows": 1,
    "events": 1176,
    "aggregates": 30,
    "parquetRows": 30,
    "registered": 30,
    "seconds": 37.4,
}


def driver_pod(run, finished=None, message="", exit_code=0, name=None):
    """A run's driver pod as Spark and spark-operator label it, ended or still running."""
    state = (
        {"terminated": {"exitCode": exit_code, "finishedAt": finished, "message": message}}
        if finished
        else {"running": {"startedAt": "2026-11-26T21:20:01Z"}}
    )
    labels = {
        **builders._aggregation_pod_labels(fleet({})),
        "spark-role": "driver",
        "sparkoperator.k8s.io/app-name": run,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name or f"{run}-driver", "namespace": "ns", "labels": labels},
        "status": {"containerStatuses": [{"name": "spark-kubernetes-driver", "state": state}]},
    }


def test_the_job_accepts_the_arguments_the_operator_gives_it():
    from eventfleet_spark import job

    spec = fleet({"enabled": True})
    arguments = builders.scheduled_spark_application(spec)["spec"]["template"]["arguments"]
    args = job.build_parser().parse_args(arguments)
    assert str(args.result_file) == "/dev/termination-log"  # the driver's termination message


def test_last_result_is_the_last_finished_drivers_termination_message():
    import json

    pods = [
        driver_pod("demo-agg-1", "2026-11-26T21:00:40Z", json.dumps({**RUN_RESULT, "events": 5})),
        driver_pod("demo-agg-2", "2026-11-26T21:10:37Z", json.dumps(RUN_RESULT)),
        driver_pod("demo-agg-3"),  # still running: not a result yet
    ]
    assert status.aggregation_result(pods) == {
        "run": "demo-agg-2",
        "finishedAt": "2026-11-26T21:10:37Z",
        "exitCode": 0,
        **RUN_RESULT,
    }
    assert status.aggregation_result([driver_pod("demo-agg-3")]) is None
    assert status.aggregation_result([]) is None


def test_a_driver_that_died_without_a_result_still_reports_its_end():
    died = driver_pod("demo-agg-4", "2026-11-26T21:30:02Z", "OOMKilled\n", exit_code=137)
    assert status.aggregation_result([died]) == {
        "run": "demo-agg-4",
        "result": "Failed",
        "finishedAt": "2026-11-26T21:30:02Z",
        "exitCode": 137,
    }
    # Fields of the wrong type (not the job's object) are left out, never copied blindly.
    odd = driver_pod("demo-agg-5", "2026-11-26T21:40:00Z", '{"events": "many", "windows": true}')
    assert set(status.aggregation_result([odd])) == {"run", "result", "finishedAt", "exitCode"}


async def test_status_reports_the_last_runs_result_and_counts():
    import json

    h = Harness({"aggregation": {"enabled": True}})
    await h.run()
    h.kube.obj("ScheduledSparkApplication", "demo-agg")["status"] = dict(SPARK_STATUS)
    run = SPARK_STATUS["lastRunName"]
    h.kube.put(driver_pod(run, "2026-11-26T21:10:37Z", json.dumps(RUN_RESULT)))
    # Not ours: another fleet's driver, and one of our executors.
    other = driver_pod("other-agg-1", "2026-11-26T21:59:00Z", json.dumps(RUN_RESULT))
    other["metadata"]["labels"]["app.kubernetes.io/instance"] = "other"
    h.kube.put(other)
    executor = driver_pod(run, "2026-11-26T21:11:00Z", name=f"{run}-exec-1")
    executor["metadata"]["labels"]["spark-role"] = "executor"
    h.kube.put(executor)
    status_now = await h.run()
    last = status_now["aggregation"]["lastResult"]
    assert last == {"run": run, "finishedAt": "2026-11-26T21:10:37Z", "exitCode": 0, **RUN_RESULT}
    assert status_errors(status_now) == []  # valid for our CRD's status schema


def test_driver_maps_the_image_class_archive():
    """The driver's JVM maps the job image's CDS archive, with the class path it was
    written with (the image's classpath jar first); nothing else is asked of it."""
    conf = spark_app(fleet({}))["spec"]["template"]["sparkConf"]
    assert conf == {
        "spark.driver.extraJavaOptions": f"-XX:SharedArchiveFile={naming.SPARK_CLASS_ARCHIVE}"
        " -Xlog:disable -Xlog:all=warning:stderr:uptime,level,tags",
        "spark.driver.extraClassPath": naming.SPARK_CLASSPATH_JAR,
    }
    # Never -Xshare:on: an image without the archive (a user's own) must still run.
    assert "-Xshare" not in conf["spark.driver.extraJavaOptions"]


def test_users_driver_options_and_class_path_follow_the_archive_settings():
    """The user's own values are kept, after ours: later JVM options win (-Xshare:off
    turns the archive off), and the archive's class path must come first."""
    user = {
        "spark.driver.extraJavaOptions": "-Xshare:off -Dx=1",
        "spark.driver.extraClassPath": "/opt/extra/a.jar",
        "spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.4.1",
    }
    conf = spark_app(fleet({"sparkConf": user}))["spec"]["template"]["sparkConf"]
    assert conf["spark.driver.extraJavaOptions"] == (
        f"{builders.SPARK_DRIVER_JAVA_OPTIONS} -Xshare:off -Dx=1"
    )
    assert conf["spark.driver.extraClassPath"] == f"{naming.SPARK_CLASSPATH_JAR}:/opt/extra/a.jar"
    assert conf["spark.jars.packages"] == user["spark.jars.packages"]
    # Pure: the parsed spec's mapping is not changed.
    assert dict(fleet({"sparkConf": user}).aggregation.spark_conf) == user


def test_operator_and_image_name_the_same_archive_paths():
    from eventfleet_spark import image_archive

    assert naming.SPARK_CLASS_ARCHIVE == image_archive.ARCHIVE
    assert naming.SPARK_CLASSPATH_JAR == image_archive.CLASSPATH_JAR
    assert builders.SPARK_DRIVER_JAVA_OPTIONS == image_archive.java_options()
