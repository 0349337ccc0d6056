"""Hat compatibility of the validation rule, side by side with the reference server.

The real hat-event 0.9.44 client registers and reads back, on the reference
hat-event 0.9.44 server (lmdb) and on an `eventfleet server` process started in the same
run, the event types and source timestamps the reference accepts: empty segments
(``('a', '')``, ``('x', '', 'y')``), the empty type, source timestamps before 1970. The
only refusals allowed are the shared rule's (``common/model.py``, docs/security.md):
a whole segment ``*`` or ``?`` in a type (it could not be queried exactly), a source
timestamp outside the years 1..9999 or with ``us`` outside 0..999999. A hypothesis
property test checks that on generated events against both servers.
"""

from __future__ import annotations

import asyncio
import calendar

import pytest
from eventfleet_server.common.model import SOURCE_TS_MAX_S, SOURCE_TS_MIN_S
from hat.drivers import net
from hat.event import common as hat
from hat.event.eventer import client as hat_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e.bench.servers import KINDS, start_server, stop_process_group, wait_operational

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

YEAR = 365 * 86400
FIXED_TYPES = [("a", ""), ("x", "", "y"), ("",), ("", ""), (), ("a", "b*"), ("?a", "*b", "c?")]
FIXED_TIMESTAMPS = [
    None,
    hat.Timestamp(-1, 0),  # 1969-12-31T23:59:59Z
    hat.Timestamp(-50 * YEAR, 123456),  # 1920
    hat.Timestamp(SOURCE_TS_MIN_S, 0),  # 0001-01-01T00:00:00Z
    hat.Timestamp(0, 0),
    hat.Timestamp(SOURCE_TS_MAX_S, 999_999),  # 9999-12-31T23:59:59.999999Z
]


class Side:
    """One server process and a connected hat-event client, on `loop`."""

    def __init__(self, kind: str, workdir, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.server = start_server(KINDS[kind], workdir, kind)
        loop.run_until_complete(wait_operational(self.server))
        self.client = loop.run_until_complete(hat_client.connect(self.server.addr, "compat"))

    def register(self, events: list[hat.RegisterEvent]) -> list[hat.Event] | None:
        return self.run(self.client.register(events, True))

    def latest(self, event_type: tuple[str, ...]) -> list[hat.Event]:
        result = self.run(self.client.query(hat.QueryLatestParams([event_type])))
        return list(result.events)

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.client.async_close())
        finally:
            stop_process_group(self.server.proc)


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    loop = asyncio.new_event_loop()
    workdir = tmp_path_factory.mktemp("compat")
    started: list[Side] = []
    try:
        for kind in ("reference", "eventfleet-full"):
            started.append(Side(kind, workdir, loop))
        yield started[0], started[1]
    finally:
        for side in started:
            side.close()
        loop.close()


def same_event(a: hat.Event, b: hat.RegisterEvent) -> bool:
    return (a.type, a.source_timestamp, a.payload) == (b.type, b.source_timestamp, b.payload)


def refused_by_rule(event: hat.RegisterEvent) -> bool:
    """The shared validation rule's refusals (docs/security.md, "Validation")."""
    t = event.source_timestamp
    return any(s in ("*", "?") for s in event.type) or (
        t is not None and not (SOURCE_TS_MIN_S <= t.s <= SOURCE_TS_MAX_S and 0 <= t.us <= 999_999)
    )


def check_side_by_side(sides, events: list[hat.RegisterEvent]) -> None:
    reference, ours = sides
    theirs = reference.register(events)
    assert theirs is not None, f"the reference refused {events!r}"
    created = ours.register(events)
    if any(refused_by_rule(e) for e in events):
        assert created is None, f"accepted what the rule refuses: {events!r}"
        return
    assert created is not None, f"refused what the reference accepts: {events!r}"
    assert [e.type for e in created] == [e.type for e in events]
    # Read back: the latest event of each type is this batch's last of that type.
    last = {e.type: e for e in events}
    for event_type, expected in last.items():
        for side in sides:
            held = side.latest(event_type)
            assert len(held) == 1 and same_event(held[0], expected), (
                side.server.kind.label,
                expected,
                held,
            )


def test_fixed_types_and_timestamps_register_and_read_back(sides):
    for i, event_type in enumerate(FIXED_TYPES):
        for j, ts in enumerate(FIXED_TIMESTAMPS):
            payload = hat.EventPayloadJson({"type": i, "ts": j})
            check_side_by_side(sides, [hat.RegisterEvent(event_type, ts, payload)])
    # Timeseries by source timestamp reach before 1970 on our side too.
    ours = sides[1]
    result = ours.run(
        ours.client.query(
            hat.QueryTimeseriesParams(
                event_types=[("x", "", "y")],
                source_t_to=hat.Timestamp(0, 0),
                order_by=hat.OrderBy.SOURCE_TIMESTAMP,
                order=hat.Order.ASCENDING,
            )
        )
    )
    assert [e.source_timestamp for e in result.events] == [
        hat.Timestamp(SOURCE_TS_MIN_S, 0),
        hat.Timestamp(-50 * YEAR, 123456),
        hat.Timestamp(-1, 0),
        hat.Timestamp(0, 0),
    ]


def test_only_the_rule_is_refused(sides):
    for event in [
        hat.RegisterEvent(("a", "*"), None, None),
        hat.RegisterEvent(("?",), None, None),
        hat.RegisterEvent(("a",), hat.Timestamp(SOURCE_TS_MIN_S - 1, 0), None),
        hat.RegisterEvent(("a",), hat.Timestamp(SOURCE_TS_MAX_S + 1, 0), None),
        hat.RegisterEvent(("a",), hat.Timestamp(0, 1_000_000), None),
    ]:
        check_side_by_side(sides, [event])


segments = st.one_of(
    st.sampled_from(["", "a", "b", "*", "?", "a*", "?b", "event", " ", "/", "%"]),
    st.text(max_size=12),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
payloads = st.one_of(
    st.none(),
    json_values.map(hat.EventPayloadJson),
    st.builds(hat.EventPayloadBinary, st.text(max_size=8), st.binary(max_size=32)),
)
seconds = st.one_of(
    st.integers(SOURCE_TS_MIN_S, SOURCE_TS_MAX_S),
    st.integers(-200 * YEAR, 0),
    st.integers(-(2**62), 2**62),  # the reference keeps any int64 (s + 2^63)
)
timestamps = st.one_of(
    st.none(),
    st.builds(hat.Timestamp, seconds, st.integers(0, 999_999)),
    st.builds(hat.Timestamp, seconds, st.integers(0, 2**32 - 1)),
)
events = st.builds(
    hat.RegisterEvent,
    st.lists(segments, max_size=5).map(tuple).filter(lambda t: t[:1] != ("event",)),
    timestamps,
    payloads,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(events, min_size=1, max_size=4))
def test_property_everything_the_reference_accepts_is_accepted_or_refused_by_the_rule(sides, batch):
    check_side_by_side(sides, batch)


async def test_bus_topics_with_empty_segments_and_old_timestamps_are_stored(tmp_path):
    """The Event BUS maps ``/a//b/`` to ``('a', '', 'b', '')`` and ``/`` to ``('',)``
    (docs/bus.md); the same rule now stores them, with a producer timestamp before 1970."""
    from e2e.bus_client import BusClient
    from e2e.test_bus import running

    async with running(tmp_path) as replica, BusClient(replica.ports["bus"]) as bus:
        client = await hat_client.connect(
            net.TcpAddress(*replica.eventer), "compat", subscriptions=[("*",)]
        )
        try:
            for topic in ("/a//b/", "/"):
                await bus.publish(topic, {"topic": topic}, timestamp="1960-01-01T00:00:00Z")
            expected = {("a", "", "b", ""): "/a//b/", ("",): "/"}
            async with asyncio.timeout(30):
                while True:
                    result = await client.query(hat.QueryLatestParams(list(expected)))
                    if len(result.events) == 2:
                        break
                    await asyncio.sleep(0.1)
            in_1960 = hat.Timestamp(calendar.timegm((1960, 1, 1, 0, 0, 0)), 0)
            for event in result.events:
                assert event.source_timestamp == in_1960
                assert expected[event.type] in repr(event.payload)
        finally:
            await client.async_close()
