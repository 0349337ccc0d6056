"""Eventer server: one chatter listener, one `_Session` per client connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from eventfleet_server import chatter
from eventfleet_server.chatter import ChatterListener, InitRejected
from eventfleet_server.common import codec
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import (
    Event,
    QueryLatestParams,
    Status,
)
from eventfleet_server.common.subscription import InvalidSubscriptionError, Subscription
from eventfleet_server.engine import Engine, EngineError
from eventfleet_server.engine.fanout import SlicedFanout
from eventfleet_server.eventer.decode import (
    CHUNK_EVENTS,
    MalformedRequest,
    RegisterLimits,
    decode_register,
    event_elements,
    register_res,
)
from eventfleet_server.eventer.wire import BadRequest, decode_init_req, decode_query_req
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
    def _sessions(self) -> set[_Session]:
        return self._listener.sessions

    async def start(self) -> None:
        self._unsubscribe = [
            self._engine.add_sbs_listener(self._on_events),
            self._engine.add_status_listener(self._on_status),
        ]
        await self._listener.start()
        log.info("eventer listening on port %s", self.port)

    async def stop(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
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

    def _on_status(self, status: Status) -> None:
        data = codec.repo.encode(_P + "MsgStatusNotify", codec.status_to_sbs(status))
        for session in list(self._sessions):
            with contextlib.suppress(ConnectionError):
                session.conn.send(_P + "MsgStatusNotify", data)

    # -- init ----------------------------------------------------------------------------------

    async def _initialize(self, conn: chatter.Connection, msg: chatter.Msg) -> _Session:
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
        return _Session(self, conn, name, subscription, server_id, req["persisted"])


def _init_error(reason: RejectReason, error: str, name: str | None = None) -> InitRejected:
    reply = (_P + "MsgInitRes", codec.repo.encode(_P + "MsgInitRes", ("error", error)))
    return InitRejected(reason, error, reply, name)


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
        # Per-session group: queries still running when the client leaves are cancelled.
        self._tasks = server._tasks.group(f"client:{conn.peer}")
        conn.max_write_buffer = self._limits.max_write_buffer

    def select(self, events: list[Event], sbs: list[bytes]) -> list[bytes]:
        """The SBS bytes of the events (`sbs`, aligned) this client subscribed to."""
        if self.subscription.is_empty:
            return []
        if self.server_id is not None and events[0].id.server != self.server_id:
            return []  # a session's events all come from one server
        if self.subscription.matches_all:
            return sbs
        matches = self.subscription.matches
        return [b for e, b in zip(events, sbs, strict=True) if matches(e.type)]

    # -- notifications with flow control ---------------------------------------------------

    def notify(self, data: bytes, count: int) -> None:
        if self._queue or self._outstanding_acks >= self._limits.ack_window:
            self._queue.append((data, count))
            self._queued_events += count
            if self._queued_events > self._limits.max_queued_events:
                self._refuse(
                    RejectReason.SLOW_SUBSCRIBER,
                    f"subscriber too slow: {self._queued_events} events queued, "
                    f"{self._outstanding_acks} MsgEventsAck outstanding "
                    f"(limit {self._limits.max_queued_events})",
                    abort=True,
                )
            return
        self._send_notify(data)

    def _send_notify(self, data: bytes) -> None:
        self._since_checkpoint += 1
        checkpoint = self._since_checkpoint >= self._limits.ack_every
        if checkpoint:
            self._since_checkpoint = 0
            self._outstanding_acks += 1
        self._send(_P + "MsgEventsNotify", data, last=not checkpoint)

    def _send(self, msg_type: str, data: bytes, **kwargs) -> bool:
        """Queue a message unless the client stopped reading (then close it, logged and
        counted). False when nothing was sent."""
        conn = self.conn
        if conn.is_closed:
            return False
        buffered = conn.write_buffer_size
        if buffered + len(data) > self._limits.max_write_buffer:
            self._refuse(
                RejectReason.SLOW_CLIENT,
                f"not reading: {buffered} bytes unsent, {len(data)} more would exceed "
                f"max_write_buffer {self._limits.max_write_buffer}",
                abort=True,
            )
            return False
        try:
            conn.send(msg_type, data, **kwargs)
        except ConnectionError:
            return False
        return True

    def _on_ack(self) -> None:
        if self._outstanding_acks == 0:
            return  # an ack we did not ask for: harmless
        self._outstanding_acks -= 1
        while self._queue and self._outstanding_acks < self._limits.ack_window:
            data, count = self._queue.popleft()
            self._queued_events -= count
            self._send_notify(data)

    # -- requests --------------------------------------------------------------------------

    def _refuse(self, reason: RejectReason, detail: str, *, abort: bool = False) -> None:
        chatter.refuse(
            self.conn,
            self.server.rejections,
            reason,
            f"client {self.name!r}: {detail}",
            abort=abort,
        )

    async def run(self) -> None:
        try:
            await self._read_loop()
        finally:
            await self._tasks.close()

    async def _read_loop(self) -> None:
        label = f"eventer client {self.name!r}"
        async for msg in chatter.messages(self.conn, self.server.rejections, label):
            t = msg.type
            if t == _P + "MsgRegisterReq":
                await self._on_register(msg)
            elif t == _P + "MsgEventsAck":
                self._on_ack()
            elif t == _P + "MsgQueryReq":
                await self._queries.acquire()
                self._tasks.spawn("query", self._on_query(msg), critical=False)
            else:
                self._refuse(RejectReason.UNEXPECTED_MESSAGE, f"unexpected message type {t!r}")
                return

    async def _on_register(self, msg: chatter.Msg) -> None:
        conn = self.conn
        wants_response = not msg.last
        # Where each event lies in the request: its stored bytes are spliced from them.
        spans: list[tuple[int, int, int]] = []
        try:
            # Slice by slice, yielding between slices: a maximal request never holds
            # the loop (docs/security.md). Limits are checked before decoding.
            events = await decode_register(msg.data, self._limits.register, spans)
        except MalformedRequest as e:
            self._refuse(RejectReason.BAD_MESSAGE, f"MsgRegisterReq does not decode: {e}")
            return
        except Exception as e:
            # The whole request fails; the connection stays (the client may go on).
            self.server.rejections.reject(
                RejectReason.REGISTER_FAILED,
                f"register by {self.name!r} refused: {e}",
                conn.peer,
            )
            if wants_response:
                self._respond_register(msg, None)
            return
        if conn.is_closed:
            return
        elements: list[bytes] = []

        def encode(created: list[Event]) -> list[bytes]:
            # Spliced from the request (~1 µs/event); encoded only if it cannot be.
            spliced = event_elements(msg.data, spans, created)
            elements.extend(
                spliced if spliced is not None else [codec.encode_event(e) for e in created]
            )
            return elements

        done = None
        if wants_response:
            # Answered right after the commit, in the commit's loop iteration: a
            # MsgRegisterRes means the events are durable.
            def done(ok: bool) -> None:
                self._respond_register(msg, elements if ok else None)

        try:
            _, fut = self._engine.register(events, validated=True, encode=encode, done=done)
        except EngineError as e:
            self.server.rejections.reject(
                RejectReason.REGISTER_FAILED,
                f"register of {len(events)} events by {self.name!r} failed: {e}",
                conn.peer,
            )
            if wants_response:
                self._respond_register(msg, None)
            return
        if not wants_response and len(events) > CHUNK_EVENTS:
            # No answer to wait for: still, the next request waits for this commit, so
            # a client cannot queue uncommitted batches faster than the disk takes them.
            with contextlib.suppress(Exception):
                await fut

    def _respond_register(self, msg: chatter.Msg, elements: list[bytes] | None) -> None:
        """MsgRegisterRes: the events' stored bytes joined behind the header (one C join,
        no encoding), or the failure choice."""
        if self.conn.is_closed:
            return
        if elements is None:
            data = codec.repo.encode(_P + "MsgRegisterRes", ("failure", None))
        else:
            data = register_res(elements)
        self._send(_P + "MsgRegisterRes", data, conv=msg.conv)

    async def _on_query(self, msg: chatter.Msg) -> None:
        try:
            try:
                params = decode_query_req(msg.data)
            except BadRequest as e:
                self._refuse(RejectReason.BAD_QUERY, f"invalid MsgQueryReq: {e}")
                return
            except Exception as e:  # a bug of the decoder (the fuzz targets fail on it)
                log.exception("MsgQueryReq from %r: decoder failed", self.name)
                self._refuse(RejectReason.BAD_QUERY, f"invalid MsgQueryReq: {e!r}")
                return
            try:
                result = await self._engine.query_sbs(params)
            except Exception:
                log.exception("query %r by %r failed", params, self.name)
                self.conn.close(f"client {self.name!r}: query failed on the server")
                return
            items, more = result
            cap = self._limits.max_latest_results
            if isinstance(params, QueryLatestParams) and len(items) > cap:
                # At most the cap; moreFollows tells the client there were more (narrow
                # the types to see them).
                items, more = items[:cap], True
            # The stored bytes of each event joined behind the count: nothing encoded.
            data = codec.query_res(items, more)
            if not self._send(_P + "MsgQueryRes", data, conv=msg.conv):
                return
            # Hold the query slot until the reply has left: a client that sends queries
            # and never reads runs out of slots instead of growing our memory.
            try:
                async with asyncio.timeout(self._limits.send_timeout):
                    await self.conn.drain()
            except TimeoutError:
                self._refuse(
                    RejectReason.SLOW_CLIENT,
                    f"not reading: a query reply did not drain within "
                    f"{self._limits.send_timeout:g} s",
                    abort=True,
                )
            except ConnectionError:
                pass
        finally:
            self._queries.release()
