"""A replica's HTTP server logs nothing for kubelet probes and Prometheus scrapes.

They come every few seconds from every kubelet and Prometheus: a line each would bury
the replica's own log (the operator's liveness endpoint is checked in
tests/unit/operator/test_op_probe_logs.py).
"""

from __future__ import annotations

import logging

import aiohttp

KUBELET = {"User-Agent": "kube-probe/1.34"}
PROMETHEUS = {"User-Agent": "Prometheus/3.5.0"}


async def test_probes_and_scrapes_leave_no_log_line(replica, caplog):
    caplog.set_level(logging.DEBUG)
    base = f"http://127.0.0.1:{replica.http.port}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        for path, headers in (
            ("/healthz", KUBELET),
            ("/readyz", KUBELET),
            ("/healthz", KUBELET),
            ("/metrics", PROMETHEUS),
        ):
            async with s.get(base + path, headers=headers) as resp:
                assert resp.status == 200, path
                await resp.read()
    noisy = [
        f"{r.name} {r.levelname}: {r.getMessage()}"
        for r in caplog.records
        if any(p in r.getMessage() for p in ("/healthz", "/readyz", "/metrics", "kube-probe"))
        or r.name.startswith("aiohttp.access")
    ]
    assert noisy == []
