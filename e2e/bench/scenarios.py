"""Workloads, all driven through the real hat-event 0.9.44 Eventer client."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

from hat.event import common, eventer

from e2e.bench.servers import ServerProcess

PERSIST_TIMEOUT = 30.0  # the reference flushes every 1 s; a commit is well within this
_tags = itertools.count(1)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def connect(server: ServerProcess, name: str, **kwargs) -> eventer.Client:
    return await asyncio.wait_for(eventer.connect(server.addr, name, **kwargs), timeout=10.0)


async def close_all(clients: list[eventer.Client]) -> None:
    for c in clients:
        with contextlib.suppress(Exception):
            await c.async_close()


class PersistMarker:
    """Waits until everything registered so far is persisted on a server.

    A client subscribed with persisted=true to a private marker type registers one marker
    event and waits for its persisted notification. Both servers persist in registration
    order, so once the marker is persisted every earlier event is too.
    """

    def __init__(self, server: ServerProcess):
        self.server = server
        self.tag = f"m{next(_tags)}"
        self.client: eventer.Client | None = None
        self._waiters: dict[int, asyncio.Future] = {}
        self._seq = itertools.count()

    async def open(self) -> None:
        self.client = await connect(
            self.server,
            "bench-marker",
            subscriptions=[("bench", "marker", self.tag)],
            persisted=True,
            events_cb=self._on_events,
        )

    def _on_events(self, _client, events) -> None:
        for e in events:
            fut = self._waiters.get(e.payload.data["seq"]) if e.payload else None
            if fut and not fut.done():
                fut.set_result(None)

    async def wait_persisted(self) -> float:
        """Register a marker, wait for its persisted notification; returns seconds waited."""
        assert self.client
        seq = next(self._seq)
        fut = asyncio.get_running_loop().create_future()
        self._waiters[seq] = fut
        t0 = time.perf_counter()
        ev = common.RegisterEvent(
            type=("bench", "marker", self.tag),
            source_timestamp=None,
            payload=common.EventPayloadJson({"seq": seq}),
        )
        try:
            res = await self.client.register([ev], with_response=True)
            if res is None:
                raise RuntimeError("marker registration failed")
            await asyncio.wait_for(fut, PERSIST_TIMEOUT)
        finally:
            self._waiters.pop(seq, None)
        return time.perf_counter() - t0

    async def close(self) -> None:
        if self.client:
            await close_all([self.client])


# --- register throughput and CPU per event --------------------------------------------


@dataclass
class RegisterResult:
    batch: int
    inflight: int
    clients: int
    events: int
    seconds: float
    events_per_s: float
    cpu_us_per_event: float
    main_thread_cpu_us_per_event: float  # event loop; the rest is other threads (storage)
    persist_wait_s: float
    # The kernel's share of cpu_us_per_event (stime: socket reads and writes — on
    # loopback a send runs the receiver's TCP path too —, epoll, file writes).
    sys_cpu_us_per_event: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def _build_requests(total: int, batch: int, tag: str) -> list[list[common.RegisterEvent]]:
    now = common.now()
    reqs = []
    for start in range(0, total, batch):
        reqs.append(
            [
                common.RegisterEvent(
                    type=("bench", "reg", tag, str(i % 100)),
                    source_timestamp=now,
                    payload=common.EventPayloadJson({"seq": i, "value": i * 0.5}),
                )
                for i in range(start, min(start + batch, total))
            ]
        )
    return reqs


async def run_register(
    server: ServerProcess,
    marker: PersistMarker,
    *,
    batch: int,
    inflight: int,
    clients: int,
    events: int,
) -> RegisterResult:
    """`clients` connections, each with `inflight` requests outstanding (register with
    response), `events` events in all. Server CPU is measured from the first request until
    the last event is persisted (so the reference's deferred lmdb flush is counted)."""
    tag = f"r{next(_tags)}"
    reqs = _build_requests(events, batch, tag)
    per_client = [reqs[i::clients] for i in range(clients)]
    conns = [await connect(server, f"bench-reg-{i}") for i in range(clients)]
    failures = 0

    async def worker(conn: eventer.Client, queue: list, pos: itertools.count) -> None:
        nonlocal failures
        while True:
            i = next(pos)
            if i >= len(queue):
                return
            res = await conn.register(queue[i], with_response=True)
            if res is None:
                failures += 1

    try:
        await marker.wait_persisted()  # start from a quiet, fully persisted server
        s0 = server.stat()
        t0 = time.perf_counter()
        tasks = []
        for conn, queue in zip(conns, per_client, strict=True):
            pos = itertools.count()
            tasks += [worker(conn, queue, pos) for _ in range(inflight)]
        await asyncio.gather(*tasks)
        t1 = time.perf_counter()
        persist_wait = await marker.wait_persisted()
        s1 = server.stat()
    finally:
        await close_all(conns)
    if failures:
        raise RuntimeError(f"{failures} register requests answered with failure")
    secs = t1 - t0
    return RegisterResult(
        batch=batch,
        inflight=inflight,
        clients=clients,
        events=events,
        seconds=secs,
        events_per_s=events / secs,
        cpu_us_per_event=(s1.cpu_s - s0.cpu_s) * 1e6 / events,
        main_thread_cpu_us_per_event=(s1.main_cpu_s - s0.main_cpu_s) * 1e6 / events,
        persist_wait_s=persist_wait,
        sys_cpu_us_per_event=(s1.sys_cpu_s - s0.sys_cpu_s) * 1e6 / events,
    )


def median_register(runs: list[dict]) -> dict:
    """Median of each figure over repeated runs of one scenario; the runs are kept."""
    out = dict(runs[0])
    for f in (
        "seconds",
        "events_per_s",
        "cpu_us_per_event",
        "main_thread_cpu_us_per_event",
        "sys_cpu_us_per_event",
    ):
        out[f] = percentile([r.get(f, 0.0) for r in runs], 50)
    out["persist_wait_s"] = max(r["persist_wait_s"] for r in runs)
    out["runs"] = len(runs)
    if len(runs) > 1:
        out["all_runs"] = runs
    return out


# --- notify latency ---------------------------------------------------------------------


@dataclass
class LatencyResult:
    persisted: bool
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def to_json(self) -> dict:
        return asdict(self)


async def run_notify(
    server: ServerProcess, *, persisted: bool, count: int, interval: float
) -> LatencyResult:
    """One client registers single events (with response, `interval` apart); another,
    subscribed with `persisted`, receives them. Latency = receive time - send time, both
    taken in this process (perf_counter), matched by a sequence number in the payload."""
    tag = f"n{next(_tags)}"
    sent: dict[int, float] = {}
    lat: list[float] = []
    done = asyncio.Event()

    def on_events(_client, evs) -> None:
        now = time.perf_counter()
        for e in evs:
            seq = e.payload.data["seq"]
            lat.append(now - sent[seq])
        if len(lat) >= count:
            done.set()

    recv = await connect(
        server,
        "bench-notify-recv",
        subscriptions=[("bench", "lat", tag, "*")],
        persisted=persisted,
        events_cb=on_events,
    )
    send = await connect(server, "bench-notify-send")
    try:
        for i in range(count):
            ev = common.RegisterEvent(
                type=("bench", "lat", tag, str(i % 10)),
                source_timestamp=common.now(),
                payload=common.EventPayloadJson({"seq": i}),
            )
            sent[i] = time.perf_counter()
            if await send.register([ev], with_response=True) is None:
                raise RuntimeError("register failed")
            if interval:
                await asyncio.sleep(interval)
        await asyncio.wait_for(done.wait(), PERSIST_TIMEOUT)
    finally:
        await close_all([send, recv])
    ms = [x * 1e3 for x in lat]
    return LatencyResult(persisted, len(ms), percentile(ms, 50), percentile(ms, 99), max(ms))


# --- queries ----------------------------------------------------------------------------


@dataclass
class Prefill:
    stored: int
    seconds: float
    window: tuple[common.Timestamp, common.Timestamp] = field(repr=False)


async def prefill(
    server: ServerProcess, marker: PersistMarker, *, stored: int, types: int = 1000
) -> Prefill:
    """Register `stored` events over `types` event types (bench/q/<n>), then wait until
    they are persisted. Returns a time window in the middle holding >= 1000 events."""
    batch = 1000
    conn = await connect(server, "bench-prefill")
    stamps: list[common.Timestamp] = []
    t0 = time.perf_counter()
    pos = itertools.count()
    n_req = math.ceil(stored / batch)

    async def worker() -> None:
        while True:
            r = next(pos)
            if r >= n_req:
                return
            now = common.now()
            evs = [
                common.RegisterEvent(
                    type=("bench", "q", str(i % types)),
                    source_timestamp=now,
                    payload=common.EventPayloadJson({"seq": i, "value": i * 0.5}),
                )
                for i in range(r * batch, min((r + 1) * batch, stored))
            ]
            res = await conn.register(evs, with_response=True)
            if res is None:
                raise RuntimeError("prefill register failed")
            stamps.extend(e.timestamp for e in res)

    try:
        await asyncio.gather(*(worker() for _ in range(4)))
        await marker.wait_persisted()
    finally:
        await close_all([conn])
    stamps.sort()
    span = min(1000, len(stamps))
    mid = max(0, (len(stamps) - span) // 2)
    window = (stamps[mid], stamps[mid + span - 1])
    return Prefill(stored, time.perf_counter() - t0, window)


@dataclass
class QueryResult:
    name: str
    samples: int
    returned: int
    p50_ms: float
    p99_ms: float
    server_cpu_ms: float  # server CPU per timed run (all its queries), from /proc

    def to_json(self) -> dict:
        return asdict(self)


QUERY_NAMES = [
    ("latest", "latest, 1000 types"),
    ("latest_list", "latest, explicit list of 1000 types"),
    ("server", "server, 1000 events"),
    ("ts_bounded", "timeseries 1000, time-bounded, 1 query"),
    ("ts_bounded_paged", "timeseries 1000, time-bounded, pages of 100"),
    ("ts_unbounded", "timeseries 1000, unbounded, 1 query"),
    ("ts_unbounded_paged", "timeseries 1000, unbounded, pages of 100"),
    # informational (no target): one sparse type, no time bound -- the reference filters
    # types after reading its single timeseries partition, so it scans
    ("ts_one_type", "timeseries of 1 type (of 1000), unbounded, newest 100"),
]


def query_fns(conn: eventer.Client, pre: Prefill) -> dict[str, Callable[[], Awaitable[int]]]:
    t_from, t_to = pre.window

    async def latest() -> int:
        res = await conn.query(common.QueryLatestParams(event_types=[("bench", "q", "*")]))
        return len(res.events)

    # Every type the prefill registered, named one by one (no wildcard).
    type_list = [("bench", "q", str(i)) for i in range(1000)]

    async def latest_list() -> int:
        res = await conn.query(common.QueryLatestParams(event_types=type_list))
        return len(res.events)

    async def server() -> int:
        # Both servers run with server id 1 and hold only their own events.
        params = common.QueryServerParams(server_id=1, persisted=True, max_results=1000)
        res = await conn.query(params)
        return len(res.events)

    async def single(bounded: bool) -> int:
        params = common.QueryTimeseriesParams(
            t_from=t_from if bounded else None,
            t_to=t_to if bounded else None,
            max_results=1000,
        )
        res = await conn.query(params)
        return len(res.events)

    async def paged(bounded: bool) -> int:
        got = 0
        last_id = None
        for _ in range(10):  # 10 pages of 100: bounded loop
            params = common.QueryTimeseriesParams(
                t_from=t_from if bounded else None,
                t_to=t_to if bounded else None,
                max_results=100,
                last_event_id=last_id,
            )
            res = await conn.query(params)
            events = list(res.events)
            got += len(events)
            if not events or not res.more_follows:
                break
            last_id = events[-1].id
        return got

    async def one_type() -> int:
        params = common.QueryTimeseriesParams(event_types=[("bench", "q", "7")], max_results=100)
        res = await conn.query(params)
        return len(res.events)

    return {
        "ts_one_type": one_type,
        "latest": latest,
        "latest_list": latest_list,
        "server": server,
        "ts_bounded": lambda: single(True),
        "ts_bounded_paged": lambda: paged(True),
        "ts_unbounded": lambda: single(False),
        "ts_unbounded_paged": lambda: paged(False),
    }


async def measure_query(
    server: ServerProcess,
    name: str,
    fn: Callable[[], Awaitable[int]],
    *,
    reps: int,
    budget: float,
    warmup: int = 1,
) -> QueryResult:
    """Up to `reps` timed runs after `warmup`, stopping early once `budget` seconds are
    spent (at least 3 timed runs). Latency is end to end (includes the client decoding
    the answer); server CPU per run is measured separately."""
    returned = 0
    for _ in range(warmup):
        returned = await fn()
    times: list[float] = []
    s0 = server.stat()
    start = time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        returned = await fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 3 and time.perf_counter() - start > budget:
            break
    s1 = server.stat()
    return QueryResult(
        name,
        len(times),
        returned,
        percentile(times, 50),
        percentile(times, 99),
        (s1.cpu_s - s0.cpu_s) * 1e3 / len(times),
    )
