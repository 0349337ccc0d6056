"""The thin adapter between the BUS sockets and the engine.

- Sequence: the storage's local sequence number, handed over by
  `engine.add_sequence_listener` after every commit (own registrations and Syncer
  merges), so it is persistent, strictly increasing and in commit order. Every event is
  broadcast from that callback: persisted before broadcast, once, in order.
- Dedup: a PUB whose UUID this replica holds is dropped silently. Recent UUIDs live in
  memory; every client UUID (also those of events merged from peers) is indexed in the
  store's ``event_keys`` table after commit, and the index catches up from the events
  at start, so a crash between a commit and its index write loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence

from eventfleet_server.bus import mapping, wire
from eventfleet_server.bus.server import BusServer, Item, PublishResult
from eventfleet_server.common.model import Event, EventId
from eventfleet_server.engine import Engine, EngineError, RegisterError
from eventfleet_server.listener import Tasks

log = logging.getLogger(__name__)

_NIL = b"\xc0"
_INDEX_CATCH_UP_CHUNK = 5_000
_MARK_EVERY = 50_000


def to_item(event: Event) -> Item:
    record = mapping.to_record(event)
    return Item(
        wire.type_to_topic(event.type),
        wire.timestamp_to_iso(mapping.producer_timestamp(event)),
        record,
    )


class EngineAdapter:
    """`BusHandler` over an `Engine`; `attach(server)` before `start`."""

    def __init__(self, engine: Engine, *, dedup_memory: int, tasks: Tasks):
        self._engine = engine
        self._storage = engine.storage
        self._tasks = tasks
        self._server: BusServer | None = None
        self._head = 0
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._recent_max = dedup_memory
        # Items of our own PUB registrations, waiting for their commit (no re-encoding).
        self._own: dict[EventId, Item] = {}
        self._index_rows: list[tuple[str, int]] = []
        self._index_upto = 0
        self._index_wakeup = asyncio.Event()
        # One index write at a time: `stop` must wait for the loop's write in flight.
        self._index_lock = asyncio.Lock()
        self._unsubscribe = None

    def attach(self, server: BusServer) -> None:
        self._server = server

    @property
    def head(self) -> int:
        return self._head

    async def start(self) -> None:
        await self._catch_up_index()
        # Synchronously with reading last_seq: nothing can commit in between.
        self._head = self._storage.last_seq
        self._index_upto = self._head
        self._unsubscribe = self._engine.add_sequence_listener(self._on_sequenced)
        self._tasks.spawn("index", self._index_loop())

    async def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
            self._unsubscribe = None
        await self._flush_index()

    # -- commits -> broadcasts ---------------------------------------------------------

    def _on_sequenced(self, inserted: list[tuple[int, Event]]) -> None:
        server = self._server
        if server is not None and server.has_subscribers():
            self._broadcast(inserted, server)
        else:
            # Nobody to broadcast to: only the dedup bookkeeping, which needs just the
            # client UUID (found without decoding payloads that are not envelopes).
            own = self._own
            index_rows = self._index_rows
            for seq, event in inserted:
                item = own.pop(event.id, None)
                if item is not None:
                    index_rows.append((item.record.uuid, seq))
                    continue
                uuid = mapping.envelope_uuid(event.payload)
                if uuid is not None:
                    self._remember(uuid)
                    index_rows.append((uuid, seq))
        self._head = inserted[-1][0]
        self._index_upto = self._head
        self._index_wakeup.set()

    def _broadcast(self, inserted: list[tuple[int, Event]], server: BusServer) -> None:
        out = []
        own = self._own
        for seq, event in inserted:
            item = own.pop(event.id, None)
            if item is None:
                item = to_item(event)
                if item.record.from_bus:
                    self._remember(item.record.uuid)
            if item.record.from_bus:
                self._index_rows.append((item.record.uuid, seq))
            out.append((seq, item))
        server.broadcast(out)

    # -- snapshot reads ----------------------------------------------------------------

    async def read(self, after: int, limit: int) -> list[tuple[int, Item]]:
        rows = await self._storage.read_since_seq(after, limit)
        return [(seq, to_item(event)) for seq, event in rows]

    # -- PUB -> register ---------------------------------------------------------------

    async def publish(self, pubs: Sequence[wire.Publish]) -> PublishResult:
        recent = self._recent
        batch_seen: set[str] = set()
        unknown = [p.uuid for p in pubs if p.uuid not in recent]
        held = await self._storage.find_event_keys(unknown) if unknown else {}
        duplicates = 0
        refused: list[tuple[int, str, str]] = []
        events = []
        kept: list[wire.Publish] = []
        for index, pub in enumerate(pubs):
            if pub.uuid in recent or pub.uuid in held or pub.uuid in batch_seen:
                duplicates += 1
                continue
            try:
                events.append(
                    mapping.to_register_event(
                        pub.event_type, pub.source_timestamp, pub.uuid, pub.producer, pub.data
                    )
                )
            except mapping.MappingError as e:
                refused.append((index, "bad_message", f"PUB {pub.topic[:200]!r}: {e}"))
                continue
            batch_seen.add(pub.uuid)
            kept.append(pub)
        if events:
            refused += await self._register(events, kept, pubs)
        return PublishResult(duplicates, refused)

    async def _register(self, events, kept, pubs) -> list[tuple[int, str, str]]:
        try:
            created, future = self._engine.register(events)
        except RegisterError:
            # Usually "too many uncommitted": wait for the writer once, then retry.
            await self._engine.flush()
            try:
                created, future = self._engine.register(events)
            except EngineError as e:
                return [(pubs.index(p), "register_failed", str(e)) for p in kept]
        except EngineError as e:
            return [(pubs.index(p), "register_failed", str(e)) for p in kept]
        own = self._own
        for event, pub in zip(created, kept, strict=True):
            timestamp = pub.source_timestamp or event.timestamp
            own[event.id] = Item(
                pub.topic,
                wire.timestamp_to_iso(timestamp),
                mapping.Record(pub.producer, pub.uuid, pub.data or _NIL, True),
            )
            self._remember(pub.uuid)
        ids = [e.id for e in created]
        future.add_done_callback(lambda f: self._forget_failed(f, ids))
        return []

    def _forget_failed(self, future: asyncio.Future, ids: list[EventId]) -> None:
        if future.cancelled() or future.exception() is not None:
            for event_id in ids:
                item = self._own.pop(event_id, None)
                if item is not None:
                    self._recent.pop(item.record.uuid, None)

    def _remember(self, uuid: str) -> None:
        recent = self._recent
        recent[uuid] = None
        if len(recent) > self._recent_max:
            recent.popitem(last=False)

    # -- the persistent UUID index -----------------------------------------------------

    async def _catch_up_index(self) -> None:
        """Index client UUIDs of events committed after the index's mark (a crash
        between a commit and its index write, or a store that predates the index)."""
        after = self._storage.event_keys_seq
        total = 0
        while True:
            rows = await self._storage.read_since_seq(after, _INDEX_CATCH_UP_CHUNK)
            if not rows:
                break
            keys = []
            for seq, event in rows:
                uuid = mapping.envelope_uuid(event.payload)
                if uuid is not None:
                    keys.append((uuid, seq))
            after = rows[-1][0]
            await self._storage.add_event_keys(keys, after)
            total += len(keys)
        if total:
            log.info("event bus: indexed %d client UUIDs up to sequence %d", total, after)

    async def _index_loop(self) -> None:
        while True:
            await self._index_wakeup.wait()
            self._index_wakeup.clear()
            try:
                await self._flush_index()
            except Exception as e:
                # Rows stay queued; the next commit retries (and start-up catches up).
                log.warning("event bus: UUID index write failed (will retry): %s", e)
                await asyncio.sleep(1.0)

    async def _flush_index(self) -> None:
        async with self._index_lock:
            await self._flush_index_locked()

    async def _flush_index_locked(self) -> None:
        rows, self._index_rows = self._index_rows, []
        upto = self._index_upto
        # Without new UUIDs only move the mark now and then: start-up re-reads at most
        # this many events to catch up.
        if not rows and upto - self._storage.event_keys_seq < _MARK_EVERY:
            return
        try:
            await self._storage.add_event_keys(rows, upto)
        except BaseException:
            self._index_rows = rows + self._index_rows
            raise
