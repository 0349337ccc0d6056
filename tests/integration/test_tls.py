"""TLS: the Eventer listener and HTTP serve TLS, Syncer links use mutual TLS (a peer
proves who it is with a certificate from the fleet's CA). Certificates are made here
with the openssl command-line tool (a CA, replica certificates with SAN 127.0.0.1, and
a second CA nobody trusts)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import ssl
import subprocess

import aiohttp
import pytest
import yaml
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import QueryLatestParams, RegisterEvent
from eventfleet_server.listener import client_context

from tests.conftest import running_replica
from tests.unit.test_syncer_replicas import Node, until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d, name):
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        cwd=d,
    )


def make_cert(d, ca, name, san="IP:127.0.0.1,DNS:localhost"):
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=d,
    )
    (d / f"{name}.ext").write_text(
        f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=d,
    )
    return {
        "enabled": True,
        "cert_file": str(d / f"{name}.pem"),
        "key_file": str(d / f"{name}.key"),
        "ca_file": str(d / f"{ca}.pem"),
    }


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "rogue-ca")
    return {
        "dir": d,
        "r1": make_cert(d, "ca", "r1"),
        "r2": make_cert(d, "ca", "r2"),
        "rogue": make_cert(d, "rogue-ca", "rogue"),
        "ca": str(d / "ca.pem"),
    }


def pair(tmp_path, tls1, tls2):
    n1 = Node(tmp_path, "r1", 1, token="t", tls=tls1)
    n2 = Node(tmp_path, "r2", 2, token="t", tls=tls2)
    n1.peers, n2.peers = [n2], [n1]
    return n1, n2


async def test_mutual_tls_between_peers_and_tls_for_clients(tmp_path, pki):
    n1, n2 = pair(tmp_path, pki["r1"], pki["r2"])
    try:
        for node in (n1, n2):
            await node.start(wait=False)
        for node in (n1, n2):
            await until(lambda n=node: n.start_task.done(), "started")
            await until(
                lambda n=node: all(p["state"] == "synced" for p in n.replica.syncer.state()),
                f"{node.name} synced over mutual TLS",
            )
        r1, r2 = n1.replica, n2.replica
        ca = client_context(pki["ca"])
        client = await connect("127.0.0.1", r1.eventer.port, "tls", client_token="t", ssl=ca)
        await client.register([RegisterEvent(("over", "tls"), None, None)], with_response=True)
        await client.close()
        reader = await connect("127.0.0.1", r2.eventer.port, "tls", client_token="t", ssl=ca)

        async def replicated():
            return (await reader.query(QueryLatestParams([("over", "tls")]))).events

        events = await until(replicated, "replicated over the TLS link")
        await reader.close()
        assert len(events) == 1
        # A plain-TCP client gets no session; one trusting another CA refuses the server.
        # Both failed handshakes are counted by the replica, with their cause.
        assert "tls_handshake" not in r1.eventer.rejected
        with pytest.raises((ConnectionError, OSError, TimeoutError)):
            await connect("127.0.0.1", r1.eventer.port, "plain", client_token="t", timeout=3)
        await until(lambda: r1.eventer.rejected.get("tls_handshake") == 1, "plain TCP counted")
        rogue_trust = client_context(str(pki["dir"] / "rogue-ca.pem"))
        with pytest.raises(ssl.SSLCertVerificationError):
            await connect("127.0.0.1", r1.eventer.port, "x", client_token="t", ssl=rogue_trust)
        await until(lambda: r1.eventer.rejected.get("tls_handshake") == 2, "rogue trust counted")
        # HTTPS probes; a plain-HTTP client and one trusting another CA are refused and
        # counted on the HTTP port too (the replica runs that handshake itself).
        async with aiohttp.ClientSession() as http:
            url = f"https://127.0.0.1:{r1.http.port}/healthz"
            async with http.get(url, ssl=ca) as res:
                assert res.status == 200
            assert r1.http.rejected == {}
            with pytest.raises(aiohttp.ClientError):
                await http.get(
                    f"http://127.0.0.1:{r1.http.port}/healthz",
                    timeout=aiohttp.ClientTimeout(total=5),
                )
            with pytest.raises(aiohttp.ClientError):
                await http.get(url, ssl=rogue_trust)
            await until(
                lambda: r1.http.rejected.get("tls_handshake") == 2, "HTTP handshakes counted"
            )
            async with http.get(f"https://127.0.0.1:{r1.http.port}/metrics", ssl=ca) as res:
                text = await res.text()
            found = re.search(
                r'^eventfleet_rejected_total\{protocol="http",reason="tls_handshake"\} (\S+)$',
                text,
                re.M,
            )
            assert found and float(found[1]) == r1.http.rejected["tls_handshake"]
    finally:
        await n2.stop()
        await n1.stop()


async def test_peer_with_a_certificate_from_another_ca_is_refused(tmp_path, pki):
    n1, n2 = pair(tmp_path, pki["r1"], pki["rogue"])
    try:
        for node in (n1, n2):
            await node.start(wait=False)
        for node in (n1, n2):
            await until(lambda n=node: n.start_task.done(), "started")
        # Both directions fail the handshake: neither link ever syncs.
        await until(
            lambda: all(
                p["state"] == "disconnected" and p["last_error"]
                for n in (n1, n2)
                for p in n.replica.syncer.state()
            ),
            "links refused",
        )
        errors = [p["last_error"] for n in (n1, n2) for p in n.replica.syncer.state()]
        assert any("CERTIFICATE_VERIFY_FAILED" in e or "certificate" in e.lower() for e in errors)
        # The listening side counts every refused handshake (the link retries with back-off).
        for node in (n1, n2):
            await until(
                lambda n=node: n.replica.syncer.rejected.get("tls_handshake", 0) >= 1,
                f"{node.name} counted the refused peer handshake",
            )
        assert all(p["state"] != "synced" for n in (n1, n2) for p in n.replica.syncer.state())
    finally:
        await n2.stop()
        await n1.stop()


async def served_certificate(port: int, ca: str) -> bytes:
    """The DER certificate a TLS listener on 127.0.0.1:`port` presents now."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(ca))
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return der


def der_of(pem_file: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(open(pem_file).read())


async def test_a_renewed_certificate_is_served_without_a_restart(tmp_path, pki):
    """Renewal (cert-manager or the operator rewriting the Secret): the replica loads
    the new files on its credential check and serves them on new connections; its
    Syncer link and established sessions stay; broken files keep the old certificate."""
    d = pki["dir"]
    live = tmp_path / "live"
    live.mkdir()
    for name in ("r1.pem", "r1.key", "ca.pem"):
        shutil.copy(d / name, live / name)
    tls1 = {
        "enabled": True,
        "cert_file": str(live / "r1.pem"),
        "key_file": str(live / "r1.key"),
        "ca_file": str(live / "ca.pem"),
    }
    n1, n2 = pair(tmp_path, tls1, pki["r2"])
    n1.overrides["token_reload_interval"] = 0.2
    try:
        for node in (n1, n2):
            await node.start(wait=False)
        for node in (n1, n2):
            await until(lambda n=node: n.start_task.done(), "started")
        await until(
            lambda: all(p["state"] == "synced" for p in n2.replica.syncer.state()), "synced"
        )
        r1 = n1.replica
        old = der_of(str(d / "r1.pem"))
        for port in (r1.eventer.port, r1.http.port, r1.syncer.port):
            assert await served_certificate(port, pki["ca"]) == old
        session = await connect(
            "127.0.0.1", r1.eventer.port, "kept", client_token="t", ssl=client_context(pki["ca"])
        )

        # A key that does not match the certificate: refused, the old one stays served.
        renewed = make_cert(d, "ca", "r1-renewed")
        shutil.copy(renewed["cert_file"], live / "r1.pem")
        await asyncio.sleep(1)
        assert await served_certificate(r1.eventer.port, pki["ca"]) == old

        shutil.copy(renewed["key_file"], live / "r1.key")
        new = der_of(renewed["cert_file"])
        assert new != old

        async def serving_new():
            return await served_certificate(r1.eventer.port, pki["ca"]) == new or None

        await until(serving_new, "the renewed certificate served")
        for port in (r1.http.port, r1.syncer.port):
            assert await served_certificate(port, pki["ca"]) == new
        # Same objects reloaded: nothing restarted, the session from before still works.
        await session.register([RegisterEvent(("renewed",), None, None)], with_response=True)
        await session.close()
        assert all(p["state"] == "synced" for p in n2.replica.syncer.state())
    finally:
        await n2.stop()
        await n1.stop()


async def test_tls_server_name_verifies_a_peer_reached_by_address(tmp_path, pki):
    """A peer reached at 127.0.0.1 whose certificate names only its DNS name: the link
    verifies that name (`tls_server_name`); without it the host name check refuses."""
    d = pki["dir"]
    named = make_cert(d, "ca", "r2-named", san="DNS:r2.fleet.example")
    n1, n2 = pair(tmp_path, pki["r1"], named)
    try:
        n1.peers = []  # r1 only accepts; r2 dials r1 (whose certificate has 127.0.0.1)
        await n1.start(wait=False)
        await n2.start(wait=False)
        for node in (n1, n2):
            await until(lambda n=node: n.start_task.done(), "started")
        # r1 -> r2 at 127.0.0.1 without a name: the certificate does not match.
        n1.peers = [n2]
        n1.write_config()
        n1.replica.reload("test")
        await until(
            lambda: any("certificate" in (p["last_error"] or "").lower()
                        or "CERTIFICATE_VERIFY_FAILED" in (p["last_error"] or "")
                        for p in n1.replica.syncer.state()),
            "host name mismatch refused",
        )  # fmt: skip
        assert all(p["state"] != "synced" for p in n1.replica.syncer.state())
        # With the name the certificate carries: it syncs.
        entry = {**n2.entry(), "tls_server_name": "r2.fleet.example"}
        conf = n1.conf()
        conf["peers"] = [entry]
        n1.config_path.write_text(yaml.safe_dump(conf))
        n1.replica.reload("test")
        await until(
            lambda: all(p["state"] == "synced" for p in n1.replica.syncer.state()),
            "synced with tls_server_name",
        )
    finally:
        await n2.stop()
        await n1.stop()


def _hello_first(port: int, ca: str, cert: dict | None = None) -> ssl.SSLSocket:
    """A client whose ClientHello is in the server's socket before the server's loop has
    even accepted the connection (sent without yielding to the loop)."""
    context = client_context(ca)
    if cert is not None:  # the Syncer port wants a peer's certificate
        context.load_cert_chain(cert["cert_file"], cert["key_file"])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    tls = context.wrap_socket(sock, server_hostname="127.0.0.1", do_handshake_on_connect=False)
    tls.setblocking(False)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()  # sends the ClientHello; the answer is not there yet
    tls.setblocking(True)
    tls.settimeout(5)
    return tls


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_client_hello_that_arrives_with_the_connection_is_not_lost(tmp_path, pki, loop):
    """Eventer, Syncer and HTTP ports, under both event loops. The TLS layer must be in
    place before the loop reads a byte: uvloop starts reading as soon as
    ``connection_made`` returns, so a ClientHello read before TLS was started from a task
    was lost and both sides waited until the handshake timeout (seen under load in CI)."""
    factory = asyncio.new_event_loop
    if loop == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop

    async def scenario():
        async with running_replica(tmp_path / loop, token="t", tls=pki["r1"]) as replica:
            ports = {
                "eventer": replica.eventer.port,
                "syncer": replica.syncer.port,
                "http": replica.http.port,
            }
            for name, port in ports.items():
                client = _hello_first(port, pki["ca"], pki["r2"] if name == "syncer" else None)
                try:
                    # The rest of the handshake off the loop, which serves it meanwhile.
                    await asyncio.wait_for(asyncio.to_thread(client.do_handshake), 8)
                    assert client.getpeercert(), name
                finally:
                    client.close()
            for component in (replica.eventer, replica.syncer, replica.http):
                assert "tls_handshake" not in component.rejected, component.rejected

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(scenario())


async def test_a_client_that_never_starts_the_handshake_is_counted_and_dropped(
    tmp_path, pki, caplog
):
    """A TCP client that sends nothing holds its place only for `init_timeout`; the
    refusal names the cause."""
    caps = {"eventer": {"admission": {"init_timeout": 0.5}}}
    async with running_replica(tmp_path / "r", token="t", tls=pki["r1"], **caps) as replica:
        reader, writer = await asyncio.open_connection("127.0.0.1", replica.eventer.port)
        try:
            # The server gives up: the connection is closed (EOF) within the timeout.
            assert await asyncio.wait_for(reader.read(), 5) == b""
        finally:
            writer.close()
        await until(lambda: replica.eventer.rejected.get("tls_handshake") == 1, "counted")
        assert replica.eventer._listener.admission.open_connections == 0  # place freed
        assert "no handshake within 0.5 s" in caplog.text


def _issue_client_cert(pki, name: str, *, days: tuple[float, float], eku) -> dict:
    """A certificate signed by the fleet's CA (`pki`'s "ca"), valid from now + days[0]
    to now + days[1], with the extended key usages `eku` (cryptography, not openssl:
    the openssl 3.0 command line cannot back-date a certificate)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = pki["dir"]
    ca_cert = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=days[0]))
        .not_valid_after(now + datetime.timedelta(days=days[1]))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (d / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return {"cert_file": str(d / f"{name}.pem"), "key_file": str(d / f"{name}.key")}


def _syncer_client(port: int, ca: str, cert: dict | None) -> str:
    """Handshake with the Syncer port as a peer presenting `cert` (None: none), then
    send a chatter frame and read. Returns what the client saw: "served" when the
    server answered or kept the connection, else the TLS alert or error it got."""
    context = client_context(ca)
    if cert is not None:
        context.load_cert_chain(cert["cert_file"], cert["key_file"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                # TLS 1.3: the server checks the client's certificate after the client
                # has finished; its verdict (an alert) arrives with the next read.
                tls.sendall(bytes([1, 1, 0]))  # a (malformed) frame: anything to answer
                return "served" if tls.recv(1) else "closed"
        except ssl.SSLError as e:
            return e.reason or str(e)
        except (ConnectionError, TimeoutError) as e:
            return type(e).__name__


async def test_the_syncer_listener_refuses_every_bad_client_certificate(tmp_path, pki):
    """Mutual TLS is mutual: the Syncer listener itself (not the connecting side)
    refuses a client without a certificate, with an expired or a not-yet-valid one,
    with one for servers only (extended key usage), or from another CA; each is counted
    as a ``tls_handshake`` refusal with its cause. A good client certificate passes."""
    from cryptography.x509.oid import ExtendedKeyUsageOID as Eku

    both = [Eku.SERVER_AUTH, Eku.CLIENT_AUTH]
    cases = [
        # (name, client certificate, the cause the server records)
        ("none", None, "PEER_DID_NOT_RETURN_A_CERTIFICATE"),
        (
            "expired",
            _issue_client_cert(pki, "expired", days=(-3, -1), eku=both),
            "certificate has expired",
        ),
        (
            "not-yet-valid",
            _issue_client_cert(pki, "future", days=(1, 3), eku=both),
            "certificate is not yet valid",
        ),
        (
            "server-only-eku",
            _issue_client_cert(pki, "server-only", days=(-1, 1), eku=[Eku.SERVER_AUTH]),
            "unsuitable certificate purpose",
        ),
        ("other-ca", pki["rogue"], "unable to get local issuer certificate"),
    ]
    async with running_replica(tmp_path / "r", token="t", tls=pki["r1"]) as replica:
        syncer = replica.syncer.server
        port = replica.syncer.port
        # Control: a certificate from the fleet's CA passes TLS; its (malformed) frame
        # then reaches the chatter layer, which refuses it as a bad frame.
        good = _issue_client_cert(pki, "good", days=(-1, 1), eku=both)
        await asyncio.to_thread(_syncer_client, port, pki["ca"], good)
        await until(lambda: syncer.rejected.get("bad_frame") == 1, "the control's frame read")
        assert "tls_handshake" not in syncer.rejected
        for n, (name, cert, cause) in enumerate(cases, start=1):
            seen = await asyncio.to_thread(_syncer_client, port, pki["ca"], cert)
            await until(lambda n=n: syncer.rejected.get("tls_handshake") == n, f"{name} counted")
            # Refused by the server's own check, with the cause; nothing was read.
            assert cause in syncer.rejections.last("tls_handshake"), name
            assert syncer.rejected["bad_frame"] == 1, name
            # asyncio drops a connection whose handshake failed without flushing the
            # TLS alert OpenSSL wrote: the client sees a bare close, the cause is only
            # in the server's log and metric.
            print(f"{name}: server: {syncer.rejections.last('tls_handshake')}; client: {seen}")
        assert not syncer.sessions()
        # The same count on /metrics.
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"https://127.0.0.1:{replica.http.port}/metrics", ssl=client_context(pki["ca"])
            )
            if replica.conf["tls"]["http"]
            else http.get(f"http://127.0.0.1:{replica.http.port}/metrics") as res,
        ):
            text = await res.text()
        pattern = r'eventfleet_rejected_total\{protocol="syncer",reason="tls_handshake"\} (\S+)'
        assert float(re.search(pattern, text).group(1)) == len(cases)
