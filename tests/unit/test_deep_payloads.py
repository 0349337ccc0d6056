"""JSON payloads nested deeper than Python's parser follows (RecursionError), merged
from a peer (the Syncer checks no JSON): every reader outside the BUS treats them as it
treats text that is not JSON, instead of raising out of an engine listener (the BUS's
own readers: tests/unit/test_bus_wire.py, test_bus_adapter.py)."""

from __future__ import annotations

from eventfleet_server.common import jsonfmt
from eventfleet_server.common.model import Event, EventId, EventPayloadJson, Timestamp
from eventfleet_server.jetstream.adapter import _json_object
from eventfleet_server.replication.table import Table

DEEP = "[" * 5000 + "]" * 5000
DEEP_OBJECT = '{"a":' * 5000 + "1" + "}" * 5000


def event(text: str) -> Event:
    return Event(EventId(2, 1, 1), ("x", "t", "k"), Timestamp(1, 0), None, EventPayloadJson(text))


def test_jetstream_ignores_them_as_not_json_objects():
    assert _json_object(EventPayloadJson(DEEP)) is None
    assert _json_object(EventPayloadJson(DEEP_OBJECT)) is None
    assert _json_object(EventPayloadJson('{"a": 1}')) == {"a": 1}


def test_a_replication_row_with_one_counts_as_deleted():
    table = Table("t", "id", ("x",))
    assert table.columns_of("k", event(DEEP_OBJECT)) is None
    assert table.unrepresentable == 1
    assert table.columns_of("k", event('{"a": 1}')) == {"a": 1, "id": "k"}


def test_the_cli_shows_them_as_text():
    assert jsonfmt.event_to_json(event(DEEP))["payload"] == {"json_text": DEEP}
