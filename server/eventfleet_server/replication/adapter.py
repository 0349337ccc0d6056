"""The thin adapter between the engine and the engine-free replication code.

It owns the row index of every configured table (fed by the engine's sequence
listener), the store's guid, and writes rows as registered events.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from eventfleet_server.common.model import (
    EventPayloadJson,
    RegisterEvent,
    encoded_json_error,
    event_type_error,
    json_value_error,
)
from eventfleet_server.engine import Engine, EngineError
from eventfleet_server.replication.config import ReplicationConfig, TableConfig
from eventfleet_server.replication.session import WriteError
from eventfleet_server.replication.table import UNKNOWN, Change, Tables, dumps_row

log = logging.getLogger(__name__)

GUID_META_KEY = "replication_guid"

ChangeListener = Callable[[list[Change]], None]


class EngineBackend:
    """Implements the publisher's `Backend` (and what the replicator needs) on an engine."""

    def __init__(self, engine: Engine, config: ReplicationConfig):
        self._engine = engine
        self.tables = Tables(config.type_prefix, [(t.name, t.key) for t in config.tables])
        self.table_configs: dict[str, TableConfig] = {t.name: t for t in config.tables}
        self.guid = ""
        self._applied = 0
        self._listeners: list[ChangeListener] = []
        self._unsubscribe: Callable[[], None] | None = None
        # Rows written here whose event is not committed yet: a second write to the same
        # row merges with this, not with the index's older state.
        # (event id, columns, their JSON text) by (table, key).
        self._unsettled: dict[tuple[str, str], tuple[Any, dict[str, Any] | None, str | None]] = {}
        self._unsettled_ids: dict[Any, tuple[str, str]] = {}

    async def start(self) -> None:
        """Load the store's guid (made on first use) and the row index."""
        storage = self._engine.storage
        guid = await storage.get_meta(GUID_META_KEY)
        if not isinstance(guid, str) or not guid:
            # Per store: a new or wiped store gets a new guid, so a replicator that knew
            # the old one does a full pass instead of trusting usns that no longer exist.
            guid = uuid.uuid4().hex
            await storage.write([], {GUID_META_KEY: guid})
            log.info("replication: new store guid %s", guid)
        self.guid = guid
        # Listen first and load second: a commit that lands while the index loads is
        # applied after it (applying an event twice, or an older one, changes nothing).
        buffered: list[tuple[int, Any]] = []
        before = storage.last_seq
        unsubscribe_buffer = self._engine.add_sequence_listener(buffered.extend)
        try:
            subscriptions = self.tables.subscriptions()
            loaded = await storage.read_latest(subscriptions) if subscriptions else []
        finally:
            unsubscribe_buffer()
        loaded.sort(key=lambda item: item[0])
        self.tables.apply(loaded)
        self.tables.apply(buffered)
        self._applied = max([before, *(seq for seq, _ in buffered)])
        self._unsubscribe = self._engine.add_sequence_listener(self._on_sequence)
        log.info(
            "replication: store guid %s, usn %d, tables %s",
            self.guid,
            self._applied,
            {name: len(t.snapshot()) for name, t in self.tables.tables.items()},
        )

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def add_change_listener(self, listener: ChangeListener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _on_sequence(self, items: list[tuple[int, Any]]) -> None:
        self._applied = max(self._applied, items[-1][0])
        if self._unsettled_ids:
            changes = self.tables.apply(items, self._written_row)
            for _, event in items:
                self._settle(event.id)
        else:
            changes = self.tables.apply(items)
        if not changes:
            return
        for listener in list(self._listeners):
            try:
                listener(changes)
            except Exception:
                log.exception("replication change listener %r failed", listener)

    def _written_row(self, event_id: Any) -> Any:
        where = self._unsettled_ids.get(event_id)
        entry = self._unsettled.get(where) if where is not None else None
        if entry is None or entry[0] != event_id:
            return UNKNOWN
        return entry[1], entry[2]

    def _settle(self, event_id: Any) -> None:
        where = self._unsettled_ids.pop(event_id, None)
        if where is not None and self._unsettled.get(where, (None,))[0] == event_id:
            del self._unsettled[where]

    def current(self, table: str, key: str) -> dict[str, Any] | None:
        unsettled = self._unsettled.get((table, key))
        if unsettled is not None:
            return unsettled[1]
        return self.tables[table].get(key)

    def last_seq(self) -> int:
        """The highest sequence number whose row changes the index has taken in."""
        return self._applied

    def write(self, table: str, key: str, columns: dict[str, Any] | None) -> Any:
        """Register the row's new state as one event (None: a tombstone, no payload)."""
        return self.write_many(table, [(key, columns)])[0]

    def write_many(self, table: str, rows: list[tuple[str, dict[str, Any] | None]]) -> list[Any]:
        """Register several rows' new states as one engine session (all or nothing);
        returns their event ids in order. Raises `WriteError`."""
        index = self.tables[table]
        events = []
        texts: list[str | None] = []
        for key, columns in rows:
            payload = None
            text = None
            if columns is not None:
                try:
                    # The index's own encoding: the row index takes this text as the
                    # row's (`Table.apply`), not encoding the row a second time.
                    text = dumps_row(columns)
                except ValueError as e:  # NaN or ±Infinity (allow_nan=False)
                    why = json_value_error(columns) or str(e)
                    raise WriteError(f"row {key!r} is not storable as JSON: {why}") from None
                # The shared payload rule's other half: an integer beyond a double.
                if (error := encoded_json_error(text)) is not None:
                    raise WriteError(f"row {key!r} is not storable as JSON: {error}")
                payload = EventPayloadJson(text)
            event_type = index.event_type(key)
            error = event_type_error(event_type)
            if error is not None:
                raise WriteError(f"row {key!r}: {error}")
            texts.append(text)
            events.append(RegisterEvent(event_type, None, payload))
        try:
            # validated: the types were checked above, the payloads are JSON made here
            # (no source timestamps), so the engine need not parse every row again.
            created, committed = self._engine.register(events, validated=True)
        except EngineError as e:
            raise WriteError(str(e)) from None
        ids = [event.id for event in created]
        for (key, columns), text, event_id in zip(rows, texts, ids, strict=True):
            self._unsettled[(table, key)] = (event_id, columns, text)
            self._unsettled_ids[event_id] = (table, key)
        committed.add_done_callback(lambda fut: self._committed(fut, ids))
        return ids

    def _committed(self, fut: Any, event_ids: list[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            log.error(
                "replication: a row write was not committed: %s",
                fut.exception() if not fut.cancelled() else "cancelled",
            )
            for event_id in event_ids:
                self._settle(event_id)

    async def flush(self) -> None:
        await self._engine.flush()

    async def load_state(self, key: str) -> Any:
        return await self._engine.storage.get_meta(key)

    async def save_state(self, key: str, value: Any) -> None:
        """Store `value` once everything registered before has been committed."""
        await self._engine.flush()
        await self._engine.storage.write([], {key: value})
