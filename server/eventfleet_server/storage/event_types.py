"""The ``types`` table (``type_id`` <-> event type as a JSON array of strings) and its
in-memory cache, which also expands query type patterns into type ids.

Threads: only the writer adds types; the reader looks them up (see `backend`)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from eventfleet_server.common.model import EventType
from eventfleet_server.common.subscription import Subscription

DDL = """
CREATE TABLE types (
    type_id INTEGER PRIMARY KEY,
    type TEXT NOT NULL UNIQUE
) STRICT;
"""
INSERT = "INSERT INTO types (type_id, type) VALUES (?, ?)"
SELECT = "SELECT type_id, type FROM types"

_EXPANSION_CACHE = 256


class TypeCache:
    """type_id -> type (None for ids burned by a rolled-back write) and back."""

    def __init__(self) -> None:
        self.types: list[EventType | None] = []
        self.ids: dict[EventType, int] = {}
        # Subscription patterns -> (types scanned so far, matching ids, ids as JSON).
        self._expansions: dict[tuple, tuple[int, list[int], str]] = {}

    def load(self, conn: sqlite3.Connection) -> None:
        for type_id, text in conn.execute(SELECT):
            event_type = tuple(json.loads(text))
            if type_id >= len(self.types):
                self.types.extend([None] * (type_id + 1 - len(self.types)))
            self.types[type_id] = event_type
            self.ids[event_type] = type_id

    def add(self, event_type: Any, new_types: list[int]) -> int:
        """The id of `event_type`, assigned now if it is new (appended to `new_types`
        for `insert`). Raises TypeError naming a bad segment."""
        if not isinstance(event_type, tuple | list):
            raise TypeError(f"type {event_type!r} is not a tuple of str")
        event_type = tuple(event_type)
        for i, segment in enumerate(event_type):
            if type(segment) is not str:
                raise TypeError(f"type segment {i} {segment!r} is not a str")
        type_id = self.ids.get(event_type)  # the type was given as a list
        if type_id is not None:
            return type_id
        type_id = len(self.types)
        # Visible to the reader before commit; harmless, no committed row uses it yet.
        self.types.append(event_type)
        self.ids[event_type] = type_id
        new_types.append(type_id)
        return type_id

    def insert(self, conn: sqlite3.Connection, new_types: list[int]) -> None:
        if new_types:
            conn.executemany(INSERT, [(i, json.dumps(self.types[i])) for i in new_types])

    def burn(self, new_types: list[int]) -> None:
        """Forget ids assigned by a write that rolled back; never reused (a concurrent
        reader may hold them)."""
        for type_id in new_types:
            del self.ids[self.types[type_id]]  # type: ignore[index]
            self.types[type_id] = None

    def expand(self, event_types: list[EventType] | None) -> tuple[list[int], str] | None:
        """Type ids matching `event_types` and their JSON; None when every type matches.

        A list without wildcards is looked up type by type (O(list)); patterns with
        wildcards are matched against the known types once and the result cached, then
        extended by the types added since."""
        if event_types is None:
            return None
        if not any("*" in p or "?" in p for p in event_types):
            # Names only: each is a type or nothing (no trie, no scan of known types).
            get = self.ids.get
            ids = [i for i in dict.fromkeys(map(get, map(tuple, event_types))) if i is not None]
            return ids, json.dumps(ids)
        subscription = Subscription(event_types)
        if subscription.matches_all:
            return None
        patterns = subscription.patterns
        types = self.types
        known = len(types)  # the writer may append while we look; take a fixed prefix
        cached = self._expansions.get(patterns)
        if cached is not None and cached[0] == known:
            return cached[1], cached[2]
        start, ids = (cached[0], list(cached[1])) if cached is not None else (0, [])
        matches = subscription.matches
        for type_id in range(start, known):
            event_type = types[type_id]
            if event_type is not None and matches(event_type):
                ids.append(type_id)
        text = json.dumps(ids)
        if len(self._expansions) >= _EXPANSION_CACHE:
            self._expansions.clear()
        self._expansions[patterns] = (known, ids, text)
        return ids, text
