"""Kubelet probes of the operator's liveness endpoint log nothing at INFO.

Kopf's own health server (the one ``--liveness`` starts, with aiohttp's default access
log) on a free loopback port, probed the way the kubelet probes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import aiohttp
import kopf
import pytest
from eventfleet_operator import probe_logs
from kopf._core.engines import probing  # the server kopf.run starts for --liveness

KUBELET = {"User-Agent": "kube-probe/1.34"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def kopf_health_server(endpoint: str):
    ready = asyncio.Event()
    task = asyncio.create_task(
        probing.health_reporter(
            endpoint,
            memo=kopf.Memo(),
            indices={},
            registry=kopf.OperatorRegistry(),
            settings=kopf.OperatorSettings(),
            ready_flag=ready,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _get(url: str, headers=None) -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(url, headers=headers) as resp,
    ):
        await resp.read()
        return resp.status


def _access_lines(caplog, level=logging.INFO):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == probe_logs.ACCESS_LOGGER and r.levelno >= level
    ]


@pytest.fixture
def access_filter():
    logger = logging.getLogger(probe_logs.ACCESS_LOGGER)
    before = list(logger.filters)
    yield
    logger.filters[:] = before


async def test_probes_are_not_logged_at_info_other_requests_are(caplog, access_filter):
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}/healthz"
    probe_logs.install(endpoint)
    caplog.set_level(logging.INFO)
    async with kopf_health_server(endpoint):
        for _ in range(3):
            assert await _get(endpoint, KUBELET) == 200
        assert await _get(endpoint) == 200  # same path, another client: still a probe
        assert _access_lines(caplog) == []
        # Anything else keeps its access line: it is not routine.
        assert await _get(f"http://127.0.0.1:{port}/other", KUBELET) == 404
        (line,) = _access_lines(caplog)
        assert '"GET /other HTTP/1.1" 404' in line


async def test_without_the_filter_every_probe_is_an_info_line(caplog, access_filter):
    # What the operator pod's log showed on a real cluster before the filter.
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}/healthz"
    caplog.set_level(logging.INFO)
    async with kopf_health_server(endpoint):
        assert await _get(endpoint, KUBELET) == 200
        (line,) = _access_lines(caplog)
        assert "GET /healthz" in line and "kube-probe/1.34" in line


async def test_probe_lines_are_kept_at_debug(caplog, access_filter):
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}/healthz"
    probe_logs.install(endpoint)
    caplog.set_level(logging.DEBUG)
    async with kopf_health_server(endpoint):
        assert await _get(endpoint, KUBELET) == 200
    assert _access_lines(caplog) == []
    (line,) = _access_lines(caplog, logging.DEBUG)
    assert "GET /healthz" in line


def test_a_failing_probe_keeps_its_info_line():
    record = logging.LogRecord(
        probe_logs.ACCESS_LOGGER, logging.INFO, __file__, 1, "probe", (), None
    )
    record.first_request_line = "GET /healthz HTTP/1.1"
    record.request_header = {"User-Agent": "kube-probe/1.34", "Referer": "-"}
    record.response_status = 500
    assert probe_logs.ProbeAccessFilter(["/healthz"]).filter(record)
    assert record.levelno == logging.INFO
