"""The dashboard's panels with real data: a local fleet under load, scraped by a real
Prometheus, every panel's own query answered, drawn and photographed in Chromium.

Grafana cannot run here (docs/observability.md says why), so the picture is not
Grafana's: e2e/dashboard_picture.py draws each panel of docs/grafana/eventfleet.json
(title, position, unit, legend) from Prometheus' answer to that panel's queries. What
this test asserts is about the dashboard and the replicas, not the drawing: while a
three-replica fleet takes writes, queries, a subscriber and a refused client, **every
panel's query returns data** (a renamed metric or a broken join leaves a panel empty).

``EVENTFLEET_UPDATE_SCREENSHOTS=1`` writes the picture to docs/img/dashboard-panels.png
(review, then commit); otherwise it goes to $EVENTFLEET_ARTIFACTS/dashboard and the run
checks that the committed picture is there and shown by docs/observability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import random
import time

import aiohttp
import pytest
from eventfleet_server.client.eventer import EventerInitError, connect
from eventfleet_server.common.model import (
    EventPayloadJson,
    QueryLatestParams,
    RegisterEvent,
)

from e2e import dashboard_picture
from e2e.browser import artifacts, png_size, run_driver, updating_pictures
from e2e.fleet_helpers import FleetProc, free_block
from e2e.jetstream.refclient import ensure_tools
from e2e.test_prometheus import DASHBOARD, api, running_prometheus, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC_PICTURE = ROOT / "docs" / "img" / "dashboard-panels.png"
SHOT_JS = pathlib.Path(__file__).parent / "browser_shot.js"
LOAD_SECONDS = 40  # long enough for every rate() window to hold several samples
RATE = "15s"  # $__rate_interval as Grafana picks it for a 1 s scrape (at least 4 scrapes)


async def load(eventers: list[tuple[str, int]], seconds: float) -> int:
    """Writes on two replicas, queries and a subscriber on the third, one refused client."""
    writers = [await connect(h, p, f"e2e/dashboard-{i}") for i, (h, p) in enumerate(eventers[:2])]
    got: list[int] = []
    watcher = await connect(
        *eventers[2],
        "e2e/dashboard-watch",
        subscriptions=[("dash", "*")],
        events_cb=lambda events: got.append(len(events)),
    )
    with contextlib.suppress(EventerInitError):  # the refused client: a rejection to show
        bad = await connect(*eventers[0], "e2e/dashboard-bad", client_token="not-the-token")
        await bad.close()
    rng = random.Random(7)
    written = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for i, client in enumerate(writers):
                batch = [
                    RegisterEvent(
                        ("dash", f"r{i}", f"t{rng.randrange(5)}"),
                        None,
                        EventPayloadJson(json.dumps({"v": rng.random()})),
                    )
                    for _ in range(rng.randrange(1, 40))
                ]
                assert await client.register(batch, with_response=True)
                written += len(batch)
            await watcher.query(QueryLatestParams(event_types=[("dash", "*")]))
            await asyncio.sleep(0.2)
    finally:
        for client in (*writers, watcher):
            await client.close()
    assert sum(got) > 0, "the subscriber was notified of nothing"
    return written


async def answers(session, base: str, start: float, end: float) -> dict[str, list]:
    """Every panel's series: each of its queries over [start, end], 1 s steps."""
    dashboard = json.loads(DASHBOARD.read_text())
    out: dict[str, list] = {}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        series = []
        for target in panel.get("targets", []):
            expr = dashboard_picture.fill(target["expr"], RATE)
            data = await api(session, base, "query_range", query=expr, start=start, end=end, step=1)
            series += dashboard_picture.series_of(data["result"], target.get("legendFormat"))
        out[panel["title"]] = series
    return out


async def test_every_dashboard_panel_has_data_from_a_fleet_under_load(tmp_path):
    ensure_tools()
    fleet = FleetProc(tmp_path / "fleet", 3, base_port=free_block(3)).start()
    try:
        up = await fleet.wait_up()
        names = sorted(up)
        targets = [up[n]["http"] for n in names]
        # The labels a ServiceMonitor adds, which the panels' legends and variables use.
        labels = {up[n]["http"]: {"namespace": "local", "pod": n} for n in names}
        eventers = [(h, int(p)) for h, p in (up[n]["eventer"].rsplit(":", 1) for n in names)]
        async with (
            running_prometheus(tmp_path, targets, labels) as base,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        ):

            async def all_up():
                active = (await api(s, base, "targets"))["activeTargets"]
                health = {t["labels"]["instance"]: t["health"] for t in active}
                return set(health) == set(targets) and set(health.values()) == {"up"}, health

            await wait_for(all_up, "three fleet targets up")
            start = time.time()
            written = await load(eventers, LOAD_SECONDS)
            await asyncio.sleep(3)  # the last scrapes of the load
            found = await answers(s, base, start, time.time())
    finally:
        fleet.stop()
    empty = sorted(title for title, series in found.items() if not series)
    assert not empty, f"dashboard panels without data: {empty}"

    dashboard = json.loads(DASHBOARD.read_text())
    caption = (
        f"docs/grafana/eventfleet.json drawn by e2e/dashboard_picture.py (not Grafana): "
        f"each panel's own queries answered by a real Prometheus scraping a local "
        f"3-replica fleet during {LOAD_SECONDS} s of load ({written} events written)"
    )
    page = tmp_path / "dashboard.html"
    page.write_text(dashboard_picture.page(dashboard, found, caption))
    out = DOC_PICTURE if updating_pictures() else artifacts("dashboard") / "dashboard-panels.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    shot = await run_driver(SHOT_JS, str(page), str(out), "1400")
    assert shot["ok"], shot
    assert png_size(out)[0] >= 1400, png_size(out)
    assert png_size(DOC_PICTURE)[0] >= 1400, "docs/img/dashboard-panels.png: rerun with update"
    assert "](img/dashboard-panels.png)" in (ROOT / "docs" / "observability.md").read_text()
