"""Eventer server: one chatter listener, one `_Session` per client connection."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections import deque
from dataclasses import dataclass

from eventfleet_server import chatter
from eventfleet_server.common import codec
from eventfleet_server.common.model import Event, QueryTimeseriesParams, Status
from eventfleet_server.common.subscription import InvalidSubscriptionError, Subscription
from eventfleet_server.engine import Engine, EngineError

log = logging.getLogger(__name__)

_P = "HatEventer."


@dataclass(frozen=True)
class EventerLimits:
    """Per-connection bounds; see docs/eventer.md for the slow-subscriber policy."""

    max_msg_size: int = 16 * 1024 * 1024
    init_timeout: float = 10.0
    init_error_close_timeout: float = 2.0
    # A notify with last=false (asking for MsgEventsAck) every `ack_every` notifies;
    # at most `ack_window` of those unanswered before notifies are queued instead.
    ack_every: int = 32
    ack_window: int = 4
    # Queued (not yet sent) events per connection before it is dropped as too slow.
    max_queued_events: int = 100_000
    max_concurrent_queries: int = 4
    ping_delay: float = 20.0
    ping_timeout: float = 20.0


class EventerServer:
    """Serves Eventer on host:port for one engine."""

    def __init__(
        self,
        engine: Engine,
        host: str,
        port: int,
        *,
        token: str | None = None,
        limits: EventerLimits = EventerLimits(),
    ):
        self._engine = engine
        self._host = host
        self._port = port
        self._token = token
        self._limits = limits
        self._sessions: set[_Session] = set()
        self._server: asyncio.Server | None = None
        self._unsubscribe = []
        self.rejected: dict[str, int] = {}

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    @property
    def connection_count(self) -> int:
        return len(self._sessions)

    async def start(self) -> None:
        self._unsubscribe = [
            self._engine.add_listener(self._on_events),
            self._engine.add_status_listener(self._on_status),
        ]
        self._server = await chatter.serve(
            self._on_connection,
            self._host,
            self._port,
            max_msg_size=self._limits.max_msg_size,
            ping_delay=self._limits.ping_delay,
            ping_timeout=self._limits.ping_timeout,
        )
        log.info("eventer listening on %s:%s", self._host, self.port)

    async def stop(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        if self._server:
            self._server.close()
        for session in list(self._sessions):
            session.conn.close()
        if self._server:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def _count_rejection(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    # -- fan-out -----------------------------------------------------------------------------

    def _on_events(self, events: list[Event], persisted: bool) -> None:
        encoded_all: bytes | None = None
        for session in self._sessions:
            if session.persisted != persisted or session.conn.is_closed:
                continue
            selected = session.select(events)
            if not selected:
                continue
            if len(selected) == len(events):
                # Most subscribers take the whole session: encode it once for all of them.
                if encoded_all is None:
                    encoded_all = _encode_events(events)
                data = encoded_all
            else:
                data = _encode_events(selected)
            session.notify(data, len(selected))

    def _on_status(self, status: Status) -> None:
        data = codec.repo.encode(_P + "MsgStatusNotify", codec.status_to_sbs(status))
        for session in list(self._sessions):
            with contextlib.suppress(ConnectionError):
                session.conn.send(_P + "MsgStatusNotify", data)

    # -- connections -------------------------------------------------------------------------

    async def _on_connection(self, conn: chatter.Connection) -> None:
        session = await self._initialize(conn)
        if session is None:
            return
        self._sessions.add(session)
        try:
            await session.run()
        finally:
            self._sessions.discard(session)
            log.info(
                "eventer client %r (%s) disconnected%s",
                session.name,
                conn.peer,
                f": {conn.close_reason}" if conn.close_reason else "",
            )

    async def _initialize(self, conn: chatter.Connection) -> _Session | None:
        try:
            msg = await asyncio.wait_for(conn.receive(), self._limits.init_timeout)
        except TimeoutError:
            self._count_rejection("init_timeout")
            conn.close(f"no MsgInitReq within {self._limits.init_timeout} s")
            return None
        except chatter.FrameError as e:
            self._count_rejection("bad_frame")
            conn.close(f"before init: {e}")
            return None
        except ConnectionError:
            return None
        if msg.type != _P + "MsgInitReq":
            self._count_rejection("not_initialized")
            conn.close(f"first message is {msg.type!r}, expected HatEventer.MsgInitReq")
            return None
        try:
            req = codec.repo.decode(msg.type, msg.data)
        except Exception as e:
            self._count_rejection("bad_message")
            await self._init_error(conn, msg, f"MsgInitReq does not decode: {e}")
            return None
        name = req["clientName"]
        token = req["clientToken"][1] if req["clientToken"][0] == "value" else None
        if token is not None and (
            self._token is None or not hmac.compare_digest(token.encode(), self._token.encode())
        ):
            self._count_rejection("bad_token")
            await self._init_error(conn, msg, "invalid client token", name)
            return None
        try:
            subscription = Subscription(req["subscriptions"])
        except InvalidSubscriptionError as e:
            self._count_rejection("bad_subscription")
            await self._init_error(conn, msg, str(e), name)
            return None
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
        return _Session(self, conn, name, subscription, server_id, req["persisted"])

    async def _init_error(self, conn, msg, error: str, name: str | None = None) -> None:
        log.warning("eventer init of %r from %s rejected: %s", name, conn.peer, error)
        with contextlib.suppress(ConnectionError):
            conn.send(
                _P + "MsgInitRes",
                codec.repo.encode(_P + "MsgInitRes", ("error", error)),
                conv=msg.conv,
            )
        await conn.close_after_flush(self._limits.init_error_close_timeout)


def _encode_events(events: list[Event]) -> bytes:
    return codec.repo.encode(_P + "MsgEventsNotify", [codec.event_to_sbs(e) for e in events])


class _Session:
    """One initialized client connection."""

    def __init__(self, server: EventerServer, conn, name, subscription, server_id, persisted):
        self.server = server
        self.conn: chatter.Connection = conn
        self.name: str = name
        self.subscription: Subscription = subscription
        self.server_id: int | None = server_id
        self.persisted: bool = persisted
        self._limits = server._limits
        self._engine = server._engine
        self._since_checkpoint = 0
        self._outstanding_acks = 0
        self._queue: deque[tuple[bytes, int]] = deque()
        self._queued_events = 0
        self._queries = asyncio.Semaphore(self._limits.max_concurrent_queries)
        self._tasks: set[asyncio.Task] = set()

    def select(self, events: list[Event]) -> list[Event]:
        if self.subscription.is_empty:
            return []
        if self.server_id is not None and events[0].id.server != self.server_id:
            return []  # a session's events all come from one server
        if self.subscription.matches_all:
            return events
        matches = self.subscription.matches
        return [e for e in events if matches(e.type)]

    # -- notifications with flow control ---------------------------------------------------

    def notify(self, data: bytes, count: int) -> None:
        if self._queue or self._outstanding_acks >= self._limits.ack_window:
            self._queue.append((data, count))
            self._queued_events += count
            if self._queued_events > self._limits.max_queued_events:
                self.server._count_rejection("slow_subscriber")
                self.conn.close(
                    f"subscriber too slow: {self._queued_events} events queued, "
                    f"{self._outstanding_acks} MsgEventsAck outstanding "
                    f"(limit {self._limits.max_queued_events})"
                )
            return
        self._send_notify(data)

    def _send_notify(self, data: bytes) -> None:
        self._since_checkpoint += 1
        checkpoint = self._since_checkpoint >= self._limits.ack_every
        if checkpoint:
            self._since_checkpoint = 0
            self._outstanding_acks += 1
        try:
            self.conn.send(_P + "MsgEventsNotify", data, last=not checkpoint)
        except ConnectionError:
            pass

    def _on_ack(self) -> None:
        if self._outstanding_acks == 0:
            return  # an ack we did not ask for: harmless
        self._outstanding_acks -= 1
        while self._queue and self._outstanding_acks < self._limits.ack_window:
            data, count = self._queue.popleft()
            self._queued_events -= count
            self._send_notify(data)

    # -- requests --------------------------------------------------------------------------

    async def run(self) -> None:
        conn = self.conn
        try:
            while True:
                try:
                    msg = await conn.receive()
                except chatter.FrameError as e:
                    self.server._count_rejection("bad_frame")
                    conn.close(f"client {self.name!r}: {e}")
                    return
                except ConnectionError:
                    return
                t = msg.type
                if t == _P + "MsgRegisterReq":
                    self._on_register(msg)
                elif t == _P + "MsgEventsAck":
                    self._on_ack()
                elif t == _P + "MsgQueryReq":
                    await self._queries.acquire()
                    task = asyncio.get_running_loop().create_task(self._on_query(msg))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    self.server._count_rejection("unexpected_message")
                    conn.close(f"client {self.name!r}: unexpected message type {t!r}")
                    return
        finally:
            for task in list(self._tasks):
                task.cancel()

    def _on_register(self, msg: chatter.Msg) -> None:
        conn = self.conn
        wants_response = not msg.last
        try:
            data = codec.repo.decode(msg.type, msg.data)
            events = [codec.register_event_from_sbs(e) for e in data]
        except Exception as e:
            self.server._count_rejection("bad_message")
            conn.close(f"client {self.name!r}: MsgRegisterReq does not decode: {e}")
            return
        try:
            created, fut = self._engine.register(events)
        except EngineError as e:
            self.server._count_rejection("register_failed")
            log.warning("register of %d events by %r failed: %s", len(events), self.name, e)
            if wants_response:
                self._respond_register(msg, None)
            return
        if wants_response:
            # Answer once committed: a MsgRegisterRes means the events are durable.
            fut.add_done_callback(
                lambda f: self._respond_register(msg, None if f.exception() else created)
            )

    def _respond_register(self, msg: chatter.Msg, created: list[Event] | None) -> None:
        if self.conn.is_closed:
            return
        value = (
            ("failure", None)
            if created is None
            else ("events", [codec.event_to_sbs(e) for e in created])
        )
        self.conn.send(
            _P + "MsgRegisterRes", codec.repo.encode(_P + "MsgRegisterRes", value), conv=msg.conv
        )

    async def _on_query(self, msg: chatter.Msg) -> None:
        try:
            try:
                params = codec.query_params_from_sbs(codec.repo.decode(msg.type, msg.data))
                _check_query(params)
            except Exception as e:
                self.server._count_rejection("bad_query")
                self.conn.close(f"client {self.name!r}: invalid MsgQueryReq: {e}")
                return
            try:
                result = await self._engine.query(params)
            except Exception:
                log.exception("query %r by %r failed", params, self.name)
                self.conn.close(f"client {self.name!r}: query failed on the server")
                return
            if not self.conn.is_closed:
                self.conn.send(
                    _P + "MsgQueryRes",
                    codec.repo.encode(_P + "MsgQueryRes", codec.query_result_to_sbs(result)),
                    conv=msg.conv,
                )
        finally:
            self._queries.release()


def _check_query(params) -> None:
    """Reject what no sensible client sends, naming the field."""
    types = getattr(params, "event_types", None)
    if types is not None:
        Subscription(types)  # raises InvalidSubscriptionError naming the pattern
    max_results = getattr(params, "max_results", None)
    if max_results is not None and max_results < 0:
        raise ValueError(f"maxResults {max_results} is negative")
    if isinstance(params, QueryTimeseriesParams):
        for field in ("t_from", "t_to", "source_t_from", "source_t_to"):
            t = getattr(params, field)
            if t is not None and not 0 <= t.us < 1_000_000:
                raise ValueError(f"{field} has us={t.us}, must be 0..999999")
