"""A real Prometheus scrapes running replicas; metrics are read back through its HTTP API.

One test scrapes the README's local fleet (`eventfleet fleet`, real processes); another
scrapes in-process replicas (tests/conftest.py) and checks every dashboard query.
Prometheus is Debian's binary (scripts/tools/prometheus.sh), on 127.0.0.1 with a
temporary TSDB and a 1 s scrape interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import socket

import aiohttp
import pytest
import yaml
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import RegisterEvent

from e2e.fleet_helpers import FleetProc, free_block
from tests.conftest import running_replica
from tests.integration.test_http_promtool import prometheus_tool

pytestmark = pytest.mark.slow

DASHBOARD = pathlib.Path(__file__).resolve().parents[1] / "docs" / "grafana" / "eventfleet.json"
WAIT = 30.0  # bound of every wait below; a 1 s scrape interval needs a few seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def running_prometheus(
    tmp_path: pathlib.Path, targets: list[str], labels: dict[str, dict[str, str]] | None = None
):
    """Start `prometheus` scraping `targets`; yields its base URL; always stops it.

    `labels` adds labels to a target's series (e.g. the ``pod`` and ``namespace`` a
    ServiceMonitor would add)."""
    binary = prometheus_tool("prometheus")
    config = tmp_path / "prometheus.yml"
    groups = [{"targets": [t], "labels": (labels or {})[t]} for t in targets if t in (labels or {})]
    rest = [t for t in targets if t not in (labels or {})]
    groups += [{"targets": rest}] if rest else []
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [{"job_name": "eventfleet", "static_configs": groups}],
            }
        )
    )
    log = tmp_path / "prometheus.log"
    for _attempt in range(3):  # the free port may be taken between probe and bind
        port = free_port()
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        base = f"http://127.0.0.1:{port}"
        try:
            if await _wait_ready(proc, base):
                yield base
                return
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
    pytest.fail(f"prometheus did not start; its log:\n{log.read_text()[-3000:]}")


async def _wait_ready(proc, base: str) -> bool:
    """True once /-/ready answers; False if the process exited (e.g. port taken)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
        async with asyncio.timeout(WAIT):
            while proc.returncode is None:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with s.get(f"{base}/-/ready") as resp:
                        if resp.status == 200:
                            return True
                await asyncio.sleep(0.2)
    return False


async def api(session: aiohttp.ClientSession, base: str, path: str, **params) -> dict:
    async with session.get(f"{base}/api/v1/{path}", params=params) as resp:
        body = await resp.json()
    assert body["status"] == "success", body
    return body["data"]


async def wait_for(check, what: str):
    """Poll `check()` (async, returns a truthy value when done) within WAIT seconds."""
    last = None
    try:
        async with asyncio.timeout(WAIT):
            while True:
                last = await check()
                if last and last[0]:
                    return last[1]
                await asyncio.sleep(0.5)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}; last seen: {last}")


async def test_prometheus_scrapes_replicas_and_sees_registered_events(tmp_path):
    async with (
        running_replica(tmp_path / "r1", server_id=1) as r1,
        running_replica(tmp_path / "r2", server_id=2) as r2,
    ):
        targets = {f"127.0.0.1:{r.http.port}": r for r in (r1, r2)}
        async with (
            running_prometheus(tmp_path, sorted(targets)) as base,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
        ):

            async def all_up():
                active = (await api(s, base, "targets"))["activeTargets"]
                health = {t["labels"]["instance"]: t["health"] for t in active}
                errors = [t.get("lastError") for t in active if t.get("lastError")]
                return set(health) == set(targets) and set(health.values()) == {"up"}, (
                    health,
                    errors,
                )

            await wait_for(all_up, "both targets up")

            for replica, count in ((r1, 5), (r2, 3)):
                client = await connect("127.0.0.1", replica.eventer.port, "e2e/prometheus")
                try:
                    for i in range(count):
                        event = RegisterEvent(("e2e", str(i)), None, None)
                        assert await client.register([event], with_response=True)
                finally:
                    await client.close()

            query = 'sum by (instance) (eventfleet_events_registered_total{origin="client"})'

            async def counted():
                result = await api(s, base, "query", query=query)
                seen = {r["metric"]["instance"]: float(r["value"][1]) for r in result["result"]}
                expected = {f"127.0.0.1:{r1.http.port}": 5.0, f"127.0.0.1:{r2.http.port}": 3.0}
                return seen == expected, seen

            await wait_for(counted, f"{query} to reach 5 and 3")

            # Scrape-time figures arrive too (and the exposition passed Prometheus' parser).
            stored = await api(s, base, "query", query="sum(eventfleet_storage_events)")
            assert float(stored["result"][0]["value"][1]) == 8.0
            status = await api(s, base, "query", query='eventfleet_status{status="operational"}')
            assert sorted(float(r["value"][1]) for r in status["result"]) == [1.0, 1.0]

            # Every query of the published dashboard is valid PromQL for this Prometheus
            # (`api` asserts status success; a syntax error would be a 400).
            for expr in dashboard_queries():
                await api(s, base, "query", query=expr)
            # The panels that join series select the replicas' series (a wrong join is empty).
            ready = await api(s, base, "query", query=dashboard_expr("Replicas ready"))
            assert float(ready["result"][0]["value"][1]) == 2.0
            memory = await api(s, base, "query", query=dashboard_expr("Replica memory"))
            assert len(memory["result"]) >= 1


def dashboard_queries() -> list[str]:
    """Every PromQL query of the published dashboard, variables filled in."""
    dash = json.loads(DASHBOARD.read_text())
    return [_fill(t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def dashboard_expr(title: str) -> str:
    dash = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in dash["panels"] if p["title"] == title]
    return _fill(panel["targets"][0]["expr"])


def _fill(expr: str) -> str:
    # As Grafana sends them with "All" selected: the variables' allValue is ".*".
    return expr.replace("$namespace", ".*").replace("$pod", ".*").replace("$__rate_interval", "1m")


async def test_prometheus_scrapes_the_local_fleet(tmp_path):
    """The README's fleet, scraped for real: replication shows up in every replica's metrics."""
    fleet = FleetProc(tmp_path / "fleet", 3, base_port=free_block(3)).start()
    try:
        lines = await fleet.wait_up()
        targets = sorted(line["http"] for line in lines.values())
        first = lines["replica-1"] if "replica-1" in lines else next(iter(lines.values()))
        async with (
            running_prometheus(tmp_path, targets) as base,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
        ):

            async def all_up():
                active = (await api(s, base, "targets"))["activeTargets"]
                health = {t["labels"]["instance"]: t["health"] for t in active}
                return set(health) == set(targets) and set(health.values()) == {"up"}, health

            await wait_for(all_up, "three fleet targets up")
            host, port = first["eventer"].rsplit(":", 1)
            client = await connect(host, int(port), "e2e/prometheus-fleet")
            try:
                events = [RegisterEvent(("e2e", "fleet", str(i)), None, None) for i in range(4)]
                created = await client.register(events, with_response=True)
                assert created
            finally:
                await client.close()
            origin = str(created[-1].id.server)
            last = created[-1].id.instance

            async def replicated():
                # Each replica exports the last instance it holds per server id; the
                # replicas' own sync-state events may follow ours, hence ">=".
                q = f'eventfleet_last_event_instance{{server="{origin}"}}'
                result = await api(s, base, "query", query=q)
                seen = {r["metric"]["instance"]: float(r["value"][1]) for r in result["result"]}
                ok = set(seen) == set(targets) and min(seen.values(), default=0) >= last
                return ok, seen

            # Registered once, on one replica; Prometheus sees every replica hold them.
            await wait_for(replicated, f"server {origin} instance >= {last} on all 3 replicas")
    finally:
        fleet.stop()
