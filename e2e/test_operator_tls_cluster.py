"""spec.tls on the real single-node cluster (e2e/cluster): the operator (the chart's
Deployment, ``helm install`` into a restricted namespace) issues the fleet certificate
from its own CA, the replicas (the server image run by the kubelet) serve TLS on every
listener with mutual TLS between Syncer peers that find each other by DNS name, the
operator's own calls (/status, /flush) verify the fleet CA, and a re-issued certificate
reaches the replicas through the kubelet's refresh of the mounted Secret volume and is
served without restarting a replica.

The cert-manager path runs against cert-manager's real CRDs (v1.21.2, vendored in
e2e/k8s/external-crds) installed in the real API server, which validates every object
the operator writes. The cert-manager controller itself is not run here (it is not
buildable from the Go module proxy as a module, see docs/security.md): the test plays
its part, signing the requested Certificate and writing the Secret and the Certificate's
Ready status as cert-manager would.

The module's fleets are also watched as users watch theirs, with prometheus-operator's
and spark-operator's real CRDs installed (neither controller runs here: see
docs/observability.md and docs/aggregation.md): a real Prometheus scrapes the TLS fleet
and a plain one through the ServiceMonitors the operator wrote (e2e/cluster/monitoring.py),
and one run of the plain fleet's ScheduledSparkApplication runs as its driver pod in the
Spark image (e2e/cluster/spark.py), its result reaching ``status.aggregation.lastResult``.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import ssl
import subprocess
import sys
import time
import urllib.request

import pytest
from eventfleet_operator import naming, pki

from e2e.cluster import monitoring, spark
from e2e.cluster.clients import ClusterKubectl
from e2e.cluster.layout import NODE_IP, ROOT
from e2e.cluster.replicas import Replicas, register
from e2e.operator_helpers import condition, eventserver, wait_condition, wait_for

pytest_plugins = ["e2e.cluster.fixtures"]
pytestmark = pytest.mark.timeout(900)

EXTERNAL_CRDS = CM_CRDS = ROOT / "e2e" / "k8s" / "external-crds"


def secret_text(kubectl, name: str, key: str) -> str:
    secret = kubectl.get("secret", name) or {}
    return base64.b64decode((secret.get("data") or {}).get(key, "")).decode()


def served_der(address: str, ca_pem: str, name: str) -> bytes:
    """The certificate a TLS listener at ``address`` presents, verified for ``name``."""

    async def handshake():
        host, port = address.rsplit(":", 1)
        context = ssl.create_default_context(cadata=ca_pem)
        _, writer = await asyncio.open_connection(
            host, int(port), ssl=context, server_hostname=name
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return der

    return asyncio.run(asyncio.wait_for(handshake(), 10))


def der_of(pem: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem)


@pytest.fixture(scope="module")
def operator_values() -> tuple[str, ...]:
    return ("--set", "operator.resyncSeconds=2")


@pytest.fixture(scope="module")
def kubectl(ckubectl: ClusterKubectl) -> ClusterKubectl:
    return ckubectl


def test_operator_ca_tls_fleet_and_renewal_without_restart(kubectl, operator_release, tmp_path):
    ns = kubectl.namespace
    kubectl.apply(eventserver("sec", 2, tls={"enabled": True, "provider": "Operator"}))
    pods = Replicas(kubectl, "sec", tmp_path / "replicas")
    # Ready means: HTTPS probes pass and the operator read /status over HTTPS (fleet CA).
    wait_condition(kubectl, "sec", "Ready")
    wait_condition(kubectl, "sec", "CertificateReady", 60)
    status = kubectl.get("eventserver", "sec")["status"]
    assert status["tls"]["provider"] == "Operator"
    assert status["tls"]["secretName"] == "sec-tls"
    ca_pem = secret_text(kubectl, "sec-tls", "ca.crt")
    assert ca_pem == secret_text(kubectl, "sec-ca", "tls.crt")
    cert_pem = secret_text(kubectl, "sec-tls", "tls.crt")
    assert status["tls"]["fingerprint"] == pki.fingerprint(cert_pem)
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text(ca_pem)
    name0 = naming.peer_host("sec", ns, 0)
    assert served_der(pods.eventer(0), ca_pem, name0) == der_of(cert_pem)
    assert served_der(pods.http(0).split("://", 1)[1], ca_pem, name0) == der_of(cert_pem)
    # Plain HTTP on the HTTP port gets nothing: the probes and the operator use HTTPS.
    with pytest.raises(OSError):
        urllib.request.urlopen(pods.http(0) + "/healthz", timeout=3)

    # An event on replica 0 reaches replica 1 over the mutual-TLS Syncer link; the
    # operator sees both in sync through its own HTTPS calls.
    register(pods, 0, 1, tls=(str(ca_file), name0), first=1)
    wait_for(
        lambda: condition(kubectl.get("eventserver", "sec"), "PeersSynced").get("status") == "True",
        timeout=240,
        what="sec in sync",
    )
    containers = {o: pods.container(o) for o in (0, 1)}

    # Renewal: the key in the Secret is damaged (as a bad hand edit would). The replicas
    # keep serving the old certificate (the new files do not load), the operator
    # notices and re-issues from the same CA, the replicas load it: no restart.
    kubectl.run(
        "patch",
        "secret/sec-tls",
        "--type=merge",
        "-p",
        json.dumps({"data": {"tls.key": base64.b64encode(b"damaged").decode()}}),
    )

    def reissued():
        new = secret_text(kubectl, "sec-tls", "tls.crt")
        key = secret_text(kubectl, "sec-tls", "tls.key")
        return new if new != cert_pem and "PRIVATE KEY" in key else None

    new_pem = wait_for(reissued, timeout=240, what="the certificate re-issued")
    assert secret_text(kubectl, "sec-tls", "ca.crt") == ca_pem  # same CA: peers trust it
    for ordinal in (0, 1):
        name = naming.peer_host("sec", ns, ordinal)
        wait_for(
            lambda o=ordinal, n=name: served_der(pods.eventer(o), ca_pem, n) == der_of(new_pem),
            timeout=240,
            what=f"sec-{ordinal} serving the renewed certificate (kubelet volume refresh)",
        )
    assert {o: pods.container(o) for o in (0, 1)} == containers
    assert pods.restarts == {}
    events = [
        e
        for e in kubectl.json("get", "events", "--field-selector", "involvedObject.name=sec")[
            "items"
        ]
        if e["reason"] == "CertificateIssued"
    ]
    assert len(events) >= 3, events  # the CA, the first certificate, the re-issue
    # The mesh still works after the renewal: a new event crosses the TLS link.
    register(pods, 1, 1, tls=(str(ca_file), naming.peer_host("sec", ns, 1)), first=2)

    def on_replica_0():
        out = subprocess.run(
            [sys.executable, "-m", "eventfleet_cli", "query", "--eventer", pods.eventer(0),
             "--token-file", str(pods.token_file(0)), "--tls-ca", str(ca_file),
             "--tls-server-name", name0, "server", "2"],
            check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return [line for line in out.stdout.splitlines() if '"e2e"' in line] or None

    wait_for(on_replica_0, timeout=240, what="replica 1's event on replica 0 (query over TLS)")


@pytest.fixture(scope="module")
def watchers(real_cluster, kubectl, operator_release):
    """The ServiceMonitor and ScheduledSparkApplication CRDs installed in the API server
    (removed after: the other modules expect them missing) and the Spark image imported
    into containerd (1.2 GB: only for this module, not at every cluster start)."""
    crds = [
        EXTERNAL_CRDS / "monitoring.coreos.com_servicemonitors.yaml",
        EXTERNAL_CRDS / "sparkoperator.k8s.io_scheduledsparkapplications.yaml",
    ]
    for crd in crds:  # `create`, not `apply`: the last-applied annotation would be too big
        kubectl.run("create", "-f", str(crd))
    try:
        for name in (
            "servicemonitors.monitoring.coreos.com",
            "scheduledsparkapplications.sparkoperator.k8s.io",
        ):
            # Polled: `kubectl wait` right after `create` fails on a CRD without status yet.
            wait_for(
                lambda n=name: (
                    condition(kubectl.get("crd", n), "Established").get("status") == "True"
                ),
                timeout=60,
                what=f"{name} established",
            )
        wait_for(
            lambda: (
                {"servicemonitors", "scheduledsparkapplications"}
                <= set(kubectl.run("api-resources", "-o", "name").stdout.replace(".", " ").split())
            ),
            timeout=120,
            what="the new kinds in kubectl's discovery",
        )
        real_cluster.import_project_images("spark")
        yield
    finally:
        for crd in crds:
            kubectl.run("delete", "-f", str(crd), "--timeout=120s", timeout=130, check=False)


# Prometheus runs on the node (the host), as a Prometheus with hostNetwork would: its
# scrapes come from the node's address, which the fleet's NetworkPolicy admits to the
# HTTP port as a monitoring source.
WATCHED = {
    "monitoring": {"serviceMonitor": {"enabled": True, "interval": "5s"}},
    "networkPolicy": {"monitoring": {"from": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}]}},
    # Small buckets: the job's default window ends at the last complete bucket, so the
    # test's events are in it a few seconds after they were registered.
    "aggregation": {"enabled": True, "bucketSeconds": 2, "windowSeconds": 1800},
}


def test_prometheus_scrapes_every_replica_through_the_operators_service_monitor(
    real_cluster, kubectl, watchers, tmp_path
):
    """A plain fleet (http) and the TLS fleet `sec` (https, verified with the fleet CA
    from the Secret the ServiceMonitor names), each scraped by a real Prometheus
    configured from the ServiceMonitor as prometheus-operator would configure it."""
    kubectl.apply(eventserver("plain", 2, **WATCHED))
    kubectl.run("patch", "eventserver/sec", "--type=merge", "-p", json.dumps({"spec": WATCHED}))
    monitors = {
        name: wait_for(
            lambda n=name: kubectl.get("servicemonitor", n), timeout=120, what=f"{name}'s monitor"
        )
        for name in ("plain", "sec")
    }
    assert monitors["plain"]["spec"]["endpoints"][0]["scheme"] == "http"
    assert monitors["sec"]["spec"]["endpoints"][0]["scheme"] == "https"
    wait_condition(kubectl, "plain", "Ready")
    token = monitoring.prometheus_identity(kubectl, tmp_path)
    sd_file = tmp_path / "targets.json"
    monitoring.write_targets(sd_file, [])
    jobs = [
        job
        for monitor in monitors.values()
        for job in monitoring.scrape_jobs(kubectl, monitor, sd_file=sd_file, workdir=tmp_path)
    ]
    api = {
        "api_server": real_cluster.api_server,
        "api_ca": real_cluster.workdir / "pki" / "ca.crt",
        "token_file": token,
    }
    replicas = {"plain-0": "http", "plain-1": "http", "sec-0": "https", "sec-1": "https"}
    prometheus = monitoring.Prometheus(jobs, tmp_path)
    try:
        last: list = []

        def every_target_up():
            # Discovery follows the cluster as Prometheus' own would (pods restart).
            monitoring.write_targets(sd_file, monitoring.discover(kubectl.namespace, **api))
            last[:] = prometheus.targets()
            health = {t["labels"].get("pod"): t["health"] for t in last}
            return health == dict.fromkeys(replicas, "up")

        try:
            wait_for(every_target_up, timeout=180, what="every replica's target up")
        except AssertionError as e:
            seen = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in last]
            raise AssertionError(f"{e}; targets: {seen}") from None
        for target in last:
            pod, labels = target["labels"]["pod"], target["labels"]
            assert target["scrapeUrl"].startswith(f"{replicas[pod]}://"), target
            assert labels["namespace"] == kubectl.namespace, labels
            assert labels["job"] == labels["service"] == f"{pod.split('-')[0]}-peers", labels
            assert labels["endpoint"] == "http", labels

        # A replica's own metric, read back through Prometheus.
        pods = Replicas(kubectl, "plain", tmp_path / "plain")
        register(pods, 1, 3, event_type="e2e/scraped")
        query = (
            f'eventfleet_events_registered_total{{namespace="{kubectl.namespace}",'
            'pod="plain-1",origin="client"}'
        )
        wait_for(
            lambda: [r for r in prometheus.query(query) if float(r["value"][1]) >= 3],
            timeout=120,
            what=f"{query} >= 3",
        )
        ids = prometheus.query(f'eventfleet_server_id{{namespace="{kubectl.namespace}"}}')
        assert {r["metric"]["pod"] for r in ids} == set(replicas), ids
    finally:
        prometheus.stop()


# The TLS fleet ("sec": the CA mounted, https /export) passes too, but costs ~100 s of
# the cluster phase on CI, which is at its budget: run it by hand by adding it here.
@pytest.mark.parametrize("fleet", ["plain"])
def test_the_scheduled_spark_job_runs_in_a_pod_and_its_result_reaches_the_status(
    kubectl, watchers, tmp_path, fleet
):
    """The Spark image runs one run of the ScheduledSparkApplication the operator wrote,
    as its driver pod with exactly its arguments (e2e/cluster/spark.py: spark-operator
    does not run here), against the fleet's client Service (with TLS, the job verifies
    the replicas with the fleet CA the pod mounts); the operator reads the driver's
    termination message into ``status.aggregation.lastResult``."""
    wait_condition(kubectl, fleet, "Ready")  # the fleets of the test above
    pods = Replicas(kubectl, fleet, tmp_path)
    ca_file = tmp_path / "ca.crt"
    if fleet == "sec":
        ca_file.write_text(secret_text(kubectl, "sec-tls", "ca.crt"))

    def tls(ordinal: int) -> tuple[str, str] | None:
        if fleet != "sec":
            return None
        return (str(ca_file), naming.peer_host(fleet, kubectl.namespace, ordinal))

    register(pods, 0, 4, tls=tls(0), event_type="e2e/agg", first=100)
    register(pods, 1, 3, tls=tls(1), event_type="e2e/agg", first=104)
    time.sleep(2.5)  # the last complete bucket (2 s) now holds every event above
    app = wait_for(
        lambda: kubectl.get("scheduledsparkapplication", f"{fleet}-agg"),
        timeout=60,
        what="the ScheduledSparkApplication",
    )
    # What spark-operator's chart creates in each job namespace: the driver's account.
    account = app["spec"]["template"]["driver"]["serviceAccount"]
    kubectl.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}})
    run = f"{fleet}-agg-{time.time_ns()}"  # how spark-operator names a run
    pod = spark.run_driver(kubectl, app, run, timeout=600)
    log = kubectl.run("logs", f"{run}-driver", check=False).stdout
    assert pod["status"]["phase"] == "Succeeded", log[-5000:]
    summaries = [ln for ln in log.splitlines() if ln.startswith("aggregate ")]
    assert summaries and all("bucket=2s" in ln for ln in summaries), log[-5000:]
    # The driver's JVM maps the image's class-data-sharing archive (the operator's
    # spark.driver.extraJavaOptions, eventfleet_spark.image_archive), without a warning.
    mapped = f"class archive {naming.SPARK_CLASS_ARCHIVE}: mapped by the driver JVM"
    assert mapped in log and "[warning][cds" not in log, log[-5000:]

    def last_result():
        report = kubectl.get("eventserver", fleet)["status"].get("aggregation") or {}
        result = report.get("lastResult") or {}
        return result if result.get("run") == run else None

    result = wait_for(last_result, timeout=120, what="lastResult of the run")
    assert result["result"] == "Succeeded" and result["exitCode"] == 0, result
    assert result["events"] >= 7 and result["aggregates"] >= 1, result
    assert result["registered"] == result["aggregates"], result  # a first run: all new

    # The aggregates were registered back into the fleet: every replica holds them.
    def aggregates_on(ordinal: int):
        over_tls = tls(ordinal)
        tls_args = ["--tls-ca", over_tls[0], "--tls-server-name", over_tls[1]] if over_tls else []
        out = subprocess.run(
            [sys.executable, "-m", "eventfleet_cli", "query", "--eventer", pods.eventer(ordinal),
             "--token-file", str(pods.token_file(ordinal)), *tls_args, "timeseries",
             "eventfleet/aggregate/2/*"],
            check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
        return lines if len(lines) == result["registered"] else None

    for ordinal in (0, 1):
        wait_for(lambda o=ordinal: aggregates_on(o), timeout=120, what=f"aggregates on {ordinal}")


def test_cert_manager_certificate_with_its_real_crds(kubectl, operator_release, tmp_path):
    """Last: installs cert-manager's CRDs into the session's API server."""
    admin = kubectl  # the cluster admin
    for crd in ("cert-manager.io_certificates.yaml", "cert-manager.io_issuers.yaml"):
        admin.run("apply", "--server-side", "-f", str(CM_CRDS / crd))
    admin.run("wait", "--for=condition=Established", "crd/certificates.cert-manager.io")
    # kubectl caches discovery per server (earlier modules of the session filled it):
    # `api-resources` re-reads it, so the new kinds resolve by name below.
    wait_for(
        lambda: "certificates" in admin.run("api-resources", "--api-group=cert-manager.io").stdout,
        timeout=240,
        what="cert-manager's kinds in kubectl's discovery",
    )
    kubectl.apply(eventserver("cm", 2, tls={"enabled": True}))  # Auto: cert-manager is here
    # The operator's objects, as validated by the real API server against cert-manager's CRDs.
    cert = wait_for(
        lambda: kubectl.get("certificate.cert-manager.io", "cm-tls"),
        timeout=240,
        what="the Certificate",
    )
    for kind, name in (("issuer", "cm-selfsigned"), ("certificate", "cm-ca"), ("issuer", "cm-ca")):
        assert kubectl.get(f"{kind}.cert-manager.io", name), (kind, name)
    spec = cert["spec"]
    assert spec["secretName"] == "cm-tls"
    assert set(spec["dnsNames"]) == set(naming.tls_names("cm", kubectl.namespace))
    wait_for(
        lambda: (
            condition(kubectl.get("eventserver", "cm"), "CertificateReady").get("reason")
            == "CertificatePending"
        ),
        timeout=240,
        what="CertificatePending",
    )

    # cert-manager's part (no controller here): sign and write the Secret, then Ready.
    now = datetime.datetime.now(datetime.UTC)
    ca = pki.issue_ca("cm test CA", now)
    pair = pki.issue_certificate(ca, "cm", spec["dnsNames"], now)
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "cm-tls"},
            "type": "kubernetes.io/tls",
            "stringData": {
                "tls.crt": pair.cert_pem,
                "tls.key": pair.key_pem,
                "ca.crt": ca.cert_pem,
            },
        }
    )
    not_after = pki.not_after(pair.cert_pem).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "Certificate is up to date and has not expired",
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    kubectl.run(
        "patch",
        "certificate.cert-manager.io/cm-tls",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [ready], "notAfter": not_after}}),
    )
    pods = Replicas(kubectl, "cm", tmp_path)
    wait_condition(kubectl, "cm", "Ready")
    es = kubectl.get("eventserver", "cm")
    assert es["status"]["tls"]["provider"] == "CertManager"
    assert es["status"]["tls"]["notAfter"] == not_after
    assert condition(es, "CertificateReady")["status"] == "True"
    name0 = naming.peer_host("cm", kubectl.namespace, 0)
    assert served_der(pods.eventer(0), ca.cert_pem, name0) == der_of(pair.cert_pem)
    # The operator never wrote cert-manager's Secret: no ownerReference of ours on it.
    assert not kubectl.get("secret", "cm-tls")["metadata"].get("ownerReferences")
