"""The HTTP port's pre-request budget (http/budget.py) on an in-process replica: a
connection that sends no request in time is closed and counted, an idle flood evicts
itself while a probe gets through, a connection that did send a request is a session
(kept across keep-alive, whatever the timeout), and with TLS the budget holds from
accept (no ClientHello is pending too)."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import socket

import aiohttp
import pytest

from tests import parts
from tests.conftest import running_replica
from tests.integration.test_tls import make_ca, make_cert

SHORT = 0.3  # the request timeout in these tests, seconds


def _shorten(replica, **limits) -> None:
    budget = replica.http.budget
    budget.timeout = SHORT
    budget.admission.limits = dataclasses.replace(budget.admission.limits, **limits)


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (EOF or reset) within 10 s."""
    try:
        return await asyncio.wait_for(reader.read(1), 10) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def test_a_connection_without_a_request_is_closed_and_counted(tmp_path):
    async with running_replica(tmp_path / "r") as replica:
        _shorten(replica)
        reader, writer = await asyncio.open_connection("127.0.0.1", replica.http.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
        assert await _closed_by_server(reader)
        writer.close()
        assert replica.http.rejected.get("init_timeout") == 1
        assert replica.http.budget.admission.open_connections == 0


async def test_an_idle_flood_evicts_itself_and_a_probe_gets_through(tmp_path):
    async with running_replica(tmp_path / "r") as replica:
        _shorten(replica, max_pending=8, max_pending_per_address=4)
        replica.http.budget.timeout = 60  # only eviction may close them here
        idle = [await asyncio.open_connection("127.0.0.1", replica.http.port) for _ in range(10)]
        # The server side accepts in order: once it has seen all ten, 6 were evicted.
        for _ in range(100):
            if replica.http.rejected.get("evicted_before_init", 0) >= 6:
                break
            await asyncio.sleep(0.05)
        assert replica.http.budget.admission.pending_connections == 4
        # The oldest went first.
        assert [await _closed_by_server(r) for r, _ in idle[:6]] == [True] * 6
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{replica.http.port}/readyz") as res,
        ):
            assert res.status == 200
        assert replica.http.rejected["evicted_before_init"] == 7  # one more for the probe
        assert replica.http.rejected.get("too_many_connections", 0) == 0
        for _, w in idle:
            w.close()


async def test_a_connection_that_sent_a_request_outlives_the_timeout(tmp_path):
    async with running_replica(tmp_path / "r") as replica:
        _shorten(replica)
        reader, writer = await asyncio.open_connection("127.0.0.1", replica.http.port)
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for _ in range(2):
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            await reader.readexactly(length)
            await asyncio.sleep(SHORT * 3)  # well past the request timeout: still open
        writer.close()
        assert "init_timeout" not in replica.http.rejected
        assert replica.http.budget.admission.session_connections <= 1


@pytest.fixture
def server_tls(tmp_path):
    if shutil.which("openssl") is None:
        parts.skip_missing("openssl", "no openssl on PATH", "apt-get install openssl")
    make_ca(tmp_path, "ca")
    return make_cert(tmp_path, "ca", "r1")


async def test_with_tls_a_connection_without_a_client_hello_is_pending(tmp_path, server_tls):
    async with running_replica(tmp_path / "r", tls=server_tls) as replica:
        _shorten(replica)
        with socket.create_connection(("127.0.0.1", replica.http.port)) as raw:
            raw.settimeout(10)
            for _ in range(100):
                if replica.http.budget.admission.pending_connections == 1:
                    break
                await asyncio.sleep(0.01)
            assert replica.http.budget.admission.pending_connections == 1
            assert await asyncio.to_thread(raw.recv, 1) == b""  # closed by the server
        assert replica.http.rejected.get("init_timeout") == 1
        for _ in range(100):
            if replica.http.budget.admission.open_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert replica.http.budget.admission.open_connections == 0
