"""``GET /export`` on a real replica: content, order, window bounds, resume, errors, token,
the concurrency cap, and the Spark job's reader of it (`eventfleet_spark.export_io`).

The blocking reader runs in a thread (`asyncio.to_thread`) so the replica, on the
test's event loop, keeps serving it.
"""

from __future__ import annotations

import asyncio
import http.server
import io
import threading

import aiohttp
import pytest

from tests import parts

pa = parts.require_module("spark", "pyarrow")

from eventfleet_server.common.model import (  # noqa: E402
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Order,
    OrderBy,
    QueryTimeseriesParams,
    timestamp_from_us,
    timestamp_to_us,
)
from eventfleet_spark.endpoints import Endpoint  # noqa: E402
from eventfleet_spark.export_io import (  # noqa: E402
    ExportReadError,
    ExportUnavailable,
    read_span_arrow,
)

from tests.conftest import running_replica  # noqa: E402

T0 = 1_700_000_000_000_000
N = 2_500  # one 20k-row page on the route; `test_pages_join_seamlessly` pages by 7


def make_events(n: int = N) -> list[Event]:
    events = []
    for i in range(n):
        if i % 4 == 0:
            payload = EventPayloadJson(f'{{"value": {i}.5, "s": "x"}}')
        elif i % 4 == 1:
            payload = EventPayloadBinary("raw", bytes([i % 256, 0, 1]))
        elif i % 4 == 2:
            payload = None
        else:
            payload = EventPayloadJson("" if i % 8 == 3 else '"é ✓ \\n"')
        events.append(
            Event(
                EventId(5 + i % 3, 1 + i // 9, 1 + i // 3),
                ("plant", f"line{i % 4}", "a/b") if i % 5 else ("alarm",),
                # several events share a timestamp: order falls to the id
                timestamp_from_us(T0 + (i // 2) * 1000),
                timestamp_from_us(T0 - i) if i % 7 == 0 else None,
                payload,
            )
        )
    return events


async def eventer_events(replica, lo: int, hi: int) -> list[Event]:
    params = QueryTimeseriesParams(
        t_from=timestamp_from_us(lo),
        t_to=timestamp_from_us(hi - 1),
        order=Order.ASCENDING,
        order_by=OrderBy.TIMESTAMP,
        max_results=10_000,
    )
    out = []
    while True:
        result = await replica.storage.query(params)
        out += result.events
        if not result.more_follows:
            return out
        params = params._replace(last_event_id=result.events[-1].id)


def rows_of(events: list[Event]) -> list[dict]:
    """The export's columns of `events`, as the Arrow rows should read."""
    out = []
    for e in events:
        p = e.payload
        out.append(
            {
                "server": e.id.server,
                "session": e.id.session,
                "instance": e.id.instance,
                "type": list(e.type),
                "timestamp": timestamp_to_us(e.timestamp),
                "source_timestamp": timestamp_to_us(e.source_timestamp)
                if e.source_timestamp
                else None,
                "payload_kind": "json"
                if isinstance(p, EventPayloadJson)
                else "binary"
                if p
                else "none",
                "payload_json": p.data if isinstance(p, EventPayloadJson) else None,
                "payload_binary_type": p.type if isinstance(p, EventPayloadBinary) else None,
                "payload_binary": p.data if isinstance(p, EventPayloadBinary) else None,
            }
        )
    return out


def table_rows(table) -> list[dict]:
    table = table.set_column(
        table.schema.get_field_index("timestamp"),
        "timestamp",
        table.column("timestamp").cast(pa.int64()),
    ).set_column(
        table.schema.get_field_index("source_timestamp"),
        "source_timestamp",
        table.column("source_timestamp").cast(pa.int64()),
    )
    return [{k: v for k, v in r.items() if k != "type_id"} for r in table.to_pylist()]


@pytest.fixture
async def stocked(tmp_path):
    async with running_replica(tmp_path / "r", token="tok") as replica:
        events = make_events()
        await replica.engine.merge(events)
        yield replica, events


async def get(replica, query: str, token: str | None = "tok"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{replica.http.port}/export?{query}"
        async with s.get(url, headers=headers) as resp:
            return resp.status, resp.headers, await resp.read()


def read_stream(data: bytes):
    reader = pa.ipc.open_stream(io.BytesIO(data))
    batches, metadata = [], None
    while True:
        try:
            batch, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema), metadata


async def test_export_is_the_eventer_timeseries_of_the_window(stocked):
    replica, events = stocked
    lo, hi = T0 + 100_000, T0 + 900_000  # cuts through groups of equal timestamps
    status, headers, data = await get(replica, f"from={lo}&to={hi}")
    assert status == 200
    assert headers["Content-Type"] == "application/vnd.apache.arrow.stream"
    table, end = read_stream(data)
    want = await eventer_events(replica, lo, hi)
    assert 0 < len(want) < len(events)
    assert table_rows(table) == rows_of(want)
    assert end == {b"eventfleet.end": str(len(want)).encode()}
    # type ids are the replica's, one per distinct type
    ids = dict(
        zip(
            table.column("type_id").to_pylist(),
            map(tuple, table.column("type").to_pylist()),
            strict=True,
        )
    )
    assert len(set(ids.values())) == len(ids)


async def test_pages_join_seamlessly(stocked):
    """Small pages (keyset paging through groups of equal timestamps) give the same
    stream content as one page; each page is one record batch."""
    from eventfleet_server.storage import bulk

    replica, events = stocked
    chunks = [c async for c in bulk.export_stream(replica.storage, T0, T0 + 10**9, page_rows=7)]
    table, end = read_stream(b"".join(chunks))
    assert table_rows(table) == rows_of(await eventer_events(replica, T0, T0 + 10**9))
    assert end == {b"eventfleet.end": str(len(events)).encode()}
    assert len(table.to_batches()) == -(-len(events) // 7)


async def test_after_resumes_strictly_after_the_key(stocked):
    replica, _ = stocked
    lo, hi = T0, T0 + 10**9
    want = rows_of(await eventer_events(replica, lo, hi))
    k = want[100]
    after = f"{k['timestamp']},{k['server']},{k['session']},{k['instance']}"
    status, _, data = await get(replica, f"from={lo}&to={hi}&after={after}")
    assert status == 200
    assert table_rows(read_stream(data)[0]) == want[101:]


async def test_empty_window_is_a_valid_stream(stocked):
    replica, _ = stocked
    status, _, data = await get(replica, "from=0&to=1000")
    table, end = read_stream(data)
    assert status == 200 and table.num_rows == 0 and end == {b"eventfleet.end": b"0"}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("to=5", "parameter from is required"),
        ("from=1", "parameter to is required"),
        ("from=1.5&to=9", "parameter from='1.5' is not an integer"),
        ("from=9&to=9", "parameter to=9 must be greater than from=9"),
        ("from=1&to=99999999999999999999", "parameter to='99999999999999999999' is out of"),
        ("from=1&to=9&after=1,2,3", "parameter after='1,2,3' is not"),
        ("from=1&to=9&after=1,2,x,4", "parameter after='x' is not an integer"),
        ("from=1&to=9&limit=4", "unknown parameter 'limit'"),
    ],
)
async def test_bad_parameters_are_named(stocked, query, message):
    replica, _ = stocked
    status, _, body = await get(replica, query)
    assert status == 400
    assert message in body.decode()


async def test_token_is_required_when_configured(stocked):
    replica, _ = stocked
    status, headers, body = await get(replica, "from=0&to=1", token=None)
    assert (status, headers["WWW-Authenticate"]) == (401, "Bearer")
    assert "a token is required" in body.decode()
    status, _, body = await get(replica, "from=0&to=1", token="nope")
    assert status == 401 and "invalid client token" in body.decode() and "nope" not in body.decode()
    with pytest.raises(ExportReadError, match="401"):
        await asyncio.to_thread(_read_all, replica, token="nope")


async def test_too_many_exports_are_refused_then_served(stocked):
    replica, events = stocked
    route = replica.http.export
    route.running = route._max  # every slot taken
    status, headers, body = await get(replica, "from=0&to=1")
    assert (status, headers["Retry-After"]) == (429, "1")
    assert "exports already running" in body.decode()
    # The reader waits (Retry-After) and gets its export once a slot frees.
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, setattr, route, "running", 0)
    pages = await asyncio.to_thread(_read_all, replica)
    assert sum(len(p) for p in pages) == len(events)
    # The reader returns at the end batch; the handler frees its slot right after.
    for _ in range(100):
        if route.running == 0:
            break
        await asyncio.sleep(0.05)
    assert route.running == 0


def _read_all(replica, token="tok", **kw):
    return list(
        read_span_arrow(Endpoint("127.0.0.1", replica.http.port), T0, T0 + 10**9, token=token, **kw)
    )


async def test_reader_types_and_type_filter(stocked):
    replica, _ = stocked
    pages = await asyncio.to_thread(_read_all, replica)
    got = [t for p in pages for t in p.types]
    want = [e.type for e in await eventer_events(replica, T0, T0 + 10**9)]
    assert got == want
    filtered = await asyncio.to_thread(_read_all, replica, event_types=[("plant", "?", "a/b")])
    rows = [t for p in filtered for t in p.types]
    assert rows == [t for t in want if t[0] == "plant"] and rows


async def test_replica_without_export_is_unavailable(stocked):
    replica, _ = stocked
    replica.http.unmount_export()
    with pytest.raises(ExportUnavailable, match="404"):
        await asyncio.to_thread(_read_all, replica)


async def test_truncated_stream_is_an_error(stocked):
    """A stream cut after the 200 status line (no end batch) never reads as complete."""
    replica, _ = stocked
    status, _, data = await get(replica, f"from={T0}&to={T0 + 10**9}")
    assert status == 200
    table, _ = read_stream(data)
    # The same bytes without the end batch and end-of-stream mark: what a reader sees
    # when the replica fails mid-stream. Served by a stand-in (a real replica cannot
    # be made to fail at that point from outside).
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        for b in table.to_batches():
            w.write_batch(b)
    cut = sink.getvalue().to_pybytes()[:-8]  # drop the end-of-stream mark

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(cut)))
            self.end_headers()
            self.wfile.write(cut)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(ExportReadError, match="ended without its end marker"):
            await asyncio.to_thread(
                lambda: list(read_span_arrow(Endpoint("127.0.0.1", server.server_port), 0, 10))
            )
    finally:
        server.shutdown()
        server.server_close()
