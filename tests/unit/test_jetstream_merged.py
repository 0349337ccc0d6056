"""The Jetstream engine backend on events merged from a peer (a Syncer catch-up hands
the engine's listeners `RowEvents`): a watched scope takes the merged models, and events
of types nobody watches are never built into model objects. A real store and engine."""

from __future__ import annotations

import json

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import Event, EventId, EventPayloadJson, Timestamp
from eventfleet_server.engine import Engine
from eventfleet_server.jetstream.adapter import EngineBackend
from eventfleet_server.jetstream.models import ModelSchema
from eventfleet_server.storage import Storage, merge_rows
from eventfleet_server.syncer import wire
from eventfleet_server.syncer.rows import decode_rows

SCHEMA = ModelSchema.parse({"List": {"title": "string"}, "Item": {"text": "string"}}, "List")
PREFIX = ("js",)


def peer_event(instance: int, event_type: tuple[str, ...], props: dict) -> Event:
    return Event(
        EventId(7, 1, instance),
        event_type,
        Timestamp(1_000, instance),
        None,
        EventPayloadJson(json.dumps(props)),
    )


async def test_merged_events_reach_a_watched_scope_and_others_stay_unbuilt(tmp_path):
    fatal: list[str] = []
    storage = await Storage.open(tmp_path / "e.sqlite", synchronous="NORMAL")
    engine = Engine(storage, 1, tasks=Tasks("test", fatal.append))
    await engine.start()
    engine.set_operational()
    backend = EngineBackend(engine, PREFIX, SCHEMA)
    sent: list[tuple[str, list[dict]]] = []
    backend.start(lambda name, fragments, origin: sent.append((name, fragments)))
    built: list[int] = []
    to_events = merge_rows.to_events

    def counting(rows, types):
        built.append(len(rows))
        return to_events(rows, types)

    try:
        # Nothing watched: a merge builds no event for this listener.
        merge_rows.to_events = counting
        other = [peer_event(i, ("other", str(i)), {"v": i}) for i in range(1, 51)]
        await engine.merge_rows(decode_rows(wire.encode_events(other), 7, {}))
        assert sum(built) <= 2  # at most the first and last, which listeners peek at

        scope = await backend.open_scope("s")
        built.clear()
        events = [
            *(peer_event(i, ("other", str(i)), {"v": i}) for i in range(51, 150)),
            peer_event(150, (*PREFIX, "jetstream", "s", "Item", "i1"), {"text": "merged"}),
        ]
        await engine.merge_rows(decode_rows(wire.encode_events(events), 7, {}))
        assert scope.models["i1"].properties == {"text": "merged"}
        assert sent and sent[-1][0] == "s"
        assert sum(built) <= 3  # the watched event, and the first and last peeked at
    finally:
        merge_rows.to_events = to_events
        backend.stop()
        await engine.stop()
        await storage.close()
    assert not fatal
