"""One initialized Syncer client connection serving one server id: history after the
client's ``lastEventId``, ``MsgSynced``, then live committed events; ``MsgFlushReq``.

The `SyncerServer` (server.py) accepts the connection, runs the init and fans committed
events out to its sessions (`select`, `on_live`); the session reads history from the
server's store and registers itself with the server while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from eventfleet_server import chatter
from eventfleet_server.common import codec
from eventfleet_server.common.model import Event
from eventfleet_server.listener import RejectReason
from eventfleet_server.syncer import wire
from eventfleet_server.syncer.wire import InitReq

if TYPE_CHECKING:
    from eventfleet_server.syncer.server import SyncerServer

log = logging.getLogger(__name__)


class SyncerSession:
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
            self.conn.send(wire.EVENTS, data)
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
                conv = self.conn.send(wire.FLUSH_REQ, wire.encode_none(), last=False)
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
        self.conn.send(wire.SYNCED, wire.encode_none())
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
            if msg.type == wire.FLUSH_RES:
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
