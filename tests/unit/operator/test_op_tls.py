"""spec.tls on Kubernetes: the operator's own CA (pki), the manifests (replica config,
mounts, HTTPS probes, the Spark job's CA, cert-manager objects against cert-manager's
own CRDs), the operator's HTTPS calls, and reconciliation passes that issue, keep and
re-issue the fleet certificate."""

from __future__ import annotations

import base64
import datetime
import ssl

import op_k8s_schema as k8s_schema
import pytest
from aiohttp import web
from eventfleet_operator import builders, kube, model, naming, pki
from eventfleet_operator.replicas import Endpoints, ReplicaClient, ReplicaUnreachable
from op_pass import Harness

NOW = datetime.datetime.now(datetime.UTC)  # real TLS stacks check validity against the clock
NAMES = naming.tls_names("demo", "events")


def fleet(tls, **spec):
    return model.parse("demo", "events", {"tls": tls, **spec}, uid="u-1")


# -- pki -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca():
    return pki.issue_ca("test CA", NOW)


def test_a_fresh_certificate_needs_nothing_and_verifies_against_its_ca(ca, tmp_path):
    pair = pki.issue_certificate(ca, "demo.events.svc", NAMES, NOW)
    assert pki.renewal_reason(pair, ca.cert_pem, NAMES, NOW) is None
    assert pki.ca_problem(ca, NOW) is None
    # A real TLS stack accepts it for a pod's peer name (wildcard) and the client Service.
    (tmp_path / "ca.pem").write_text(ca.cert_pem)
    (tmp_path / "c.pem").write_text(pair.cert_pem)
    (tmp_path / "c.key").write_text(pair.key_pem)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "c.pem", tmp_path / "c.key")
    client = ssl.create_default_context(cafile=tmp_path / "ca.pem")
    for name in ("demo-2.demo-peers.events.svc", "demo.events.svc"):
        assert _handshake(server, client, name) is None, name
    assert "Hostname mismatch" in (_handshake(server, client, "demo-2.other.events.svc") or "")


def _handshake(server_ctx, client_ctx, name):
    """In-memory TLS handshake; None on success, else the client's error."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=name)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side, out, peer_in in ((client, c_out, s_in), (server, s_out, c_in)):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as e:
                return str(e)
            data = out.read()
            if data:
                peer_in.write(data)
        try:
            client.do_handshake()
            return None
        except ssl.SSLWantReadError:
            continue
        except ssl.SSLError as e:
            return str(e)
    return "no handshake"


def test_renewal_reasons(ca):
    pair = pki.issue_certificate(ca, "demo.events.svc", NAMES, NOW)
    # A third of 90 days left: renew (cert-manager's default rule too).
    assert pki.renewal_reason(pair, ca.cert_pem, NAMES, NOW + datetime.timedelta(days=59)) is None
    assert "expires" in pki.renewal_reason(
        pair, ca.cert_pem, NAMES, NOW + datetime.timedelta(days=61)
    )
    assert "differ" in pki.renewal_reason(pair, ca.cert_pem, [*NAMES, "extra.example"], NOW)
    other = pki.issue_ca("other", NOW)
    assert "not issued" in pki.renewal_reason(pair, other.cert_pem, NAMES, NOW)
    stranger = pki.issue_certificate(ca, "x", NAMES, NOW)
    mixed = pki.KeyPair(pair.cert_pem, stranger.key_pem)
    assert "does not belong" in pki.renewal_reason(mixed, ca.cert_pem, NAMES, NOW)
    assert "not PEM" in pki.renewal_reason(
        pki.KeyPair("junk", pair.key_pem), ca.cert_pem, NAMES, NOW
    )
    assert "not a CA" in pki.ca_problem(pair, NOW)
    assert "expires" in pki.ca_problem(ca, NOW + datetime.timedelta(days=3600))


# -- manifests -------------------------------------------------------------------------


def test_tls_config_mount_and_https_probes():
    spec = fleet({"enabled": True})
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=True)
    assert config["tls"] == {
        "enabled": True,
        "cert_file": naming.TLS_CERT_PATH,
        "key_file": naming.TLS_KEY_PATH,
        "ca_file": naming.TLS_CA_PATH,
        "http": True,
    }
    sts = builders.statefulset(spec, replicas=3, config_hash="h")
    pod = sts["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "demo-tls"
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    assert mount == {"name": "tls", "mountPath": naming.TLS_DIR, "readOnly": True}
    assert "subPath" not in mount  # a subPath mount never sees a renewed file
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    # HTTP left plain: probes too; TLS off: nothing of it at all.
    plain_http = builders.statefulset(
        fleet({"enabled": True, "http": False}), replicas=3, config_hash="h"
    )
    assert (
        "scheme"
        not in plain_http["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    )
    off = fleet({})
    assert "tls" not in builders.replica_config(off, peer_count=3, allow_empty_start=True)
    assert all(
        v["name"] != "tls"
        for v in builders.statefulset(off, replicas=3, config_hash="h")["spec"]["template"]["spec"][
            "volumes"
        ]
    )


def test_the_config_hash_restarts_for_tls_on_off_not_for_a_renewal():
    on, off = fleet({"enabled": True}), fleet({})

    def hash_of(s):
        return builders.config_hash(
            s, builders.replica_config(s, peer_count=3, allow_empty_start=True)
        )

    assert hash_of(on) != hash_of(off)
    # The certificate itself is not in the config: renewal changes only the Secret.
    assert hash_of(on) == hash_of(fleet({"enabled": True}))


def test_the_spark_job_gets_only_the_ca():
    spec = fleet({"enabled": True}, aggregation={"enabled": True})
    app = builders.scheduled_spark_application(spec)["spec"]["template"]
    args = app["arguments"]
    assert args[args.index("--tls-ca") + 1] == f"{naming.SPARK_TLS_CA_DIR}/ca.crt"
    (volume,) = app["volumes"]
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # no key
    for pod in ("driver", "executor"):
        assert app[pod]["volumeMounts"][0]["mountPath"] == naming.SPARK_TLS_CA_DIR
    no_https = builders.scheduled_spark_application(
        fleet({"enabled": True, "http": False}, aggregation={"enabled": True})
    )
    assert "--http" not in no_https["spec"]["template"]["arguments"]
    schema = k8s_schema.external_crd("sparkoperator.k8s.io_scheduledsparkapplications.yaml")
    assert k8s_schema.errors(schema, builders.scheduled_spark_application(spec)) == []


def test_cert_manager_objects_are_valid_against_cert_manager_crds():
    schemas = {
        "Certificate": k8s_schema.external_crd("cert-manager.io_certificates.yaml"),
        "Issuer": k8s_schema.external_crd("cert-manager.io_issuers.yaml"),
    }
    chain = builders.cm_manifests(fleet({"enabled": True}))
    assert [(d["kind"], d["metadata"]["name"]) for d in chain] == [
        ("Issuer", "demo-selfsigned"),
        ("Certificate", "demo-ca"),
        ("Issuer", "demo-ca"),
        ("Certificate", "demo-tls"),
    ]
    for doc in chain:
        assert k8s_schema.errors(schemas[doc["kind"]], doc) == [], doc["metadata"]["name"]
    cert = chain[-1]["spec"]
    assert cert["secretName"] == "demo-tls"
    assert cert["dnsNames"] == NAMES
    assert {"server auth", "client auth"} <= set(cert["usages"])
    assert chain[1]["spec"]["isCA"] is True
    # A user's issuer: only the Certificate, pointing at it.
    mine = builders.cm_manifests(
        fleet({"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}})
    )
    assert [d["kind"] for d in mine] == ["Certificate"]
    assert mine[0]["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert k8s_schema.errors(schemas["Certificate"], mine[0]) == []


def test_spec_errors_name_the_field():
    with pytest.raises(model.SpecError, match=r"spec\.tls\.issuerRef"):
        fleet({"enabled": True, "provider": "Operator", "issuerRef": {"name": "x"}})
    with pytest.raises(model.SpecError, match=r"spec\.tls\.provider"):
        fleet({"enabled": True, "provider": "Vault"})


# -- the operator's HTTPS calls --------------------------------------------------------


async def test_endpoints_turn_https_and_the_client_verifies_the_pods_name(ca, tmp_path):
    pair = pki.issue_certificate(ca, "demo.events.svc", NAMES, NOW)
    (tmp_path / "c.pem").write_text(pair.cert_pem)
    (tmp_path / "c.key").write_text(pair.key_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "c.key")

    async def status(request):
        return web.json_response({"version": 1, "server_id": 1, "status": "operational",
                                  "ready": True, "last_ids": {}, "peers": []})  # fmt: skip

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    urls = tmp_path / "urls.json"
    urls.write_text(f'{{"events/demo-0": "http://127.0.0.1:{port}"}}')
    endpoints = Endpoints(urls_file=str(urls))
    client = ReplicaClient(tls_for=endpoints.tls_for)
    try:
        assert endpoints.url("events", "demo", 0, 8080).startswith("http://")
        # HTTPS without a CA yet: refused before any byte is sent (no token in clear).
        endpoints.trust("events", "demo", None, https=True)
        url = endpoints.url("events", "demo", 0, 8080)
        assert url == f"https://127.0.0.1:{port}"
        with pytest.raises(ReplicaUnreachable, match="no CA known"):
            await client.status(url, "peer-token")
        # With the fleet CA: verified against demo-0's peer name, though dialled by IP.
        endpoints.trust("events", "demo", ca.cert_pem, https=True)
        url = endpoints.url("events", "demo", 0, 8080)
        assert (await client.status(url, "peer-token")).ready is True
        # Another CA: refused.
        endpoints.trust("events", "demo", pki.issue_ca("other", NOW).cert_pem, https=True)
        url = endpoints.url("events", "demo", 0, 8080)
        with pytest.raises(ReplicaUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await client.status(url, "peer-token")
    finally:
        await client.close()
        await runner.cleanup()


# -- reconciliation --------------------------------------------------------------------


def _data(secret, key):
    return base64.b64decode(secret["data"][key]).decode()


async def test_a_pass_issues_keeps_and_reissues_the_operators_certificate():
    h = Harness({"replicas": 2, "tls": {"enabled": True}})
    h.kube.missing.add(kube.CERTIFICATES)  # no cert-manager: Auto means the operator's CA
    await h.run()
    assert h.kube.obj("Certificate", "demo-tls") is None
    ca_secret, tls_secret = h.kube.obj("Secret", "demo-ca"), h.kube.obj("Secret", "demo-tls")
    assert ca_secret and tls_secret
    assert tls_secret["type"] == "kubernetes.io/tls"
    assert _data(tls_secret, "ca.crt") == _data(ca_secret, "tls.crt")
    names = naming.tls_names("demo", "ns")
    pair = pki.KeyPair(_data(tls_secret, "tls.crt"), _data(tls_secret, "tls.key"))
    assert (
        pki.renewal_reason(
            pair, _data(ca_secret, "tls.crt"), names, datetime.datetime.now(datetime.UTC)
        )
        is None
    )
    assert h.condition("CertificateReady")["status"] == "True"
    status = h.body["status"]["tls"]
    assert status["provider"] == "Operator" and status["secretName"] == "demo-tls"
    assert status["fingerprint"] == pki.fingerprint(pair.cert_pem)
    assert h.ctx.endpoints.trusted[("ns", "demo")] == (_data(ca_secret, "tls.crt"), True)
    issued = [e for e in h.events if e[1] == "CertificateIssued"]
    assert len(issued) == 2  # the CA, then the certificate

    # Steady: nothing is issued again.
    version = tls_secret["metadata"]["resourceVersion"]
    await h.run()
    assert h.kube.obj("Secret", "demo-tls")["metadata"]["resourceVersion"] == version
    assert len([e for e in h.events if e[1] == "CertificateIssued"]) == 2

    # A damaged Secret (someone edited tls.key): re-issued from the same CA, an Event says why.
    damaged = h.kube.obj("Secret", "demo-tls")
    damaged["data"]["tls.key"] = base64.b64encode(b"garbage").decode()
    await h.run()
    again = h.kube.obj("Secret", "demo-tls")
    assert _data(again, "tls.crt") != pair.cert_pem
    assert _data(again, "ca.crt") == _data(ca_secret, "tls.crt")  # same CA: peers keep trusting
    assert any(
        e[1] == "CertificateIssued" and "tls.key" not in e[2] and "key" in e[2] for e in h.events
    )

    # TLS off: the operator's Secrets go, the condition says so, calls are plain again.
    h.set_spec({"replicas": 2})
    await h.run()
    assert h.kube.obj("Secret", "demo-tls") is None and h.kube.obj("Secret", "demo-ca") is None
    assert h.condition("CertificateReady")["reason"] == "TLSDisabled"
    assert h.ctx.endpoints.trusted[("ns", "demo")] == (None, False)
    # Once cleaned up, a plain fleet's passes read nothing of TLS any more.
    h.kube.reads.clear()
    await h.run()
    assert not [r for r in h.kube.reads if r[1] in ("demo-tls", "demo-ca")], h.kube.reads
    assert h.condition("CertificateReady")["reason"] == "TLSDisabled"


async def test_with_cert_manager_the_operator_applies_certificates_and_waits_for_them():
    h = Harness({"replicas": 2, "tls": {"enabled": True}})  # the fake API has cert-manager
    await h.run()
    for kind, name in (
        ("Issuer", "demo-selfsigned"),
        ("Certificate", "demo-ca"),
        ("Issuer", "demo-ca"),
        ("Certificate", "demo-tls"),
    ):
        assert h.kube.obj(kind, name) is not None, (kind, name)
    assert h.kube.obj("Secret", "demo-ca") is None  # cert-manager's to write, not ours
    ready = h.condition("CertificateReady")
    assert (ready["status"], ready["reason"]) == ("False", "CertificatePending")
    # HTTPS with no CA known yet: the operator's calls are refused, never sent in clear.
    assert h.ctx.endpoints.trusted[("ns", "demo")] == (None, True)

    # cert-manager issues (played here by the test: the unit level has no controller).
    ca = pki.issue_ca("cm CA", NOW)
    pair = pki.issue_certificate(ca, "demo.ns.svc", naming.tls_names("demo", "ns"), NOW)
    h.kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "demo-tls", "namespace": "ns"},
            "type": "kubernetes.io/tls",
            "data": builders._b64(
                {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem, "ca.crt": ca.cert_pem}
            ),
        }
    )
    cert = h.kube.obj("Certificate", "demo-tls")
    cert["status"] = {
        "conditions": [{"type": "Ready", "status": "True", "message": "issued"}],
        "notAfter": "2027-02-24T12:00:00Z",
    }
    await h.run()
    assert h.condition("CertificateReady")["status"] == "True"
    assert h.body["status"]["tls"]["provider"] == "CertManager"
    assert h.body["status"]["tls"]["notAfter"] == "2027-02-24T12:00:00Z"
    assert h.ctx.endpoints.trusted[("ns", "demo")] == (ca.cert_pem, True)
    # The operator never rewrote cert-manager's Secret.
    assert not [w for w in h.kube.writes if w[1:] == ("Secret", "demo-tls")]
