"""Syncer server: serves the events this replica holds to Syncer clients (its peers).

Per connection: ``MsgInitReq`` → ``MsgInitRes`` at once; history after ``lastEventId``
in ``MsgEvents`` (one session each, ascending ids); ``MsgSynced``; then what was
committed meanwhile (buffered since the init) and live events. Only committed events
are ever sent: the engine listener is used with ``persisted=True`` only, and history
comes from storage. Every ``MsgEvents`` is an SBS array joined from the events'
stored bytes (the engine's and the storage's ``sbs``): nothing is encoded here and the
history builds no object per event. See docs/syncer.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from eventfleet_server import chatter
from eventfleet_server.chatter import ChatterListener, InitRejected
from eventfleet_server.common import codec
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import Event, Status
from eventfleet_server.engine import Engine
from eventfleet_server.engine.fanout import SlicedFanout
from eventfleet_server.listener import AdmissionLimits, Rejections, RejectReason, TokenPolicy
from eventfleet_server.syncer import wire
from eventfleet_server.syncer.session import SyncerSession
from eventfleet_server.syncer.wire import InitReq, ProtocolError

log = logging.getLogger(__name__)


# Events per MsgEvents when a large session is sent to peers in slices.
FANOUT_SLICE = 256


@dataclass(frozen=True)
class SyncerServerLimits:
    """Per-session bounds of the Syncer server (connection bounds: `AdmissionLimits`)."""

    history_page: int = 5_000
    # Events committed while a connection is still sending history are buffered; more
    # than this and the peer is dropped as too slow (it reconnects and resumes).
    max_buffered_events: int = 200_000
    # Unsent bytes to a live peer before it is dropped as not reading.
    max_write_buffer: int = 64 * 1024 * 1024
    # A history write that cannot drain for this long: the peer stopped reading.
    send_timeout: float = 30.0
    ping_delay: float = 20.0
    ping_timeout: float = 20.0


class SyncerServer:
    """Serves Syncer on host:port from one engine's store.

    `known_server_ids` returns server ids this replica may be asked about besides those
    it holds events of (its peers' ids): a request for any other id is refused.
    """

    def __init__(
        self,
        engine: Engine,
        host: str,
        port: int,
        *,
        token: str | Callable[[], TokenPolicy] | None = None,
        known_server_ids: Callable[[], set[int]] = set,
        limits: SyncerServerLimits = SyncerServerLimits(),
        admission: AdmissionLimits = AdmissionLimits(max_msg_size=64 * 1024 * 1024),
        ssl=None,
        tasks: Tasks,
    ):
        self._engine = engine
        self._tasks = tasks
        # Peers must be configured alike: a token is required when we have one and
        # refused when we have none (the seed's "configuration synchronization").
        # A callable gives the current policy (peer-token rotation).
        self._tokens: Callable[[], TokenPolicy] = (
            token
            if callable(token)
            else (lambda policy=TokenPolicy.of(token, refuse_unexpected=True): policy)
        )
        self._known = known_server_ids
        self._limits = limits
        self.rejections = Rejections("syncer")
        self._listener = ChatterListener(
            "syncer",
            host,
            port,
            init_type=wire.INIT_REQ,
            initialize=self._initialize,
            limits=admission,
            rejections=self.rejections,
            ping_delay=limits.ping_delay,
            ping_timeout=limits.ping_timeout,
            ssl=ssl,
        )
        self._sessions: dict[int, set[SyncerSession]] = {}  # served server id -> sessions
        self._unsubscribe: Callable[[], None] | None = None
        # Large committed sessions go to peers a slice at a time from a task, in order
        # with everything after them, so encoding 16 MiB never holds the loop at once.
        self._fanout_tasks = tasks.group("fan-out")
        # Each slice is one MsgEvents of one session (a part of it), in order.
        self._fanout = SlicedFanout(
            self._deliver,
            FANOUT_SLICE,
            lambda name, coro: self._fanout_tasks.spawn(name, coro, critical=False),
        )

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        return self._listener.port

    @property
    def rejected(self) -> dict[str, int]:
        return self.rejections.counts

    def sessions(self) -> list[SyncerSession]:
        return [s for group in self._sessions.values() for s in group]

    def connections(self) -> list[dict]:
        """One dict per client connection (for status pages)."""
        return [s.describe() for s in self.sessions()]

    async def start(self) -> None:
        self._unsubscribe = self._engine.add_sbs_listener(self._on_events)
        await self._listener.start()
        log.info("syncer listening on port %s", self.port)

    async def flush_all(self, timeout: float) -> dict[str, bool]:
        """Ask every connected client to confirm it committed what it was sent.

        Used on graceful shutdown: returns ``{client name: confirmed}``.
        """
        sessions = self.sessions()
        results = await asyncio.gather(*(s.flush(timeout) for s in sessions))
        out: dict[str, bool] = {}
        for s, ok in zip(sessions, results, strict=True):
            out[s.label] = ok
        return out

    async def flush_client(self, names: set[str], timeout: float) -> bool | None:
        """Flush every connection of a client named in `names`.

        True when the stream of this replica's own events answered and every other
        stream either answered or ended meanwhile (a catch-up closing after
        ``MsgSynced``); None if the client has no stream of our own events.
        """
        own = self._engine.server_id
        sessions = [s for s in self.sessions() if s.name in names]
        if not any(s.server_id == own for s in sessions):
            return None
        results = await asyncio.gather(*(s.flush(timeout) for s in sessions))
        return all(
            ok or (s.server_id != own and s.conn.is_closed)
            for s, ok in zip(sessions, results, strict=True)
        ) and any(ok and s.server_id == own for s, ok in zip(sessions, results, strict=True))

    async def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
            self._unsubscribe = None
        await self._fanout_tasks.close()
        await self._listener.stop()

    # -- fan-out of committed events ---------------------------------------------------------

    def _on_events(self, events: list[Event], sbs: list[bytes], persisted: bool) -> None:
        if not persisted:
            return  # peers only ever get committed events
        if not self._sessions.get(events[0].id.server):
            return
        self._fanout.push(events, sbs)

    def _deliver(self, events: list[Event], sbs: list[bytes]) -> None:
        sessions = self._sessions.get(events[0].id.server)
        if not sessions:
            return
        encoded_all: bytes | None = None
        last = events[-1].id.instance
        for session in list(sessions):
            if last <= session.req.last_event_id.instance:
                continue  # all at or below what the client already holds
            selected, selected_sbs = session.select(events, sbs)
            if not selected:
                continue
            if len(selected) == len(events) and encoded_all is None:
                encoded_all = codec.events_array(sbs)
            try:
                session.on_live(
                    selected, selected_sbs, encoded_all if len(selected) == len(events) else None
                )
            except Exception as e:
                # One peer's failure (a transport closed under us: uvloop raises
                # RuntimeError, not ConnectionError) must not cost the other peers these
                # events: they would be missing, with later ones held, for good. This
                # peer is closed; it reconnects and resumes after its last held id.
                log.warning("syncer client %s: live send failed, closing: %r", session.label, e)
                with contextlib.suppress(Exception):
                    session.conn.close(f"syncer client {session.label}: live send failed: {e!r}")

    # -- connections -------------------------------------------------------------------------

    async def _initialize(self, conn: chatter.Connection, msg: chatter.Msg) -> SyncerSession:
        try:
            req = wire.decode_init_req(msg.data)
        except ProtocolError as e:
            raise _init_error(RejectReason.BAD_MESSAGE, str(e), None) from e
        error, reason = self._check(req)
        if error:
            raise _init_error(reason, error, req.client_name)
        conn.send(wire.INIT_RES, wire.encode_init_res(None), conv=msg.conv)
        log.info(
            "syncer client %r connected from %s: server_id=%s after=%s subscriptions=%s",
            req.client_name,
            conn.peer,
            req.last_event_id.server,
            tuple(req.last_event_id),
            [list(p) for p in req.subscription.patterns],
        )
        return SyncerSession(self, conn, req)

    def _register(self, session: SyncerSession) -> None:
        # Registered before history is read: whatever commits from now on is buffered.
        self._sessions.setdefault(session.server_id, set()).add(session)

    def _unregister(self, session: SyncerSession) -> None:
        group = self._sessions.get(session.server_id)
        if group is not None:
            group.discard(session)
            if not group:
                self._sessions.pop(session.server_id, None)
        log.info(
            "syncer client %s disconnected: sent=%d%s",
            session.label,
            session.sent_events,
            f" reason={session.conn.close_reason}" if session.conn.close_reason else "",
        )

    def _check(self, req: InitReq) -> tuple[str | None, RejectReason | None]:
        """(error text, rejection reason) or (None, None)."""
        if self._tokens().check(req.client_token) is not None:
            return "invalid client token", RejectReason.BAD_TOKEN
        server_id = req.last_event_id.server
        own = self._engine.server_id
        held = self._engine.storage.last_ids
        if server_id != own and server_id not in held and server_id not in self._known():
            return (
                f"server id {server_id} is unknown here: not this replica's ({own}), "
                "not a peer's, and no event of it is held",
                RejectReason.UNKNOWN_SERVER,
            )
        if server_id == own and self._engine.status != Status.STANDBY:
            last = self._engine.last_id
            after = req.last_event_id
            if after.instance > last.instance or after.session > last.session:
                return (
                    f"lastEventId {tuple(after)} is from the future: this server's last "
                    f"id is {tuple(last)}",
                    RejectReason.FUTURE_ID,
                )
        return None, None


def _init_error(reason: RejectReason, error: str, name: str | None) -> InitRejected:
    return InitRejected(reason, error, (wire.INIT_RES, wire.encode_init_res(error)), name)
