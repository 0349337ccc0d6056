"""The thin adapter between the BUS sockets and the engine.

- Sequence: the storage's local sequence number, handed over by
  `engine.add_sequence_listener` after every commit (own registrations and Syncer
  merges), so it is persistent, strictly increasing and in commit order. Every event is
  broadcast from that callback: persisted before broadcast, once, in order.
- Records: every BUS event is encoded for the wire once. A PUB's frames are made when it
  is parsed; at commit the storage asks `_records_of_events` / `_records_of_rows` for
  each event's record (`mapping.pack_record`) and stores it in the event's own INSERT
  (``events.bus``); the BROADCAST after the commit sends those frames, and a snapshot
  sends the stored records. Envelopes merged from peers get their frames once, at their
  commit, the same way, while someone subscribes (the BROADCAST needs them then). Events
  without a stored record (not BUS envelopes, a peer's merged while nobody subscribed,
  stores written before records were stored) are built from their columns when read.
- Dedup: a PUB whose UUID this replica holds is dropped silently. Recent UUIDs live in
  memory; every client UUID (also those of events merged from peers) is indexed in the
  store's ``event_keys`` table after commit, and the index catches up from the events
  at start, so a crash between a commit and its index write loses nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Sequence

from eventfleet_server.bus import mapping, sbs, wire
from eventfleet_server.bus.server import BusServer, Item, PublishResult
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import Event, EventId, EventType
from eventfleet_server.engine import Engine, EngineError, RegisterError
from eventfleet_server.storage import merge_rows
from eventfleet_server.storage.events import KIND_BINARY, KIND_JSON

log = logging.getLogger(__name__)

_NIL = b"\xc0"
_INDEX_CATCH_UP_CHUNK = 5_000
_MARK_EVERY = 50_000
_INDEX_DELAY = 1.0  # seconds between UUID index writes (at most; docs/bus.md says why)


@functools.lru_cache(maxsize=65536)
def topic_frame(event_type: EventType) -> bytes:
    """The topic frame of an event type (cached: the same few types come over and over)."""
    return wire.type_to_topic(event_type).encode()


def to_item(event: Event, record: mapping.Record | None = None) -> Item:
    """The BUS frames of any stored event (`record`: its `mapping.to_record`, if known)."""
    if record is None:
        record = mapping.to_record(event)
    return (
        topic_frame(event.type),
        record.producer.encode(),
        wire.timestamp_to_iso(event.source_timestamp or event.timestamp).encode(),
        record.uuid.encode(),
        record.data,
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
        # (client UUID, frames, stored record) of our own PUB registrations, waiting for
        # their commit: a PUB is encoded for the wire once, when it is parsed.
        self._own: dict[EventId, tuple[str, Item, bytes]] = {}
        # (client UUID, frames) of the envelopes in the merge rows being written, by
        # event id (a plain tuple: EventId hashes and compares as one): made at their
        # commit for the INSERT and broadcast after it.
        self._merged: dict[tuple[int, int, int], tuple[str, Item]] = {}
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
        self._storage.set_bus_recorder(self._records_of_events, self._records_of_rows)
        self._tasks.spawn("index", self._index_loop())

    async def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
            self._unsubscribe = None
            self._storage.set_bus_recorder(None, None)
        await self._flush_index()

    # -- records for the INSERT (called by the storage before a write) ---------------

    def _records_of_events(self, events: Sequence[Event]) -> list[bytes | None] | None:
        """The stored records of own PUBs among `events` (the engine's batch)."""
        own = self._own
        if not own:
            return None  # an Eventer-only batch pays one check
        get = own.get
        out: list[bytes | None] = []
        append = out.append
        for event in events:
            mine = get(event.id)
            append(None if mine is None else mine[2])
        return out

    def _records_of_rows(self, rows: list[list]) -> list[bytes | None] | None:
        """The records of the BUS envelopes among merge rows (a peer's PUBs, merged by
        the Syncer), made once here: stored with them and broadcast after their commit.

        Only while someone subscribes, i.e. when the BROADCAST needs the frames anyway:
        making them for every merged event would cost a replica without subscribers
        ~2.5 µs per event (JSON -> msgpack, the timestamp text) that nobody may ever
        read; its snapshot builds them from the columns instead (measured: docs/bus.md)."""
        merged = self._merged
        merged.clear()  # a failed or all-duplicate write's leftovers
        server = self._server
        if server is None or not server.has_subscribers():
            return None
        out: list[bytes | None] = []
        append = out.append
        envelope_of = mapping.envelope_of_stored
        to_iso = wire.timestamp_us_to_iso
        pack = mapping.pack_record
        stamps: dict[int, bytes] = {}
        for r in rows:
            kind = r[merge_rows.KIND]
            found = (
                envelope_of(kind == KIND_JSON, r[merge_rows.PTYPE], r[merge_rows.PAYLOAD])
                if kind == KIND_JSON or kind == KIND_BINARY
                else None
            )
            if found is None:
                append(None)
                continue
            uuid, producer, data = found
            sts = r[merge_rows.SOURCE_TS]
            us = r[merge_rows.TS] if sts is None else sts
            stamp = stamps.get(us)
            if stamp is None:
                stamp = stamps[us] = to_iso(us).encode()
            item = (topic_frame(r[merge_rows.TYPE]), producer.encode(), stamp, uuid.encode(), data)
            merged[(r[1], r[2], r[3])] = (uuid, item)
            append(pack(*item[1:]))
        return out

    # -- commits -> broadcasts ---------------------------------------------------------

    def _on_sequenced(self, inserted: list[tuple[int, Event]]) -> None:
        server = self._server
        if server is not None and server.has_subscribers():
            self._broadcast(inserted, server)
        else:
            # Nobody to broadcast to: only the dedup bookkeeping, which needs just the
            # client UUID (found without decoding payloads that are not envelopes).
            own = self._own
            merged = self._merged
            index_rows = self._index_rows
            if not own and not merged:
                # No PUB and no peer envelope waits for this commit (an Eventer batch):
                # only envelopes registered some other way are looked for.
                envelope_uuid = mapping.envelope_uuid
                for seq, event in inserted:
                    uuid = envelope_uuid(event.payload)
                    if uuid is not None:
                        self._remember(uuid)
                        index_rows.append((uuid, seq))
            else:
                for seq, event in inserted:
                    mine = own.pop(event.id, None)
                    if mine is not None:
                        index_rows.append((mine[0], seq))
                        continue
                    peer = merged.pop(event.id, None)
                    uuid = peer[0] if peer is not None else mapping.envelope_uuid(event.payload)
                    if uuid is not None:
                        self._remember(uuid)
                        index_rows.append((uuid, seq))
        self._head = inserted[-1][0]
        self._index_upto = self._head
        self._index_wakeup.set()

    def _broadcast(self, inserted: list[tuple[int, Event]], server: BusServer) -> None:
        out = []
        append = out.append
        own = self._own
        merged = self._merged
        index_rows = self._index_rows
        for seq, event in inserted:
            mine = own.pop(event.id, None)
            if mine is not None:
                index_rows.append((mine[0], seq))
                append((seq, mine[1]))
                continue
            peer = merged.pop(event.id, None)
            if peer is not None:
                # A peer's envelope: the frames made (and stored) at its commit.
                self._remember(peer[0])
                index_rows.append((peer[0], seq))
                append((seq, peer[1]))
                continue
            # Not a BUS envelope, or not from the Syncer (Eventer, Replication, ...).
            record = mapping.to_record(event)
            if record.from_bus:
                self._remember(record.uuid)
                index_rows.append((record.uuid, seq))
            append((seq, to_item(event, record)))
        server.broadcast(out)

    # -- snapshot reads ----------------------------------------------------------------

    async def read(
        self, after: int, limit: int, subtrees: tuple[bytes, ...]
    ) -> tuple[int, list[tuple[int, Item]]]:
        # The stored records, unpacked into their frames; rows without one (not BUS
        # envelopes, older stores) are built from their columns, without event objects.
        rows, columns = await self._storage.read_bus_since_seq(after, limit)
        if not rows:
            return after, []
        out = []
        append = out.append
        unpack = mapping.unpack_record
        record_of = mapping.record_of
        to_iso = wire.timestamp_us_to_iso
        type_of = self._storage.type_of
        topics: dict[int, bytes] = {}
        for seq, type_id, stored in rows:
            topic = topics.get(type_id)
            if topic is None:
                topic = topics[type_id] = topic_frame(type_of(type_id))
            if subtrees and not topic.startswith(subtrees):
                continue
            if stored is not None:
                append((seq, (topic, *unpack(stored))))
                continue
            event = columns.get(seq)
            if event is None:
                continue  # deleted by retention between the two reads: as if before
            server, session, instance, ts, sts, ptype, data = event
            record = record_of(server, session, instance, ptype, data)
            append(
                (
                    seq,
                    (
                        topic,
                        record.producer.encode(),
                        to_iso(ts if sts is None else sts).encode(),
                        record.uuid.encode(),
                        record.data,
                    ),
                )
            )
        return rows[-1][0], out

    # -- PUB -> register ---------------------------------------------------------------

    async def publish(self, pubs: Sequence[wire.Publish]) -> PublishResult:
        """Register `pubs` as one engine session (one commit), dropping held UUIDs."""
        recent = self._recent
        unknown = [p.uuid for p in pubs if p.uuid not in recent]
        held: dict[str, int] | None = {}
        if unknown:
            # At once when the store can (no thread hop on the path of a PUB), else on
            # the reader thread.
            held = self._storage.find_event_keys_now(unknown)
            if held is None:
                held = await self._storage.find_event_keys(unknown)
        batch_seen: set[str] = set()
        duplicates = 0
        refused: list[tuple[int, str, str]] = []
        events = []
        kept: list[wire.Publish] = []
        to_register_event = mapping.to_register_event
        for index, pub in enumerate(pubs):
            uuid = pub.uuid
            if uuid in recent or uuid in held or uuid in batch_seen:
                duplicates += 1
                continue
            try:
                events.append(
                    to_register_event(
                        pub.event_type, pub.source_timestamp, uuid, pub.producer, pub.data
                    )
                )
            except mapping.MappingError as e:
                refused.append((index, "bad_message", f"PUB {pub.topic[:200]!r}: {e}"))
                continue
            batch_seen.add(uuid)
            kept.append(pub)
        if events:
            try:
                try:
                    self._register(events, kept)
                except RegisterError:
                    # Usually "too many uncommitted": wait for the writer once, then retry.
                    await self._engine.flush()
                    self._register(events, kept)
            except EngineError as e:
                refused += [(pubs.index(p), "register_failed", str(e)) for p in kept]
        return PublishResult(duplicates, refused)

    def _register(self, events: list, kept: list[wire.Publish]) -> None:
        # Every event was checked while it was parsed and mapped (a topic with a type
        # the engine takes, a timestamp in range, JSON we wrote ourselves): the engine
        # need not parse the JSON again. Their SBS bytes are built by `sbs.encode`.
        created, future = self._engine.register(events, validated=True, encode=sbs.encode)
        own = self._own
        remember = self._remember
        pack = mapping.pack_record
        server_ts = b""
        for event, pub in zip(created, kept, strict=True):
            timestamp = pub.timestamp_frame
            if not timestamp:
                # One session, one server timestamp: formatted once per batch.
                if not server_ts:
                    server_ts = wire.timestamp_to_iso(event.timestamp).encode()
                timestamp = server_ts
            data = pub.data or _NIL
            own[event.id] = (
                pub.uuid,
                (pub.topic_frame, pub.producer_frame, timestamp, pub.uuid_frame, data),
                pack(pub.producer_frame, timestamp, pub.uuid_frame, data),
            )
            remember(pub.uuid)
        ids = [e.id for e in created]
        future.add_done_callback(lambda f: self._forget_failed(f, ids))

    def _forget_failed(self, future: asyncio.Future, ids: list[EventId]) -> None:
        if future.cancelled() or future.exception() is not None:
            for event_id in ids:
                mine = self._own.pop(event_id, None)
                if mine is not None:
                    self._recent.pop(mine[0], None)

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
            # Gather the UUIDs of many commits into one index transaction: at a steady
            # trickle of PUBs each commit would otherwise be followed by a second one.
            # Nothing waits for the index: recent UUIDs are deduplicated from memory, and
            # a crash before this write is caught up from the events at start.
            await asyncio.sleep(_INDEX_DELAY)
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
