"""Observable sync state: per-peer snapshots and the registered sync-state events.

Lag (what each field means, also in docs/syncer.md):

- ``synced``: ``lag_events`` = events received from the peer and not yet committed
  here; ``lag_seconds`` = delay of the last live event (received - created).
- ``connected``/``syncing`` (history in progress): ``lag_events`` is None (the
  protocol does not announce the peer's newest id); ``lag_seconds`` = how old the
  last received event is, i.e. how far back in time the catch-up still is.
- ``disconnected``: ``lag_events`` None; ``lag_seconds`` = seconds since we were last
  in sync with the peer (None if never).
"""

from __future__ import annotations

import json
import logging
import time

from eventfleet_server.common.model import EventId, EventPayloadJson, RegisterEvent
from eventfleet_server.engine import Engine, EngineError
from eventfleet_server.syncer.mesh import PeerLink, sync_state_type

log = logging.getLogger(__name__)


def _eid(i: EventId | None) -> dict | None:
    return None if i is None else {"server": i.server, "session": i.session, "instance": i.instance}


def peer_state(link: PeerLink, held: EventId | None) -> dict:
    """One entry of `Syncer.state()`; `held` is the highest id of the peer's server held."""
    stats = link.direct.stats
    now = time.time()
    lag_events: int | None = None
    lag_seconds: float | None = None
    if link.state == "synced":
        lag_events = link.direct.owner.pending
        lag_seconds = stats.last_event_age if stats.last_received_at else 0.0
        if stats.synced_at and (stats.last_received_at or 0) < stats.synced_at:
            lag_seconds = 0.0  # nothing live received since MsgSynced
    elif link.state in ("connected", "syncing"):
        if stats.last_received_at is not None and stats.last_event_age is not None:
            lag_seconds = stats.last_event_age + (now - stats.last_received_at)
    elif link.last_synced_at is not None:
        lag_seconds = now - link.last_synced_at
    return {
        "name": link.peer.name,
        "server_id": link.peer.server_id,
        "address": link.peer.address,
        "state": link.state,
        "since": link.state_since,
        "last_event_id": _eid(held),
        "lag_events": lag_events,
        "lag_seconds": None if lag_seconds is None else round(lag_seconds, 6),
        "events_received": stats.received_events,
        "connects": link.epoch,
        "last_error": link.last_error,
    }


class SyncStateRecorder:
    """Registers ``('event', <own id>, 'synced', <peer id>)`` on each peer state change.

    Payload as hat-event: ``{"state": "CONNECTED"|"SYNCING"|"SYNCED"|"DISCONNECTED"}``,
    with ``count`` (events received during the catch-up) when SYNCED. Nothing is
    registered while the engine is not operational (bootstrap, shutdown).
    """

    def __init__(self, engine: Engine):
        self._engine = engine

    def __call__(self, link: PeerLink, state: str) -> None:
        data: dict = {"state": state.upper(), "peer": link.peer.name}
        if state == "synced":
            data["count"] = link.direct.stats.history_events
        event = RegisterEvent(
            sync_state_type(self._engine.server_id, link.peer.server_id),
            None,
            EventPayloadJson(json.dumps(data)),
        )
        try:
            self._engine.register([event])
        except EngineError as e:
            log.debug("sync state of peer=%s not registered: %s", link.peer.name, e)
