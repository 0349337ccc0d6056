"""Syncer client: one connection pulling one server id's events from one peer.

A `SyncStream` resumes after the highest id of that server id held in the local store,
hands received events to the replica's `Merger` (one commit queue for all streams) and
answers ``MsgFlushReq`` only once everything received before it is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from eventfleet_server import chatter
from eventfleet_server.common.model import EventId, EventType
from eventfleet_server.storage import Storage
from eventfleet_server.syncer import wire
from eventfleet_server.syncer.merger import MergeOwner, Merger
from eventfleet_server.syncer.rows import decode_rows
from eventfleet_server.syncer.wire import ProtocolError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Peer:
    """One configured peer (from the ``peers`` list)."""

    name: str
    host: str
    port: int
    server_id: int
    # The name its certificate must carry when `host` is not it (an IP, a tunnel).
    tls_server_name: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class SyncerClientLimits:
    connect_timeout: float = 5.0
    init_timeout: float = 10.0
    max_msg_size: int = 64 * 1024 * 1024
    ping_delay: float = 20.0
    ping_timeout: float = 20.0


class InitRefusedError(ConnectionError):
    """The peer answered MsgInitRes with an error (the message is its text)."""


class StreamStats:
    """What one stream has done so far; read by the peer state and status pages."""

    def __init__(self) -> None:
        self.connected = False
        self.synced = False
        self.history_events = 0  # events received before MsgSynced on this connection
        self.received_events = 0  # events received, all connections
        self.last_event_id: EventId | None = None
        self.last_received_at: float | None = None  # wall clock of the last MsgEvents
        self.last_event_age: float | None = None  # receive time - event timestamp, seconds
        self.connected_at: float | None = None
        self.synced_at: float | None = None


class SyncStream:
    """One Syncer client connection for `server_id` events from `peer`.

    `run` makes one connection and returns when it ends: after ``MsgSynced`` when
    `until_synced` (catch-up), otherwise when the connection closes or
    `stop_when()` turns true after ``MsgSynced``. It raises `ConnectionError`
    (`InitRefusedError` if refused) or `ProtocolError` when the connection fails.
    """

    def __init__(
        self,
        peer: Peer,
        server_id: int,
        *,
        client_name: str,
        token: str | Callable[[], str | None] | None,
        subscriptions: Iterable[EventType],
        storage: Storage,
        merger: Merger,
        limits: SyncerClientLimits = SyncerClientLimits(),
        on_change: Callable[[SyncStream], None] | None = None,
        ssl=None,
    ):
        self.peer = peer
        self._ssl = ssl
        self.server_id = server_id
        self.label = f"peer={peer.name} ({peer.address}) server_id={server_id}"
        self._client_name = client_name
        self._token = token
        self._subscriptions = [tuple(s) for s in subscriptions]
        self._storage = storage
        self._merger = merger
        self._limits = limits
        self._on_change = on_change
        self.stats = StreamStats()
        self.owner = MergeOwner(self.label)
        self._conn: chatter.Connection | None = None
        self._check_stop = asyncio.Event()

    def close(self, reason: str | None = None) -> None:
        if self._conn is not None:
            self._conn.close(reason)

    def poke(self) -> None:
        """Re-evaluate `stop_when` (the mesh calls this when sync states change)."""
        self._check_stop.set()

    def _changed(self) -> None:
        if self._on_change:
            self._on_change(self)

    async def run(
        self, *, until_synced: bool = False, stop_when: Callable[[], bool] | None = None
    ) -> None:
        limits = self._limits
        stats = self.stats
        self.owner = owner = MergeOwner(self.label)
        stats.history_events = 0
        after = self._storage.last_ids.get(self.server_id) or EventId(self.server_id, 0, 0)
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
        # cancellation that arrives as the connection completes (the mesh would then
        # never stop). The same holds for every timeout in this package.
        async with asyncio.timeout(limits.connect_timeout):
            conn = await chatter.connect(
                self.peer.host,
                self.peer.port,
                max_msg_size=limits.max_msg_size,
                ping_delay=limits.ping_delay,
                ping_timeout=limits.ping_timeout,
                ssl=self._ssl,
                server_hostname=self.peer.tls_server_name,
            )
        self._conn = conn
        owner.on_error = lambda e: conn.close(f"syncer {self.label}: merge failed: {e}")
        watcher: asyncio.Task | None = None
        try:
            conv = conn.send(
                wire.INIT_REQ,
                wire.encode_init_req(
                    after,
                    self._client_name,
                    self._token() if callable(self._token) else self._token,
                    self._subscriptions,
                ),
                last=False,
            )
            try:
                async with asyncio.timeout(limits.init_timeout):
                    msg = await conn.receive()
            except TimeoutError:
                raise ConnectionError(f"no MsgInitRes within {limits.init_timeout} s") from None
            if msg.type != wire.INIT_RES or msg.conv != conv:
                raise ProtocolError(f"expected {wire.INIT_RES}, got {msg.type!r}")
            error = wire.decode_init_res(msg.data)
            if error is not None:
                raise InitRefusedError(error)
            stats.connected = True
            stats.connected_at = time.time()
            log.debug("syncer %s connected, after=%s", self.label, tuple(after))
            self._changed()
            if stop_when is not None:
                watcher = asyncio.get_running_loop().create_task(self._watch(conn, stop_when))
            await self._receive_loop(conn, owner, until_synced)
        except chatter.FrameError as e:
            conn.close(f"syncer {self.label}: {e}")
            raise ProtocolError(str(e)) from e
        except ProtocolError as e:
            conn.close(f"syncer {self.label}: {e}")
            raise
        finally:
            if watcher:
                watcher.cancel()
            conn.close()
            self._conn = None
            was_connected = stats.connected
            stats.connected = stats.synced = False
            if was_connected:
                self._changed()

    async def _watch(self, conn: chatter.Connection, stop_when: Callable[[], bool]) -> None:
        while not conn.is_closed:
            await self._check_stop.wait()
            self._check_stop.clear()
            if self.stats.synced and stop_when():
                # Redundant now (the peer that owns these events serves them directly).
                await self._merger.barrier(self.owner)
                conn.close()
                return

    async def _receive_loop(self, conn, owner: MergeOwner, until_synced: bool) -> None:
        stats = self.stats
        merger = self._merger
        types: dict[bytes, tuple] = {}  # encoded type -> checked type (`decode_rows`)
        while True:
            try:
                msg = await conn.receive()
            except ConnectionError:
                if owner.error is not None:
                    raise ConnectionError(f"merge failed: {owner.error}") from owner.error
                if stats.synced and not until_synced:
                    return  # the peer went away; the caller reconnects
                raise
            t = msg.type
            if t == wire.EVENTS:
                # Straight to merge rows: no model object per event on this path.
                rows = decode_rows(msg.data, self.server_id, types)
                now = time.time()
                stats.received_events += len(rows)
                if not stats.synced:
                    stats.history_events += len(rows)
                    if stats.history_events == len(rows):
                        self._changed()  # the first history event: syncing
                last = rows[-1]
                stats.last_event_id = EventId(last[1], last[2], last[3])
                stats.last_received_at = now
                stats.last_event_age = max(0.0, now - last[5] / 1e6)
                await merger.put(owner, rows)
            elif t == wire.SYNCED:
                if stats.synced:
                    raise ProtocolError("second MsgSynced")
                await merger.barrier(owner)
                stats.synced = True
                stats.synced_at = time.time()
                self._changed()
                self._check_stop.set()
                if until_synced:
                    return
            elif t == wire.FLUSH_REQ:
                fut = merger.barrier(owner)
                fut.add_done_callback(lambda f, conv=msg.conv: self._flushed(conn, conv, f))
            else:
                raise ProtocolError(f"unexpected message {t!r}")

    def _flushed(self, conn: chatter.Connection, conv, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # not committed: no MsgFlushRes (the connection is closing anyway)
        with contextlib.suppress(ConnectionError):
            conn.send(wire.FLUSH_RES, wire.encode_none(), conv=conv)
