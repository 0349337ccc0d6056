"""Eventer server: one chatter listener, one `EventerSession` (session.py) per client connection."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from eventfleet_server import chatter
from eventfleet_server.chatter import ChatterListener, InitRejected
from eventfleet_server.common import codec
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import Event, Status
from eventfleet_server.common.subscription import InvalidSubscriptionError, Subscription
from eventfleet_server.engine import Engine
from eventfleet_server.engine.fanout import SlicedFanout
from eventfleet_server.eventer.session import EventerSession
from eventfleet_server.eventer.wire import (
    CHUNK_EVENTS,
    BadRequest,
    RegisterLimits,
    decode_init_req,
)
from eventfleet_server.listener import AdmissionLimits, Rejections, RejectReason, TokenPolicy
from eventfleet_server.plugin import ProtocolServer

log = logging.getLogger(__name__)

_P = "HatEventer."


@dataclass(frozen=True)
class EventerLimits:
    """Per-session bounds; see docs/eventer.md for the slow-subscriber policy.

    Connection-level bounds (caps, message sizes, init timeout) are the listener's
    `AdmissionLimits`.
    """

    # A notify with last=false (asking for MsgEventsAck) every `ack_every` notifies;
    # at most `ack_window` of those unanswered before notifies are queued instead.
    ack_every: int = 32
    ack_window: int = 4
    # Queued (not yet sent) events per connection before it is dropped as too slow.
    max_queued_events: int = 100_000
    max_concurrent_queries: int = 4
    ping_delay: float = 20.0
    ping_timeout: float = 20.0
    # Bytes queued on a connection's socket (replies and notifies the client has not
    # read) before it is closed as not reading, whatever it still sends.
    max_write_buffer: int = 64 * 1024 * 1024
    # Seconds a query reply may take to drain before the client is closed; the query
    # slot is held until then, so a client that does not read cannot pile up replies.
    send_timeout: float = 60.0
    register: RegisterLimits = RegisterLimits()  # noqa: RUF009 (frozen, immutable)
    max_latest_results: int = 10_000


class EventerServer(ProtocolServer):
    """Serves Eventer on host:port for one engine: an adapter between the chatter
    listener (admission, init sequence) and the engine (register, query, fan-out)."""

    name = "eventer"

    def __init__(
        self,
        engine: Engine,
        host: str,
        port: int,
        *,
        tokens: TokenPolicy | Callable[[], TokenPolicy] | None = None,
        limits: EventerLimits = EventerLimits(),
        admission: AdmissionLimits = AdmissionLimits(),
        tasks: Tasks,
        ssl=None,
    ):
        self._engine = engine
        self._tasks = tasks
        # Large sessions are fanned out a slice at a time by a task, in order with
        # everything queued after them (see `_on_events`).
        self._fanout = SlicedFanout(
            self._deliver,
            CHUNK_EVENTS,
            lambda name, coro: self._tasks.spawn(name, coro, critical=False),
        )
        # A policy, or a function returning the current one (token rotation). Without
        # one: open, but a token sent to a server that has none is refused.
        policy = tokens if tokens is not None else TokenPolicy(refuse_unexpected=True)
        self._tokens: Callable[[], TokenPolicy] = (
            policy if callable(policy) and not isinstance(policy, TokenPolicy) else lambda: policy
        )
        self._limits = limits
        self.rejections = Rejections("eventer")
        self._listener = ChatterListener(
            "eventer",
            host,
            port,
            init_type=_P + "MsgInitReq",
            initialize=self._initialize,
            limits=admission,
            rejections=self.rejections,
            ping_delay=limits.ping_delay,
            ping_timeout=limits.ping_timeout,
            ssl=ssl,
        )
        self._unsubscribe = []
        # Sessions holding MsgRegisterRes of the commit whose callbacks are running.
        self._replying: list[EventerSession] = []

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        return self._listener.port

    @property
    def connection_count(self) -> int:
        return len(self._listener.sessions)

    @property
    def rejected(self) -> dict[str, int]:
        return self.rejections.counts

    def health(self) -> str | None:
        return None

    def describe(self) -> dict:
        return {"port": self.port, "connections": self.connection_count}

    @property
    def _sessions(self) -> set[EventerSession]:
        return self._listener.sessions

    async def start(self) -> None:
        self._unsubscribe = [
            self._engine.add_sbs_listener(self._on_events),
            self._engine.add_status_listener(self._on_status),
            # Commit listeners run after every `done` of the commit: its answers leave
            # then, one write per connection (`EventerSession.flush_replies`).
            self._engine.add_commit_listener(self._flush_replies),
        ]
        await self._listener.start()
        log.info("eventer listening on port %s", self.port)

    async def stop(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        # No commit listener any more: answers queued from now on go at once
        # (`reply_pending`), those already queued now.
        self._flush_replies(0, 0.0)
        await self._listener.stop()
        await self._tasks.close()

    # -- fan-out -----------------------------------------------------------------------------

    def _on_events(self, events: list[Event], sbs: list[bytes], persisted: bool) -> None:
        self._fanout.push(events, sbs, persisted)

    def _deliver(self, events: list[Event], sbs: list[bytes], persisted: bool) -> None:
        # A MsgEventsNotify is an SBS array: the count and the events' stored bytes.
        encoded_all: bytes | None = None
        for session in self._sessions:
            if session.persisted != persisted or session.conn.is_closed:
                continue
            selected = session.select(events, sbs)
            if not selected:
                continue
            if len(selected) == len(events):
                # Most subscribers take the whole session: one message for all of them.
                if encoded_all is None:
                    encoded_all = codec.events_array(sbs)
                data = encoded_all
            else:
                data = codec.events_array(selected)
            try:
                session.notify(data, len(selected))
            except Exception as e:
                # One client's failure (a transport closed under us: uvloop raises
                # RuntimeError) must not cost the other subscribers this notification.
                log.warning("eventer client %r: notify failed, closing: %r", session.name, e)
                with contextlib.suppress(Exception):
                    session.conn.close(f"client {session.name!r}: notify failed: {e!r}")

    def reply_pending(self, session: EventerSession) -> bool:
        """`session` queued a MsgRegisterRes in the running commit's callbacks; False:
        send it now (stopping: no commit listener will flush it)."""
        if not self._unsubscribe:
            return False
        self._replying.append(session)
        return True

    def _flush_replies(self, count: int, seconds: float) -> None:
        sessions, self._replying = self._replying, []
        for session in sessions:
            try:
                session.flush_replies()
            except Exception as e:
                # As in `_deliver`: one client's transport failing must not cost the
                # other clients their answers.
                log.warning("eventer client %r: reply failed, closing: %r", session.name, e)
                with contextlib.suppress(Exception):
                    session.conn.close(f"client {session.name!r}: reply failed: {e!r}")

    def _on_status(self, status: Status) -> None:
        data = codec.repo.encode(_P + "MsgStatusNotify", codec.status_to_sbs(status))
        for session in list(self._sessions):
            with contextlib.suppress(ConnectionError):
                session.conn.send(_P + "MsgStatusNotify", data)

    # -- init ----------------------------------------------------------------------------------

    async def _initialize(self, conn: chatter.Connection, msg: chatter.Msg) -> EventerSession:
        try:
            # Untrusted bytes: bounds first (docs/security.md), the C decoder after.
            req = decode_init_req(msg.data)
        except BadRequest as e:
            raise _init_error(RejectReason.BAD_MESSAGE, str(e)) from e
        name = req["clientName"]
        token = req["clientToken"][1] if req["clientToken"][0] == "value" else None
        error = self._tokens().check(token, conn.address)
        if error is not None:
            # The text is what Hat clients show; it never says which token was expected.
            raise _init_error(
                RejectReason.BAD_TOKEN,
                "client token required" if token is None else "invalid client token",
                name,
            )
        try:
            subscription = Subscription(req["subscriptions"])
        except InvalidSubscriptionError as e:
            raise _init_error(RejectReason.BAD_SUBSCRIPTION, str(e), name) from e
        server_id = req["serverId"][1] if req["serverId"][0] == "value" else None
        res = codec.repo.encode(
            _P + "MsgInitRes", ("success", codec.status_to_sbs(self._engine.status))
        )
        conn.send(_P + "MsgInitRes", res, conv=msg.conv)
        log.info(
            "eventer client %r connected from %s (subscriptions=%s server_id=%s persisted=%s)",
            name,
            conn.peer,
            [list(p) for p in subscription.patterns],
            server_id,
            req["persisted"],
        )
        return EventerSession(self, conn, name, subscription, server_id, req["persisted"])


def _init_error(reason: RejectReason, error: str, name: str | None = None) -> InitRejected:
    reply = (_P + "MsgInitRes", codec.repo.encode(_P + "MsgInitRes", ("error", error)))
    return InitRejected(reason, error, reply, name)
