"""Full mesh: the Syncer client side of one replica, one `PeerLink` per peer.

What is pulled from each peer P:

- P's own server id, live, always (the *direct* stream; its state is P's sync state);
- this replica's own server id, as a catch-up (history, then close) each time the
  direct stream connects: recovers own events this store lost;
- every other known server id X (relay, through the ``lastEventId.server``
  extension): a catch-up each time P's direct stream connects, and live for as long
  as this replica has no synced direct stream to X itself (X down, removed, or cut
  off from us but not from P). So a survivor hands over a dead peer's events, while a
  healthy fleet does not receive every event N-1 times.

Known server ids: own, the peers', every server id held in the store, and the ids
named by registered sync-state events (``('event', a, 'synced', b)``) so that a
replica with a wiped store learns about servers that are gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Sequence

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import Event, EventType, QueryLatestParams
from eventfleet_server.engine import Engine
from eventfleet_server.storage import StorageFaultError
from eventfleet_server.storage.merge_rows import RowEvents
from eventfleet_server.syncer.client import (
    InitRefusedError,
    Peer,
    SyncerClientLimits,
    SyncStream,
)
from eventfleet_server.syncer.merger import Merger
from eventfleet_server.syncer.wire import MAX_ID, ProtocolError

log = logging.getLogger(__name__)

SYNC_TYPE_PREFIX = "event"
SYNC_TYPE_WORD = "synced"


def sync_state_type(own_server_id: int, peer_server_id: int) -> EventType:
    """``('event', <local>, 'synced', <remote>)`` as hat-event registers it."""
    return (SYNC_TYPE_PREFIX, str(own_server_id), SYNC_TYPE_WORD, str(peer_server_id))


def ids_named_by(event_type: EventType) -> tuple[int, ...]:
    if (
        len(event_type) == 4
        and event_type[0] == SYNC_TYPE_PREFIX
        and event_type[2] == SYNC_TYPE_WORD
        and event_type[1].isdigit()
        and event_type[3].isdigit()
    ):
        ids = (int(event_type[1]), int(event_type[3]))
        return tuple(i for i in ids if 1 <= i <= MAX_ID)
    return ()


def ids_from_sync_event(event: Event) -> tuple[int, ...]:
    """Server ids a sync-state event names, if it is genuine: only server N registers
    ``('event', N, 'synced', M)``. One registered by anyone else (a client of an older
    replica, a forgery) names nothing — it must not start relay streams."""
    ids = ids_named_by(event.type)
    if ids and int(event.type[1]) != event.id.server:
        return ()
    return ids


def _is_sync_type(event_type: EventType) -> bool:
    return bool(event_type) and event_type[0] == SYNC_TYPE_PREFIX


@dataclasses.dataclass(frozen=True)
class Attempt:
    """How one Syncer connection ended: ``error`` is None when it ended normally;
    ``refused`` when the peer answered the init with an error (it holds none of the
    requested server's events), which callers treat as an answer, not a failure."""

    error: str | None = None
    refused: bool = False


class Backoff:
    """Reconnect delays: doubling from `low` to `high`, with jitter (no thundering herd)."""

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high
        self.delay = low

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.delay * 2, self.high)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.delay = self.low


StateCb = Callable[["PeerLink", str], None]


class PeerLink:
    """Every stream this replica pulls from one peer."""

    def __init__(self, mesh: Mesh, peer: Peer):
        self.mesh = mesh
        self.peer = peer
        self.state = "disconnected"
        self.state_since = time.time()
        self.epoch = 0  # +1 each time the direct stream connects
        self.attempts = 0  # direct connection attempts
        self.ever_synced = False
        self.last_synced_at: float | None = None
        self.last_error: str | None = None
        self.stopping = False  # removed from the peer list, or this replica is stopping
        self.direct = mesh.make_stream(peer, peer.server_id, self._on_direct_change)
        self.streams: dict[int, SyncStream] = {peer.server_id: self.direct}
        self._tasks: dict[int, asyncio.Task] = {}
        self._group = mesh.tasks.group(f"peer:{peer.name}")

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        # The direct and own-id loops run as long as the link: their exit is fatal. A
        # relay ends by itself when the relayed server id is not needed through this peer.
        self._spawn(self.peer.server_id, self._direct_loop(), "direct", critical=True)
        self._spawn(self.mesh.own_server_id, self._own_loop(), "own", critical=True)
        self.ensure(self.mesh.known_server_ids())

    def ensure(self, server_ids: set[int]) -> None:
        """Start relay streams for server ids not pulled from this peer yet."""
        for server_id in server_ids:
            if server_id not in self._tasks:
                self._spawn(server_id, self._relay_loop(server_id), f"relay:{server_id}")

    def _spawn(self, server_id: int, coro, name: str, *, critical: bool = False) -> None:
        self._tasks[server_id] = self._group.spawn(name, coro, critical=critical)

    async def stop(self) -> None:
        self.stopping = True
        self.mesh.notify()
        for stream in self.streams.values():
            stream.close()
        await self._group.close()
        self._tasks.clear()
        self._set_state("disconnected")

    def poke(self) -> None:
        for stream in self.streams.values():
            stream.poke()

    # -- state --------------------------------------------------------------------------

    def _on_direct_change(self, stream: SyncStream) -> None:
        stats = stream.stats
        if stats.synced:
            state = "synced"
        elif stats.connected and stats.history_events:
            state = "syncing"
        elif stats.connected:
            state = "connected"
        else:
            state = "disconnected"
        if state == "connected" and self.state == "disconnected":
            self.epoch += 1
        self._set_state(state)

    def _set_state(self, state: str) -> None:
        if state == self.state:
            return
        previous, self.state = self.state, state
        now = time.time()
        if previous == "synced":
            self.last_synced_at = now
        if state == "synced":
            self.ever_synced = True
            self.last_synced_at = now
            self.last_error = None
        self.state_since = now
        # Losing a synced peer deserves attention; our own stop or a removal does not.
        level = logging.WARNING if previous == "synced" and not self.stopping else logging.INFO
        log.log(
            level,
            "syncer peer=%s server_id=%s %s -> %s%s",
            self.peer.name,
            self.peer.server_id,
            previous,
            state,
            f" ({self.direct.stats.history_events} history events)" if state == "synced" else "",
        )
        self.mesh.on_state(self, state)

    # -- streams ------------------------------------------------------------------------

    async def _attempt(self, stream: SyncStream, **kwargs) -> Attempt:
        """Run one connection; how it ended (``error`` is None if it ended normally)."""
        try:
            await stream.run(**kwargs)
            return Attempt()
        except asyncio.CancelledError:
            raise
        except InitRefusedError as e:
            return Attempt(f"refused by the peer: {e}", refused=True)
        except ProtocolError as e:
            return Attempt(f"protocol error: {e}")
        except (ConnectionError, OSError, TimeoutError) as e:
            return Attempt(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        except StorageFaultError as e:
            # Our own disk (full, read-only, I/O error), named by the engine's log and
            # /readyz: an expected end of this connection, retried, no traceback.
            return Attempt(f"storage failing: {e}")
        except Exception as e:
            log.exception("syncer %s failed", stream.label)
            return Attempt(repr(e))

    async def _direct_loop(self) -> None:
        mesh = self.mesh
        backoff = Backoff(mesh.reconnect_min_delay, mesh.reconnect_max_delay)
        while not self.stopping:
            self.attempts += 1
            error = (await self._attempt(self.direct)).error
            if error is None:
                backoff.reset()  # a synced connection ended: reconnect quickly
            delay = backoff.next()
            if error is not None:
                if error != self.last_error:
                    log.warning(
                        "syncer peer=%s (%s) server_id=%s: %s; retrying in %.1f s",
                        self.peer.name,
                        self.peer.address,
                        self.peer.server_id,
                        error,
                        delay,
                    )
                self.last_error = error
            mesh.notify()
            await asyncio.sleep(delay)

    async def _own_loop(self) -> None:
        """Catch up on our own server id once per direct connection (epoch)."""
        mesh = self.mesh
        stream = mesh.make_stream(self.peer, mesh.own_server_id, None)
        self.streams[mesh.own_server_id] = stream
        backoff = Backoff(mesh.reconnect_min_delay, mesh.reconnect_max_delay)
        done_epoch = 0
        while True:
            await mesh.wait_for(
                lambda done=done_epoch: (
                    self.stopping or (self.epoch > done and self.state != "disconnected")
                )
            )
            if self.stopping:
                return  # belt and braces: a lost cancellation must not keep us looping
            epoch = self.epoch
            attempt = await self._attempt(stream, until_synced=True)
            if attempt.error is None or attempt.refused:
                done_epoch = epoch  # refused: the peer holds none of our events
                backoff.reset()
                if attempt.refused:
                    log.info(
                        "syncer peer=%s: own events not held (%s)", self.peer.name, attempt.error
                    )
                continue
            await asyncio.sleep(backoff.next())

    async def _relay_loop(self, server_id: int) -> None:
        """Pull `server_id` (not the peer's own) through this peer when needed."""
        mesh = self.mesh
        if server_id in (self.peer.server_id, mesh.own_server_id):
            return
        stream = mesh.make_stream(self.peer, server_id, None)
        self.streams[server_id] = stream
        backoff = Backoff(mesh.reconnect_min_delay, mesh.reconnect_max_delay)
        done_epoch = 0

        def needed() -> bool:
            if self.stopping:
                return True
            if self.state not in ("synced", "syncing", "connected"):
                return False
            return self.epoch > done_epoch or not mesh.direct_synced(server_id)

        while True:
            await mesh.wait_for(needed)
            if self.stopping:
                return
            epoch = self.epoch
            attempt = await self._attempt(stream, stop_when=lambda: mesh.direct_synced(server_id))
            if attempt.error is None:
                done_epoch = epoch
                backoff.reset()
                continue
            if attempt.refused:
                done_epoch = epoch
                log.info(
                    "syncer peer=%s: no relay of server_id=%s (%s)",
                    self.peer.name,
                    server_id,
                    attempt.error,
                )
            await asyncio.sleep(backoff.next())


class Mesh:
    """The client side of the full mesh: a `PeerLink` per configured peer."""

    def __init__(
        self,
        engine: Engine,
        merger: Merger,
        *,
        client_name: str,
        token: str | Callable[[], str | None] | None,
        subscriptions: list[EventType],
        limits: SyncerClientLimits = SyncerClientLimits(),
        reconnect_min_delay: float = 0.5,
        reconnect_max_delay: float = 30.0,
        state_cb: StateCb | None = None,
        tasks: Tasks,
        max_server_ids: int = 1000,
        ssl=None,
    ):
        self.ssl = ssl  # ssl.SSLContext for the links (mutual TLS), None: plain TCP
        self.engine = engine
        self.merger = merger
        self.tasks = tasks
        self.own_server_id = engine.server_id
        self.client_name = client_name
        self.token = token
        self.subscriptions = subscriptions
        self.limits = limits
        self.reconnect_min_delay = reconnect_min_delay
        self.reconnect_max_delay = reconnect_max_delay
        self.links: dict[str, PeerLink] = {}
        self.peers: list[Peer] = []
        self._state_cb = state_cb
        self._seen: set[int] = set()  # server ids held or named by sync-state events
        self.max_server_ids = max_server_ids
        self._cap_logged = -math.inf
        # Replaced by a fresh Event on each change; waiters re-check their condition.
        # (Not asyncio.Condition: on Python 3.11 a waiter cancelled while it is being
        # notified can deadlock re-acquiring the condition's lock.)
        self._changed = asyncio.Event()
        self._notify_pending = False
        self._running = False
        self._stopping: set[asyncio.Task] = set()  # links being stopped (kept referenced)

    def make_stream(self, peer: Peer, server_id: int, on_change) -> SyncStream:
        def changed(stream: SyncStream) -> None:
            if on_change:
                on_change(stream)
            self.notify()

        return SyncStream(
            peer,
            server_id,
            client_name=self.client_name,
            token=self.token,
            subscriptions=self.subscriptions,
            storage=self.engine.storage,
            merger=self.merger,
            limits=self.limits,
            on_change=changed,
            ssl=self.ssl,
        )

    # -- known server ids ---------------------------------------------------------------

    async def load_named_ids(self) -> None:
        """Server ids named by stored sync-state events (for a wiped or new replica)."""
        pattern = (SYNC_TYPE_PREFIX, "?", SYNC_TYPE_WORD, "?")
        result = await self.engine.storage.query(QueryLatestParams([pattern]))
        self._add_seen({i for e in result.events for i in ids_from_sync_event(e)})

    def _add_seen(self, new: set[int]) -> bool:
        """Remember `new` server ids up to `max_server_ids`; True if any was added.

        Each known id costs a relay stream per peer: past the cap further ids are
        ignored (their events are still stored when they arrive) and logged.
        """
        room = self.max_server_ids - len(self._seen)
        new = new - self._seen
        if len(new) > room:
            ignored = sorted(new)[max(room, 0) :]
            new = set(sorted(new)[: max(room, 0)])
            now = time.monotonic()
            if now - self._cap_logged > 60:
                self._cap_logged = now
                log.error(
                    "syncer: %d known server ids reached max_known_server_ids %d; "
                    "not relaying server ids %s%s",
                    len(self._seen) + len(new),
                    self.max_server_ids,
                    ignored[:10],
                    "..." if len(ignored) > 10 else "",
                )
        self._seen |= new
        return bool(new)

    def known_server_ids(self) -> set[int]:
        ids = {self.own_server_id, *self.engine.storage.last_ids, *self._seen}
        ids.update(p.server_id for p in self.peers)
        return ids

    def on_committed(self, events: Sequence[Event]) -> None:
        """Merger callback: start relays for server ids seen for the first time."""
        new: set[int] = set()
        if isinstance(events, RowEvents):
            # Merged rows: their server ids and types without building every event.
            new.update(events.server_ids())
            for e in events.of_types(_is_sync_type):
                new.update(ids_from_sync_event(e))
        else:
            for e in events:
                if e.id.server not in self._seen:
                    new.add(e.id.server)
                if _is_sync_type(e.type):
                    new.update(ids_from_sync_event(e))
        new -= self._seen
        if not new or not self._add_seen(new):
            return
        if self._running:
            ids = self.known_server_ids()
            for link in self.links.values():
                link.ensure(ids)

    def direct_synced(self, server_id: int) -> bool:
        return any(
            link.peer.server_id == server_id and link.state == "synced"
            for link in self.links.values()
        )

    # -- peers --------------------------------------------------------------------------

    def set_peers(self, peers: list[Peer]) -> None:
        """Apply a new peer list: start, stop or restart links (by name)."""
        wanted = {p.name: p for p in peers}
        self.peers = list(peers)
        if not self._running:
            return
        for name, link in list(self.links.items()):
            if wanted.get(name) != link.peer:
                log.info("syncer peer=%s (%s) removed", name, link.peer.address)
                del self.links[name]
                task = asyncio.get_running_loop().create_task(link.stop())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        for name, peer in wanted.items():
            if name not in self.links:
                log.info(
                    "syncer peer=%s (%s) server_id=%s added", name, peer.address, peer.server_id
                )
                link = PeerLink(self, peer)
                self.links[name] = link
                link.start()
        ids = self.known_server_ids()
        for link in self.links.values():
            link.ensure(ids)
        self.notify()

    def start(self) -> None:
        self._running = True
        self.set_peers(self.peers)

    async def stop(self) -> None:
        self._running = False
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.stop() for link in links), return_exceptions=True)

    # -- change notification --------------------------------------------------------------

    def on_state(self, link: PeerLink, state: str) -> None:
        if self._state_cb:
            self._state_cb(link, state)
        self.notify()

    def notify(self) -> None:
        """Wake every waiter to re-check its condition (coalesced per loop turn)."""
        if self._notify_pending:
            return
        self._notify_pending = True
        asyncio.get_running_loop().call_soon(self._do_notify)

    def _do_notify(self) -> None:
        self._notify_pending = False
        for link in self.links.values():
            link.poke()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` is true (re-checked after every change)."""
        while not predicate():
            await self._changed.wait()
