"""The replica HTTP contract: parsing, endpoint resolution, and a real HTTP round trip."""

from __future__ import annotations

import json
import re

import aiohttp.web
import pytest
from eventfleet_operator.replicas import (
    Endpoints,
    EventId,
    ReplicaClient,
    ReplicaStatus,
    ReplicaUnreachable,
)
from op_fakes import status_doc


def test_parse_status():
    doc = status_doc(
        2,
        {1: (1, 5), 2: (3, 9)},
        peers=[
            {
                "name": "demo-0",
                "server_id": 1,
                "state": "synced",
                "last_event_id": {"server": 1, "session": 1, "instance": 5},
                "lag_events": 0,
                "lag_seconds": 0.5,
            }
        ],
    )
    st = ReplicaStatus.parse(doc)
    assert st.own_last_id() == EventId(2, 3, 9)
    assert st.peers[0].last_event_id == EventId(1, 1, 5)
    assert EventId(2, 3, 9).covers(EventId(2, 3, 8))
    assert not EventId(2, 2, 10).covers(EventId(2, 3, 9))


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"version": 2}, "status.version"),
        ({"version": 1, "last_ids": {"1": {"server": 1}}}, "status.last_ids"),
        ({"version": 1, "peers": [{"state": "synced"}]}, "status.peers[0]"),
        ([], "status"),
    ],
)
def test_bad_status_names_the_field(doc, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        ReplicaStatus.parse(doc)


def test_endpoints_template_and_file(tmp_path):
    ep = Endpoints()
    assert ep.url("ns", "demo", 2, 23080) == "http://demo-2.demo-peers.ns.svc:23080"
    ep = Endpoints("http://127.0.0.1:{port}/{server_id}")
    assert ep.url("ns", "demo", 2, 9) == "http://127.0.0.1:9/3"
    mapping = tmp_path / "urls.json"
    ep = Endpoints(urls_file=str(mapping))
    assert ep.url("ns", "demo", 0, 1).startswith("http://demo-0")  # file absent: template
    mapping.write_text(json.dumps({"ns/demo-0": "http://127.0.0.1:1234/"}))
    assert ep.url("ns", "demo", 0, 1) == "http://127.0.0.1:1234"
    assert ep.url("ns", "demo", 1, 1).startswith("http://demo-1")


@pytest.fixture
async def replica_http():
    """A real HTTP server on 127.0.0.1 speaking the /status and /flush contract."""
    state = {"flushed": [], "auth": [], "status": status_doc(1, {1: (1, 4)}), "flush_code": 200}

    async def status(request):
        return aiohttp.web.json_response(state["status"])

    async def flush(request):
        state["flushed"].append(request.query.get("peer"))
        state["auth"].append(request.headers.get("Authorization"))
        return aiohttp.web.json_response(
            {"flushed": True, "last_ids": {}}, status=state["flush_code"]
        )

    app = aiohttp.web.Application()
    app.router.add_get("/status", status)
    app.router.add_post("/flush", flush)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        await runner.cleanup()


async def test_client_round_trip(replica_http):
    url, state = replica_http
    client = ReplicaClient(status_timeout=2, flush_timeout=2)
    try:
        st = await client.status(url)
        assert st.own_last_id() == EventId(1, 1, 4)
        await client.flush(url, "demo-1")
        assert state["flushed"] == ["demo-1"]
        # The replicas' admin route needs the fleet's credential: sent as a bearer token.
        await client.flush(url, "demo-1", "s3cret")
        assert state["auth"] == [None, "Bearer s3cret"]
        state["flush_code"] = 503
        with pytest.raises(ReplicaUnreachable, match="503"):
            await client.flush(url, "demo-1")
        state["status"] = {"version": 7}
        with pytest.raises(ReplicaUnreachable, match=r"status\.version"):
            await client.status(url)
    finally:
        await client.close()


async def test_client_unreachable_is_bounded():
    client = ReplicaClient(status_timeout=1)
    try:
        with pytest.raises(ReplicaUnreachable):
            await client.status("http://127.0.0.1:9")  # discard port: refused at once
    finally:
        await client.close()
