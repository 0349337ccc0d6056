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
import time
from collections import deque
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
from eventfleet_server.syncer import wire as protocol
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
            init_type=protocol.INIT_REQ,
            initialize=self._initialize,
            limits=admission,
            rejections=self.rejections,
            ping_delay=limits.ping_delay,
            ping_timeout=limits.ping_timeout,
            ssl=ssl,
        )
        self._sessions: dict[int, set[_Session]] = {}  # served server id -> sessions
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

    def sessions(self) -> list[_Session]:
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

    async def _initialize(self, conn: chatter.Connection, msg: chatter.Msg) -> _Session:
        try:
            req = protocol.decode_init_req(msg.data)
        except ProtocolError as e:
            raise _init_error(RejectReason.BAD_MESSAGE, str(e), None) from e
        error, reason = self._check(req)
        if error:
            raise _init_error(reason, error, req.client_name)
        conn.send(protocol.INIT_RES, protocol.encode_init_res(None), conv=msg.conv)
        log.info(
            "syncer client %r connected from %s: server_id=%s after=%s subscriptions=%s",
            req.client_name,
            conn.peer,
            req.last_event_id.server,
            tuple(req.last_event_id),
            [list(p) for p in req.subscription.patterns],
        )
        return _Session(self, conn, req)

    def _register(self, session: _Session) -> None:
        # Registered before history is read: whatever commits from now on is buffered.
        self._sessions.setdefault(session.server_id, set()).add(session)

    def _unregister(self, session: _Session) -> None:
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
    return InitRejected(reason, error, (protocol.INIT_RES, protocol.encode_init_res(error)), name)


class _Session:
    """One initialized Syncer client connection serving one server id."""

    def __init__(self, server: SyncerServer, conn: chatter.Connection, req: InitReq):
        self.server = server
        self.conn = conn
        self.req = req
        self.name = req.client_name
        self.server_id = req.last_event_id.server
        self.label = f"{req.client_name!r} ({conn.peer}) server_id={self.server_id}"
        self.live = False
        self.synced = asyncio.get_running_loop().create_future()
        self.sent_events = 0
        self.last_sent = req.last_event_id.instance
        self.connected_at = time.time()
        self._limits = server._limits
        self._buffer: deque[tuple[list[Event], list[bytes]]] = deque()
        self._buffered = 0
        self._flushes: dict[chatter.Conversation, asyncio.Future] = {}

    def describe(self) -> dict:
        return {
            "client": self.name,
            "peer": self.conn.peer,
            "server_id": self.server_id,
            "state": "live" if self.live else "history",
            "sent_events": self.sent_events,
            "last_sent_instance": self.last_sent,
        }

    def select(self, events: list[Event], sbs: list[bytes]) -> tuple[list[Event], list[bytes]]:
        """The subscribed events and their bytes (`sbs`, aligned with `events`)."""
        sub = self.req.subscription
        if sub.matches_all:
            return events, sbs
        if sub.is_empty:
            return [], []
        keep = [i for i, e in enumerate(events) if sub.matches(e.type)]
        return [events[i] for i in keep], [sbs[i] for i in keep]

    # -- live ------------------------------------------------------------------------------

    def on_live(self, events: list[Event], sbs: list[bytes], encoded: bytes | None) -> None:
        if self.conn.is_closed:
            return
        floor = self.req.last_event_id.instance
        if events[0].id.instance <= floor:
            # The client asked for ids above `lastEventId` only: it holds these (a
            # relayed older event, or our own events echoed back by a merge).
            events, sbs = _above(events, sbs, floor)
            encoded = None
            if not events:
                return
        if not self.live:
            self._buffer.append((events, sbs))
            self._buffered += len(events)
            if self._buffered > self._limits.max_buffered_events:
                self._drop(
                    f"too slow, {self._buffered} events buffered during history "
                    f"(limit {self._limits.max_buffered_events})"
                )
            return
        self._send(sbs, events[-1].id.instance, encoded)
        if self.conn.write_buffer_size > self._limits.max_write_buffer:
            self._drop(
                f"not reading, {self.conn.write_buffer_size} bytes unsent "
                f"(limit {self._limits.max_write_buffer})"
            )

    def _drop(self, why: str) -> None:
        """Close a peer that does not keep up, without waiting for it to read (a plain
        close would keep the socket until the unsent bytes are read, which a peer that
        stopped reading never does)."""
        chatter.refuse(
            self.conn,
            self.server.rejections,
            RejectReason.SLOW_PEER,
            f"syncer client {self.label}: {why}",
            abort=True,
        )

    def _send(self, sbs: list[bytes], last_instance: int, encoded: bytes | None = None) -> None:
        """One MsgEvents of one session: the stored bytes `sbs` joined behind their count
        (or `encoded`, that message already joined); `last_instance` is its last id."""
        data = encoded if encoded is not None else codec.events_array(sbs)
        try:
            self.conn.send(protocol.EVENTS, data)
        except ConnectionError:
            return
        self.sent_events += len(sbs)
        self.last_sent = max(self.last_sent, last_instance)

    # -- flush -----------------------------------------------------------------------------

    async def flush(self, timeout: float) -> bool:
        """MsgFlushReq once synced; True when MsgFlushRes arrives within `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self.synced)
                fut = asyncio.get_running_loop().create_future()
                conv = self.conn.send(protocol.FLUSH_REQ, protocol.encode_none(), last=False)
                self._flushes[conv] = fut
                try:
                    await fut
                finally:
                    self._flushes.pop(conv, None)
            return True
        except (TimeoutError, ConnectionError):
            return False

    # -- the connection ----------------------------------------------------------------------

    async def run(self) -> None:
        self.server._register(self)
        try:
            await self._run()
        finally:
            self.server._unregister(self)

    async def _run(self) -> None:
        tasks = self.server._tasks.group(f"peer:{self.conn.peer}")
        reader = tasks.spawn("reader", self._read_loop(), critical=False)
        try:
            history = tasks.spawn("history", self._send_history(), critical=False)
            done, _ = await asyncio.wait({reader, history}, return_when=asyncio.FIRST_COMPLETED)
            if history in done and history.exception() is None:
                await reader  # live from here on: events go out from `on_live`
            else:
                history.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await history
                if history in done and history.exception() is not None:
                    err = history.exception()
                    if not isinstance(err, ConnectionError):
                        log.error("syncer client %s: history failed: %r", self.label, err)
                    self.conn.close(f"syncer client {self.label}: history failed: {err}")
        finally:
            await tasks.close()
            self.conn.close()
            for fut in self._flushes.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("connection closed"))
            if not self.synced.done():
                self.synced.set_exception(ConnectionError("connection closed"))
                self.synced.exception()  # retrieved: nobody may be waiting

    async def _send_history(self) -> None:
        storage = self.server._engine.storage
        page_size = self._limits.history_page
        after = self.req.last_event_id.instance
        sub = self.req.subscription
        wanted: dict[int, bool] = {}  # type id -> subscribed (only for a partial subscription)
        group: list[bytes] = []  # held back: the next page may continue its session
        group_session = group_last = 0
        started = time.monotonic()
        loop = asyncio.get_running_loop()

        def read(after: int) -> asyncio.Task:
            return loop.create_task(storage.read_server_stream(self.server_id, after, page_size))

        # The next page is read (storage's reader thread) while this one is sent (event
        # loop): catch-up throughput is the slower of the two, not the sum. Rows are
        # (session, instance, type id, stored bytes): one MsgEvents per session.
        pending: asyncio.Task | None = read(after)
        try:
            while pending is not None:
                page = await pending
                pending = read(page[-1][1]) if len(page) == page_size else None
                if sub.is_empty:
                    continue
                for session, instance, type_id, sbs in page:
                    if not sub.matches_all:
                        ok = wanted.get(type_id)
                        if ok is None:
                            ok = wanted[type_id] = sub.matches(storage.type_of(type_id))
                        if not ok:
                            continue
                    if group and group_session != session:
                        self._send(group, group_last)
                        group = []
                    group_session, group_last = session, instance
                    group.append(sbs)
                await self._drain()
        finally:
            if pending is not None:
                pending.cancel()
        if group:
            self._send(group, group_last)
        self.conn.send(protocol.SYNCED, protocol.encode_none())
        history = self.sent_events
        # Committed after the init: sent now, after MsgSynced. Those also read as
        # history (committed between the listener and the read) are skipped.
        while self._buffer:
            events, sbs = _above(*self._buffer.popleft(), self.last_sent)
            if events:
                self._send(sbs, events[-1].id.instance)
        self._buffered = 0
        self.live = True
        self.synced.set_result(None)
        log.info(
            "syncer client %s synced: %d history events in %.2f s, last instance %d",
            self.label,
            history,
            time.monotonic() - started,
            self.last_sent,
        )

    async def _drain(self) -> None:
        try:
            async with asyncio.timeout(self._limits.send_timeout):
                await self.conn.drain()
        except TimeoutError:
            self._drop(f"not reading, history write blocked for {self._limits.send_timeout} s")
            raise ConnectionError("peer stopped reading") from None

    async def _read_loop(self) -> None:
        """The client only ever sends MsgFlushRes after the init."""
        label = f"syncer client {self.label}"
        async for msg in chatter.messages(self.conn, self.server.rejections, label):
            if msg.type == protocol.FLUSH_RES:
                fut = self._flushes.get(msg.conv)
                if fut is not None and not fut.done():
                    fut.set_result(None)
                continue
            chatter.refuse(
                self.conn,
                self.server.rejections,
                RejectReason.UNEXPECTED_MESSAGE,
                f"{label}: unexpected message {msg.type!r}",
            )
            return


def _above(events: list[Event], sbs: list[bytes], floor: int) -> tuple[list[Event], list[bytes]]:
    """The events (and their bytes) with instance above `floor`."""
    keep = [i for i, e in enumerate(events) if e.id.instance > floor]
    return [events[i] for i in keep], [sbs[i] for i in keep]
