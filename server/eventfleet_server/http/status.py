"""The ``/status`` document (version 1) and the ``/flush`` operation.

``/status`` is the contract the operator reads; docs/observability.md documents it and
its version policy. Within version 1 the top-level keys are exactly those built here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventfleet_server.http.health import peer_states, readiness
from eventfleet_server.storage.schema import SCHEMA_VERSION

STATUS_VERSION = 1

# Keys of one `peers[]` entry; taken from the syncer's `state()` so the document does not
# change shape when the syncer adds fields of its own.
PEER_KEYS = ("name", "server_id", "state", "last_event_id", "lag_events", "lag_seconds")


async def status_document(replica: Any, *, full: bool = True) -> dict:
    """Build the version-1 status document of `replica`.

    Not `full` (an anonymous caller while tokens are configured): only what an Eventer
    client can learn anyway — last ids (server queries), peers and their sync state
    (the ``('event', N, 'synced', M)`` events), the event count; ``protocols`` (ports,
    connection counts) and ``credentials`` (token fingerprints) are null and
    ``storage`` has no sizes or sequence numbers.
    """
    engine = getattr(replica, "engine", None)
    storage = getattr(replica, "storage", None)
    ready, _ = readiness(replica)
    stats = await storage.stats() if storage is not None else None
    return {
        "version": STATUS_VERSION,
        "server_id": engine.server_id if engine is not None else replica.conf["server_id"],
        "status": engine.status.value if engine is not None else "starting",
        "ready": ready,
        "session": engine.last_id.session if engine is not None else None,
        "last_ids": last_ids(storage),
        "peers": peers(peer_states(replica)),
        "protocols": {
            name: proto.describe()
            for name, proto in dict(getattr(replica, "protocols", None) or {}).items()
        }
        if full
        else None,
        "credentials": _fingerprints(replica) if full else None,
        "storage": {
            "events": stats.events if stats else None,
            "db_bytes": stats.db_bytes if stats and full else None,
            "last_seq": stats.last_seq if stats and full else None,
            # The store's schema (PRAGMA user_version): what a replica of an older image
            # would refuse to open (the operator keeps the highest seen).
            "schema_version": SCHEMA_VERSION if storage is not None else None,
        },
    }


def _fingerprints(replica: Any) -> dict[str, list[str]] | None:
    credentials = getattr(replica, "credentials", None)
    return credentials.fingerprints() if credentials is not None else None


def last_ids(storage: Any) -> dict[str, dict]:
    """Last committed id per server id held, keyed by the server id as a string (JSON)."""
    held: Mapping = getattr(storage, "last_ids", None) or {}
    return {str(server): event_id_json(eid) for server, eid in sorted(held.items())}


def peers(states: list[dict]) -> list[dict]:
    """The protocols' per-peer states, projected onto the documented keys."""
    out = []
    for peer in states:
        entry = {key: peer.get(key) for key in PEER_KEYS}
        entry["last_event_id"] = event_id_json(entry["last_event_id"])
        out.append(entry)
    return out


def event_id_json(eid: Any) -> dict | None:
    """An EventId (named tuple) or an already-JSON dict as ``{server, session, instance}``."""
    if eid is None:
        return None
    if isinstance(eid, Mapping):
        return {k: eid[k] for k in ("server", "session", "instance")}
    return {"server": eid.server, "session": eid.session, "instance": eid.instance}
