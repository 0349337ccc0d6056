"""Every expected failure of ``eventfleet register/query/watch`` is one line that says
what happened and what to do, never a traceback or an empty ``connection failed:``.

Against real replicas (a local fleet with ``--tls`` and one without) and real sockets.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest

from e2e.fleet_helpers import HOST, FleetProc, free_block, ports_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    """(TLS fleet base port, its CA file, plain fleet base port)."""
    root = tmp_path_factory.mktemp("cli-errors")
    tls_base = free_block(1)
    tls = FleetProc(root / "tls", 1, base_port=tls_base, extra_args=["--tls"]).start()
    plain_base = free_block(1)
    while plain_base == tls_base:  # the first fleet may not be listening yet
        plain_base = free_block(1)
    plain = FleetProc(root / "plain", 1, base_port=plain_base).start()
    try:
        asyncio.run(tls.wait_up())
        asyncio.run(plain.wait_up())
        yield tls_base, root / "tls" / "tls" / "ca.pem", plain_base
    finally:
        tls.stop()
        plain.stop()


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    d = tmp_path_factory.mktemp("other-ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", "o.key", "-out", "o.pem", "-days", "1", "-subj", "/CN=other"],
        cwd=d, check=True, capture_output=True,
    )  # fmt: skip
    return d / "o.pem"


def cli(*args: str) -> str:
    """Runs a query; asserts exit 1 and one line on stderr; returns that line."""
    result = subprocess.run(
        [sys.executable, "-m", "eventfleet_cli", "query", *args, "latest"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("eventfleet: ") and not line.rstrip().endswith(":"), line
    return line


def eventer(base: int) -> str:
    return f"{HOST}:{ports_of(base, 1)['eventer']}"


def test_plain_client_on_a_tls_replica_suggests_tls_ca(fleets):
    tls_base, _, _ = fleets
    line = cli("--eventer", eventer(tls_base), "--timeout", "5")
    assert "--tls-ca CA_FILE" in line


def test_a_ca_that_did_not_sign_the_certificate_is_named(fleets, other_ca):
    tls_base, _, _ = fleets
    line = cli("--eventer", eventer(tls_base), "--tls-ca", str(other_ca))
    assert f"not trusted by --tls-ca {other_ca}" in line and "ca.crt" in line


def test_a_name_the_certificate_does_not_carry_suggests_tls_server_name(fleets):
    tls_base, ca, _ = fleets
    line = cli("--eventer", eventer(tls_base), "--tls-ca", str(ca), "--tls-server-name", "x.test")
    assert "--tls-server-name" in line and "x.test" in line


def test_tls_client_on_a_plain_replica_names_the_cause_and_the_fix(fleets):
    # The plain replica either drops the ClientHello as a bad frame (reset) or waits
    # for the rest of a "frame" while the client waits for the ServerHello (timeout).
    _, ca, plain_base = fleets
    line = cli("--eventer", eventer(plain_base), "--tls-ca", str(ca), "--timeout", "2")
    assert "drop --tls-ca" in line
    assert "within 2 s" in line or "ConnectionResetError" in line or "reset" in line, line


def test_a_silent_listener_times_out_with_its_cause():
    with socket.socket() as s:
        s.bind((HOST, 0))
        s.listen()
        port = s.getsockname()[1]
        line = cli("--eventer", f"{HOST}:{port}", "--timeout", "1")
    assert f"no answer from {HOST}:{port} within 1 s (TCP connect, Eventer init)" in line


def test_refused_wrong_port_and_missing_files_are_named(fleets, tmp_path):
    tls_base, ca, _ = fleets
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        assert "nothing listens on" in cli("--eventer", f"{HOST}:{port}")
    http = f"{HOST}:{ports_of(tls_base, 1)['http']}"
    assert "does not speak Eventer" in cli("--eventer", http, "--tls-ca", str(ca))
    missing = tmp_path / "nope.pem"
    assert f"--tls-ca {missing}: no such file" in cli("--tls-ca", str(missing))
    token = tmp_path / "token"
    assert f"cannot read {token}" in cli("--eventer", eventer(tls_base), "--token-file", str(token))
