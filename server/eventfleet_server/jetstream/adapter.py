"""The thin adapter between the Jetstream protocol and the engine.

Scope S is the event subtree ``<type_prefix> + ['jetstream', S]``; model `uuid` of class
`clsName` is the latest event of ``<type_prefix> + ['jetstream', S, clsName, uuid]``, its
JSON payload the model's properties (no payload: the model was deleted by some other
writer). A scope is loaded with one ``latest`` query when a session first fetches it and
then kept current from the engine's listener, which sees every event however it arrived
(a Jetstream sync, an Eventer client, a peer's Syncer).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from eventfleet_server.common import jsontext
from eventfleet_server.common.model import (
    Event,
    EventPayloadJson,
    QueryLatestParams,
    RegisterEvent,
    natural_key,
)
from eventfleet_server.engine import Engine
from eventfleet_server.jetstream.models import ModelSchema
from eventfleet_server.jetstream.scope import ModelRecord, ModelWrite, Scope, root_uuid
from eventfleet_server.storage.merge_rows import RowEvents

log = logging.getLogger(__name__)

# (scope name, fragments, origin session token or None) -> fan-out
ChangeSink = Callable[[str, list[dict], str | None], None]


class EngineBackend:
    def __init__(self, engine: Engine, type_prefix: tuple[str, ...], schema: ModelSchema):
        self._engine = engine
        self._prefix = (*tuple(type_prefix), "jetstream")
        self._schema = schema
        self._scopes: dict[str, Scope] = {}
        self._refs: dict[str, int] = {}
        self._loading: dict[str, list[ModelRecord]] = {}
        self._load_done: dict[str, asyncio.Future] = {}
        # (server, session) of a batch -> fragments per scope, between "seen" and "persisted"
        self._pending: dict[tuple[int, int], list[tuple[str, list[dict]]]] = {}
        self._origins: dict[tuple[int, int], str] = {}
        self._sink: ChangeSink | None = None
        self._remove_listener: Callable[[], None] | None = None
        self.ignored_events = 0

    def start(self, sink: ChangeSink) -> None:
        self._sink = sink
        self._remove_listener = self._engine.add_listener(self._on_events)

    def stop(self) -> None:
        if self._remove_listener:
            self._remove_listener()
            self._remove_listener = None

    # -- Backend ---------------------------------------------------------------------------

    def scope(self, name: str) -> Scope | None:
        return self._scopes.get(name)

    async def open_scope(self, name: str) -> Scope:
        if name in self._scopes:
            self._refs[name] += 1
            return self._scopes[name]
        if name in self._load_done:
            await asyncio.shield(self._load_done[name])
            return await self.open_scope(name)
        done = asyncio.get_running_loop().create_future()
        self._load_done[name] = done
        # Events arriving while the query runs are kept and applied after it: the merge is
        # by natural order, so whichever came first, the latest wins.
        self._loading[name] = []
        try:
            scope = Scope(name, root_uuid(self._prefix[:-1], name), self._schema)
            result = await self._engine.query(
                QueryLatestParams(event_types=[(*self._prefix, name, "*")])
            )
            scope.apply(self._records(result.events, name))
            scope.apply(self._loading[name])
            self._scopes[name] = scope
            self._refs[name] = 1
            done.set_result(None)
            return scope
        except BaseException as e:
            done.set_exception(e if isinstance(e, Exception) else RuntimeError("cancelled"))
            done.exception()  # retrieved: waiting fetches re-raise it themselves
            raise
        finally:
            del self._loading[name]
            del self._load_done[name]

    def close_scope(self, name: str) -> None:
        n = self._refs.get(name, 0) - 1
        if n > 0:
            self._refs[name] = n
        else:
            # Nobody watches it: drop it; the next fetch reloads it from the store.
            self._refs.pop(name, None)
            self._scopes.pop(name, None)

    async def store(self, scope: Scope, writes: list[ModelWrite], origin: str) -> None:
        events = [
            RegisterEvent(
                (*self._prefix, scope.name, w.cls_name, w.uuid),
                None,
                EventPayloadJson(json.dumps(w.properties, separators=(",", ":"))),
            )
            for w in writes
        ]
        # One engine session: validated as a whole and committed all or nothing.
        created, committed = self._engine.register(events)
        key = created[0].id[:2]
        self._origins[key] = origin
        try:
            await committed
        except BaseException:
            self._origins.pop(key, None)
            self._pending.pop(key, None)
            raise

    # -- engine listener -------------------------------------------------------------------

    def _on_events(self, events: list[Event], persisted: bool) -> None:
        if not events:
            return
        key = events[0].id[:2]
        if persisted:
            origin = self._origins.pop(key, None)
            for name, fragments in self._pending.pop(key, ()):
                if self._sink is not None:
                    self._sink(name, fragments, origin)
            return
        # Not yet persisted: update the cache now (the next sync is checked against it),
        # tell sessions only once committed.
        scopes, loading = self._scopes, self._loading
        if not scopes and not loading:
            return  # no scope is watched: nothing to look at
        p = len(self._prefix)
        prefix = self._prefix

        def watched(t: tuple[str, ...]) -> bool:
            return len(t) == p + 3 and t[:p] == prefix and (t[p] in scopes or t[p] in loading)

        # Merged events (a Syncer catch-up) are built only where the type is watched:
        # building every one of them was 6 % of a catch-up's event-loop time.
        candidates = events.of_types(watched) if isinstance(events, RowEvents) else events
        by_scope: dict[str, list[Event]] = {}
        for e in candidates:
            t = e.type
            if watched(t):
                by_scope.setdefault(t[p], []).append(e)
        for name, group in by_scope.items():
            records = self._records(group, name)
            if name in self._loading:
                self._loading[name].extend(records)
                continue
            fragments = self._scopes[name].apply(records)
            if fragments:
                self._pending.setdefault(key, []).append((name, fragments))

    def _records(self, events: list[Event], name: str) -> list[ModelRecord]:
        p = len(self._prefix)
        out = []
        for e in events:
            t = e.type
            if len(t) != p + 3 or t[p] != name:
                continue
            props = None
            if e.payload is not None:
                props = _json_object(e.payload)
                if props is None:
                    self.ignored_events += 1
                    continue
            out.append(ModelRecord(t[p + 1], t[p + 2], props, natural_key(e)))
        return out


def _json_object(payload) -> dict | None:
    if not isinstance(payload, EventPayloadJson):
        return None
    value = jsontext.parse(payload.data)
    return value if isinstance(value, dict) else None
