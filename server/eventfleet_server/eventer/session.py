"""One initialized Eventer client connection: subscriptions with flow-controlled
notifies, register and query requests.

The `EventerServer` (server.py) accepts the connection and runs the init; it hands the
session the events to notify (`select`, `notify`) and runs `run` until the client leaves.
The session reaches the engine, its limits, task group and rejection counters through
that server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING

from eventfleet_server import chatter
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    QueryLatestParams,
    timestamp_from_us,
    timestamp_to_us,
)
from eventfleet_server.common.subscription import Subscription
from eventfleet_server.engine import EngineError
from eventfleet_server.eventer.wire import (
    CHUNK_EVENTS,
    BadRequest,
    InvalidRegistration,
    MalformedRequest,
    decode_query_req,
    decode_register,
    decode_register_now,
    event_elements,
    register_res,
    register_res_parts,
    registered_events_sliced,
    splice_elements_sliced,
)
from eventfleet_server.listener import RejectReason
from eventfleet_server.storage import StorageFaultError

if TYPE_CHECKING:
    from eventfleet_server.eventer.server import EventerServer

log = logging.getLogger(__name__)

_P = "HatEventer."


class EventerSession:
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
        self._queries_running = 0
        self._query_waiting: chatter.Msg | None = None  # held until a query slot frees
        # MsgRegisterRes of committed requests, sent together when the commit's
        # callbacks are done (`flush_replies`, called by the server).
        self._replies: list[tuple[str, bytes, chatter.Conversation]] = []
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
        if not self._writable(len(data)):
            return False
        try:
            self.conn.send(msg_type, data, **kwargs)
        except ConnectionError:
            return False
        return True

    def _writable(self, size: int) -> bool:
        """Whether `size` more bytes may be queued: false when closed, and when the
        client stopped reading (then it is closed, logged and counted)."""
        conn = self.conn
        if conn.is_closed:
            return False
        buffered = conn.write_buffer_size
        if buffered + size > self._limits.max_write_buffer:
            self._refuse(
                RejectReason.SLOW_CLIENT,
                f"not reading: {buffered} bytes unsent, {size} more would exceed "
                f"max_write_buffer {self._limits.max_write_buffer}",
                abort=True,
            )
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
        # Messages are handled as the connection reads them (`_on_msg`, synchronous);
        # only a large request or a query waits in a task, with the dispatch paused.
        try:
            self.conn.set_handler(self._on_msg, self._on_frame_error)
            # Until closed, not until the socket is gone: a refused client that does not
            # read must not keep its session place while its last bytes wait.
            await self.conn.wait_closing()
        finally:
            await self._tasks.close()

    def _on_frame_error(self, error: chatter.FrameError) -> None:
        label = f"eventer client {self.name!r}"
        self.server.rejections.reject(
            chatter.frame_error_reason(error), f"{label}: {error}", self.conn.peer
        )
        self.conn.abort(f"{label}: {error}", quiet=True)

    def _on_msg(self, msg: chatter.Msg) -> None:
        t = msg.type
        if t == _P + "MsgRegisterReq":
            self._on_register_now(msg)
        elif t == _P + "MsgEventsAck":
            self._on_ack()
        elif t == _P + "MsgQueryReq":
            if self._queries_running >= self._limits.max_concurrent_queries:
                # No slot: the next messages wait until a query ends (`_query_ended`).
                self._query_waiting = msg
                self.conn.pause_dispatch()
            else:
                self._start_query(msg)
        else:
            self._refuse(RejectReason.UNEXPECTED_MESSAGE, f"unexpected message type {t!r}")

    def _start_query(self, msg: chatter.Msg) -> None:
        self._queries_running += 1
        try:
            self._tasks.spawn("query", self._on_query(msg), critical=False)
        except Exception:
            self._queries_running -= 1
            raise

    def _query_ended(self) -> None:
        self._queries_running -= 1
        waiting, self._query_waiting = self._query_waiting, None
        if waiting is not None and not self.conn.is_closed:
            self._start_query(waiting)
            self.conn.resume_dispatch()

    def _in_task(self, name: str, coro) -> None:
        """Run `coro` with the connection's dispatch paused until it is done: messages
        are handled in the order they came."""
        conn = self.conn
        conn.pause_dispatch()
        try:
            task = self._tasks.spawn(name, coro, critical=False)
        except Exception:
            conn.resume_dispatch()
            raise

        def resume(_task) -> None:
            if not conn.is_closed:
                conn.resume_dispatch()

        task.add_done_callback(resume)

    def _on_register_now(self, msg: chatter.Msg) -> None:
        """A register request handled in the iteration that read it; one too large for
        one slice is decoded by a task (`_on_register`), the dispatch paused."""
        # Where each event lies in the request: its stored bytes are spliced from them.
        spans: list[tuple[int, int, int]] = []
        try:
            events = decode_register_now(msg.data, self._limits.register, spans)
        except Exception as e:
            self._decode_failed(msg, e)
            return
        if events is None:
            self._in_task("register", self._on_register(msg))
            return
        self._submit(msg, events, spans)

    async def _on_register(self, msg: chatter.Msg) -> None:
        spans: list[tuple[int, int, int]] = []
        try:
            # Slice by slice, yielding between slices: a maximal request never holds
            # the loop (docs/security.md). Limits are checked before decoding.
            events = await decode_register(msg.data, self._limits.register, spans)
        except Exception as e:
            self._decode_failed(msg, e)
            return
        # The stored bytes prepared a slice at a time too, for the ids and time the
        # registration is about to get (spliced at once, as for small requests, if
        # another registration took those meanwhile).
        first, ts_us = self._engine.next_registration()
        ts = timestamp_from_us(ts_us)
        prepared = await splice_elements_sliced(msg.data, spans, first, ts)
        created = await registered_events_sliced(events, first, ts)
        fut = self._submit(msg, events, spans, (first, ts_us, prepared), created)
        if fut is not None and msg.last and len(events) > CHUNK_EVENTS:
            # No answer to wait for: still, the next request waits for this commit, so
            # a client cannot queue uncommitted batches faster than the disk takes them.
            with contextlib.suppress(Exception):
                await fut

    def _decode_failed(self, msg: chatter.Msg, error: Exception) -> None:
        if isinstance(error, MalformedRequest):
            self._refuse(RejectReason.BAD_MESSAGE, f"MsgRegisterReq does not decode: {error}")
        elif isinstance(error, InvalidRegistration):
            # The whole request fails; the connection stays (the client may go on).
            self._register_failed(msg, f"register by {self.name!r} refused: {error}")
        else:  # a bug of the decoder (the fuzz target fails on it)
            log.error("MsgRegisterReq from %r: decoder failed", self.name, exc_info=error)
            self._register_failed(msg, f"register by {self.name!r} refused: {error!r}")

    def _submit(
        self,
        msg: chatter.Msg,
        events: list,
        spans: list[tuple[int, int, int]],
        prepared: tuple[EventId, int, list[bytes] | None] | None = None,
        created: list[Event] | None = None,
    ) -> asyncio.Future | None:
        """Hand decoded events to the engine; the answer leaves after their commit.
        `prepared`: the first id and time (µs) `Engine.next_registration` gave and the
        stored bytes spliced for them; `created`: the events made for them."""
        if self.conn.is_closed:
            return None
        wants_response = not msg.last
        if not events:
            # Nothing to commit (the engine calls no `done` for it): answered at once
            # with no events, as the reference does (it never answered before).
            if wants_response:
                self._respond_register(msg, [])
            return None
        elements: list[bytes] = []

        def encode(created: list[Event]) -> list[bytes]:
            # Spliced from the request (~1 µs/event); encoded only if it cannot be.
            head = created[0]
            if (
                prepared is not None
                and prepared[2] is not None
                and (head.id, timestamp_to_us(head.timestamp)) == prepared[:2]
            ):
                elements.extend(prepared[2])
                return elements
            spliced = event_elements(msg.data, spans, created)
            elements.extend(
                spliced if spliced is not None else [codec.encode_event(e) for e in created]
            )
            return elements

        done = None
        if wants_response:
            # Answered right after the commit, in the commit's loop iteration: a
            # MsgRegisterRes means the events are durable. The answers of one commit
            # leave together (`flush_replies`); a failure's at once (no commit
            # listener runs after a failed commit).
            def done(ok: bool) -> None:
                if ok:
                    self._queue_reply(msg, elements)
                else:
                    self._respond_register(msg, None)

        try:
            _, fut = self._engine.register(
                events,
                validated=True,
                encode=encode,
                done=done,
                timestamp_us=None if prepared is None else prepared[1],
                prepared=created,
            )
        except EngineError as e:
            self._register_failed(
                msg, f"register of {len(events)} events by {self.name!r} failed: {e}"
            )
            return None
        return fut

    def _register_failed(self, msg: chatter.Msg, detail: str) -> None:
        """A register request that stored nothing: counted and logged as a rejection, and
        answered with the failure choice when the client waits for an answer."""
        self.server.rejections.reject(RejectReason.REGISTER_FAILED, detail, self.conn.peer)
        if not msg.last:
            self._respond_register(msg, None)

    def _queue_reply(self, msg: chatter.Msg, elements: list[bytes]) -> None:
        if self.conn.is_closed:
            return
        if len(elements) > CHUNK_EVENTS:
            # A large answer is written in pieces, not joined (`register_res_parts`),
            # after the answers queued before it.
            self.flush_replies()
            parts = register_res_parts(elements)
            if self._writable(sum(map(len, parts))):
                with contextlib.suppress(ConnectionError):
                    self.conn.send_parts(_P + "MsgRegisterRes", parts, conv=msg.conv)
            return
        first = not self._replies
        self._replies.append((_P + "MsgRegisterRes", register_res(elements), msg.conv))
        if first and not self.server.reply_pending(self):
            self.flush_replies()

    def flush_replies(self) -> None:
        """Send the queued MsgRegisterRes with one write (`Connection.send_many`)."""
        replies, self._replies = self._replies, []
        if not replies or self.conn.is_closed:
            return
        if len(replies) == 1:
            msg_type, data, conv = replies[0]
            self._send(msg_type, data, conv=conv)
            return
        size = sum(len(r[1]) for r in replies)
        if self._writable(size):
            with contextlib.suppress(ConnectionError):
                self.conn.send_many(replies)

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
            except StorageFaultError as e:
                # A named fault under the store (an I/O error earlier): its cause suffices.
                log.error("query %r by %r failed: %s", params, self.name, e)
                self.conn.close(f"client {self.name!r}: query failed on the server")
                return
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
            self._query_ended()
