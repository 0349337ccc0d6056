"""The Event BUS sockets: SNAPSHOT (ROUTER), PUBLISHER (PUB), COLLECTOR (ROUTER).

Engine-free: everything about events goes through a `BusHandler` (the engine adapter
in `adapter.py`, or a test double). This module owns ZeroMQ: sockets, limits, ZAP
authentication and counting of refusals.

Concurrency: one asyncio loop. BROADCASTs are sent synchronously from the handler's
commit callback, so the order on the wire is commit order. A snapshot fixes its upper
bound (the handler's `head`, the sequence of the last BROADCAST sent) when it starts
streaming: every event up to it is committed and readable, every event after it is
broadcast after it; that is the whole race-freedom argument (docs/bus.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import math
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import zmq
import zmq.asyncio

from eventfleet_server.bus import wire, zmqio
from eventfleet_server.bus.config import BusConfig
from eventfleet_server.bus.curve import BusCurve
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.listener import Rejections, RejectReason

log = logging.getLogger(__name__)

ZAP_DOMAIN = b"eventfleet"
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_SNAPSHOT_CHUNK = 10_000  # events read from the store per step of a snapshot
_YIELD_EVERY = 1_000  # messages sent before a snapshot lets the loop run others
_STALL_POLL = 0.005
# The collector lets the loop run after this many PUBs or seconds (see `_collector_loop`).
_COLLECT_PUBS = 1_000
_COLLECT_SECONDS = 0.01
# How often a commit reads the publisher's subscriptions (see `has_subscribers`).
_SUBSCRIPTIONS_EVERY = 0.002
_MONITORED = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


Item = zmqio.Frames
"""One event as the BUS shows it, encoded for the wire once: the frames of its
BROADCAST/SYNC except the sequence (which is per replica and added when sent):
``(topic, producer, timestamp, uuid, data)`` — the producer timestamp ISO-8601, the data
msgpack. A plain tuple: one is made per event on the hot paths."""


class PublishResult(NamedTuple):
    duplicates: int
    refused: list[tuple[int, str, str]]  # (index in the batch, reason, detail)


class BusHandler(Protocol):
    """What the sockets need from the engine side."""

    @property
    def head(self) -> int:
        """Sequence of the last BROADCAST sent (0 before any)."""

    async def read(
        self, after: int, limit: int, subtrees: tuple[bytes, ...]
    ) -> tuple[int, list[tuple[int, Item]]]:
        """Stored events with sequence above `after`, ascending, read `limit` at a
        time: ``(last sequence read, those of them in `subtrees`)``; the last sequence
        read is `after` when there are none. ``()`` means every subtree."""

    async def publish(self, pubs: Sequence[wire.Publish]) -> PublishResult:
        """Register `pubs` (one session); duplicates by UUID are dropped silently."""


class _Stalled(Exception):
    pass


class _Gone(Exception):
    pass


@dataclass
class _Counters:
    published: int = 0
    duplicates: int = 0
    broadcast: int = 0
    snapshots: int = 0
    snapshot_events: int = 0
    connections: dict[str, int] = field(
        default_factory=lambda: {"snapshot": 0, "publisher": 0, "collector": 0}
    )


def _peer(identity: bytes) -> str:
    return "identity " + identity.hex()[:32]


class BusServer:
    """Binds the three sockets on `host` and serves them until `stop`."""

    name = "bus"

    def __init__(
        self,
        handler: BusHandler,
        host: str,
        config: BusConfig,
        *,
        token: str | None = None,
        tokens: Callable[[], Sequence[str]] | None = None,
        tasks: Tasks,
        rejections: Rejections | None = None,
        curve: BusCurve | None = None,
    ):
        self._handler = handler
        self._curve = curve  # CURVE (bus/curve.py) instead of PLAIN when set
        self._host = host
        self._config = config
        self._token = token
        # The tokens accepted now (a rotation replaces them without a restart); whether
        # PLAIN is required at all is fixed at start by `token`.
        self._tokens = tokens or (lambda: (token,) if token else ())
        self._tasks = tasks
        self.rejections = rejections or Rejections("bus")
        self.counters = _Counters()
        self.ports: dict[str, int] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._sockets: dict[str, zmq.asyncio.Socket] = {}
        self._pub_sync: zmq.Socket | None = None
        self._broadcaster: zmqio.Broadcaster | None = None
        self._collector_sync: zmq.Socket | None = None
        self._snapshot_sync: zmq.Socket | None = None
        self._snap_queue: asyncio.Queue[tuple[bytes, wire.SyncStart]] | None = None
        self._snap_clients: set[bytes] = set()
        # Topic prefixes with at least one subscriber (XPUB reports the first
        # subscription to a prefix and the last one leaving, disconnects included).
        self._subscribed: set[bytes] = set()
        self._subscriptions_read = -math.inf
        self._encoding = config.integer_encoding
        # libzmq's own guard: a single frame beyond this drops the connection (memory
        # bound); messages between max_message_size and it are refused and counted.
        self._hard_limit = 4 * config.max_message_size + 65536

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the sockets (raise on failure) and start the loops."""
        cfg = self._config
        self._ctx = zmq.asyncio.Context()
        try:
            if self._token is not None or self._curve is not None:
                zap = self._ctx.socket(zmq.REP)
                zap.linger = 0
                zap.bind(_ZAP_ENDPOINT)
                self._sockets["zap"] = zap
            snapshot = self._socket("snapshot", zmq.ROUTER)
            snapshot.setsockopt(zmq.ROUTER_MANDATORY, 1)
            snapshot.sndhwm = cfg.snapshot_hwm
            snapshot.maxmsgsize = self._hard_limit
            # XPUB, not PUB: the same wire behaviour for subscribers (ZMTP lets a SUB
            # talk to either), but it reports subscriptions, so a replica nobody
            # subscribes to does not encode every committed event for nobody.
            publisher = self._socket("publisher", zmq.XPUB)
            publisher.sndhwm = cfg.pub_hwm
            collector = self._socket("collector", zmq.ROUTER)
            collector.maxmsgsize = self._hard_limit
            self._bind_all()
        except BaseException:
            self._close_sockets()
            raise
        # Plain (synchronous) views for the hot paths. Safe only where this code never
        # waits on the same socket through asyncio for the other direction: the
        # publisher is used only from here (sends and its subscription reads); the
        # collector only receives (and its loop re-checks events itself).
        self._pub_sync = zmq.Socket.shadow(publisher.underlying)
        self._broadcaster = zmqio.Broadcaster(
            self._pub_sync, rfc=self._encoding is wire.IntegerEncoding.RFC
        )
        self._collector_sync = zmq.Socket.shadow(collector.underlying)
        # The snapshot socket's sends in bulk; see `_send_snapshot_batch` for how its
        # asyncio reader is kept awake.
        self._snapshot_sync = zmq.Socket.shadow(snapshot.underlying)
        self._snap_queue = asyncio.Queue()
        if "zap" in self._sockets:
            self._tasks.spawn("zap", self._zap_loop())
        for name in ("snapshot", "publisher", "collector"):
            monitor = self._sockets[name].get_monitor_socket(_MONITORED)
            self._tasks.spawn(f"monitor-{name}", self._monitor_loop(name, monitor))
        self._tasks.spawn("snapshot", self._snapshot_loop())
        for i in range(cfg.max_concurrent_snapshots):
            self._tasks.spawn(f"snapshot-worker-{i}", self._snapshot_worker())
        self._tasks.spawn("collector", self._collector_loop())
        log.info(
            "event bus listening on %s: snapshot %s, publisher %s, collector %s "
            "(integers: %s, auth: %s, frames: %s)",
            self._host,
            self.ports["snapshot"],
            self.ports["publisher"],
            self.ports["collector"],
            self._encoding.value,
            self._auth,
            self._broadcaster.describe,
        )

    @property
    def _auth(self) -> str:
        if self._curve is not None:
            return "curve+plain" if self._curve.plain else "curve"
        return "plain" if self._token is not None else "none"

    def _socket(self, name: str, kind: int) -> zmq.asyncio.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(kind)
        sock.linger = 0
        if ":" in self._host:
            sock.ipv6 = True
        if self._curve is not None:
            self._curve.configure(sock)
        elif self._token is not None:
            sock.plain_server = True
            sock.zap_domain = ZAP_DOMAIN
        self._sockets[name] = sock
        return sock

    def _bind_all(self) -> None:
        host = f"[{self._host}]" if ":" in self._host else self._host
        base = self._config.port
        if self._curve is not None:
            self.ports.update(self._curve.bind_all(self._sockets, self._host, base))
            return
        for offset, name in enumerate(("snapshot", "publisher", "collector")):
            sock = self._sockets[name]
            if base == 0:
                self.ports[name] = sock.bind_to_random_port(f"tcp://{host}")
            else:
                try:
                    sock.bind(f"tcp://{host}:{base + offset}")
                except zmq.ZMQError as e:
                    raise OSError(
                        f"event bus {name} socket cannot bind {self._host}:{base + offset}: {e}"
                    ) from e
                self.ports[name] = base + offset

    async def stop(self) -> None:
        """Stop the loops and close the sockets (pending broadcasts are dropped)."""
        # Monitors first, while their readers are still open: see `_disable_monitors`.
        self._disable_monitors()
        await self._tasks.close()
        self._close_sockets()

    def _disable_monitors(self, name: str | None = None) -> None:
        """Detach the connection monitors (all, or `name`'s) before their reading ends
        are closed.

        Why the order matters: libzmq's I/O thread sends each monitor event with a
        blocking send. Once the reading end is closed, the next event (a client
        disconnecting during a stop) blocks that thread forever while it holds the
        socket's monitor lock, and `disable_monitor` then waits for the lock holding
        the GIL: the whole process hangs and no asyncio deadline can fire (seen in CI).
        """
        for key, sock in self._sockets.items():
            if name is None or key == name:
                with contextlib.suppress(Exception):
                    sock.disable_monitor()

    def _close_sockets(self) -> None:
        self._disable_monitors()
        self._pub_sync = self._collector_sync = self._snapshot_sync = None
        self._broadcaster = None
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._curve is not None:
            self._curve.close()

    # -- plug-in surface ---------------------------------------------------------------

    @property
    def connection_count(self) -> int:
        return sum(self.counters.connections.values())

    @property
    def rejected(self) -> dict[str, int]:
        return self.rejections.counts

    def health(self) -> str | None:
        return None if self._sockets else "event bus sockets are not bound"

    def describe(self) -> dict:
        c = self.counters
        return {
            "port": self.ports.get("snapshot"),
            "ports": dict(self.ports),
            "integer_encoding": self._encoding.value,
            "auth": self._auth,
            "sequence": self._handler.head,
            "connections": dict(c.connections),
            "published": c.published,
            "duplicates": c.duplicates,
            "broadcast": c.broadcast,
            "snapshots": c.snapshots,
            "snapshot_events": c.snapshot_events,
            "pending_snapshots": self._snap_queue.qsize() if self._snap_queue else 0,
        }

    # -- PUBLISHER ---------------------------------------------------------------------

    def has_subscribers(self) -> bool:
        """Whether any subscription has reached the publisher socket.

        The subscriptions libzmq has received are read here, synchronously, at most
        every `_SUBSCRIPTIONS_EVERY` seconds (reading costs syscalls, and this runs on
        every commit). So a new subscription takes effect at most that long after it
        reached the socket — as if the network had been that much slower; a PUB socket
        drops what nobody has subscribed to yet in just the same way.
        """
        if time.monotonic() - self._subscriptions_read >= _SUBSCRIPTIONS_EVERY:
            self._refresh_subscriptions()
        return bool(self._subscribed)

    def _refresh_subscriptions(self) -> None:
        """Read the subscriptions now, whatever `has_subscribers` last read."""
        self._subscriptions_read = time.monotonic()
        self._read_subscriptions()

    def _read_subscriptions(self) -> None:
        sock = self._pub_sync
        if sock is None:
            return
        subscribed = self._subscribed
        while True:
            try:
                message = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if message[:1] == b"\x01":
                subscribed.add(message[1:])
            elif message[:1] == b"\x00":
                subscribed.discard(message[1:])

    def broadcast(self, items: Sequence[tuple[int, Item]]) -> None:
        """Send BROADCASTs now, in the given (commit) order.

        Each item is already encoded (once, whatever the number of subscribers: the
        publisher socket fans the same message out); only the sequence frame is made
        here. The publisher never blocks: a subscriber whose queue is at the high-water
        mark loses the message, and sees a gap in the sequence.
        """
        send = self._broadcaster
        if send is None:
            return
        send(items)
        self.counters.broadcast += len(items)

    def _oversized(self, what: str, body: Sequence[bytes], limit: int, identity: bytes) -> bool:
        """Refuse (count, log) a message over ``bus.max_message_size``; True if refused."""
        size = sum(map(len, body))
        if size <= limit:
            return False
        self.rejections.reject(
            RejectReason.MESSAGE_TOO_LARGE,
            f"{what} of {size} bytes exceeds bus.max_message_size {limit}",
            _peer(identity),
        )
        return True

    # -- SNAPSHOT ----------------------------------------------------------------------

    async def _snapshot_loop(self) -> None:
        sock = self._sockets["snapshot"]
        limit = self._config.max_message_size
        assert self._snap_queue is not None
        while True:
            frames = await sock.recv_multipart()
            identity, body = frames[0], frames[1:]
            if self._oversized("snapshot request", body, limit, identity):
                continue
            try:
                request = wire.parse_syncstart(body)
            except wire.WireError as e:
                # The RFC has no error reply; the client gets nothing (as from the
                # reference server) and the refusal is counted and logged.
                self.rejections.reject(e.reason, str(e), _peer(identity))
                continue
            if identity in self._snap_clients:
                self.rejections.reject(
                    RejectReason.RATE_LIMITED,
                    "SYNCSTART while a snapshot for this client is pending",
                    _peer(identity),
                )
                continue
            if self._snap_queue.qsize() >= self._config.max_pending_snapshots:
                self.rejections.reject(
                    RejectReason.RATE_LIMITED,
                    f"{self._snap_queue.qsize()} snapshots pending (bus.max_pending_snapshots)",
                    _peer(identity),
                )
                continue
            self._snap_clients.add(identity)
            self._snap_queue.put_nowait((identity, request))

    async def _snapshot_worker(self) -> None:
        assert self._snap_queue is not None
        while True:
            identity, request = await self._snap_queue.get()
            try:
                await self._serve_snapshot(identity, request)
            except _Stalled:
                self.rejections.reject(
                    RejectReason.SLOW_SUBSCRIBER,
                    f"snapshot abandoned: client did not read for "
                    f"{self._config.snapshot_stall_timeout:g} s",
                    _peer(identity),
                )
            except _Gone:
                log.info("snapshot abandoned: %s disconnected", _peer(identity))
            except Exception:
                log.exception("snapshot for %s failed", _peer(identity))
            finally:
                self._snap_clients.discard(identity)

    async def _serve_snapshot(self, identity: bytes, request: wire.SyncStart) -> None:
        # Fix the upper bound first: everything up to `head` is committed (readable),
        # everything above it is broadcast after this point. For "broadcast" to hold
        # for this client, a subscription it made before asking must be known now: the
        # next commit may come within `_SUBSCRIPTIONS_EVERY` of the last read.
        self._refresh_subscriptions()
        head = self._handler.head
        subtrees = tuple(s.encode() for s in request.subtrees)
        after = request.sequence
        sent = 0
        read = self._handler.read
        # The next chunk is read (on the store's reader thread) while this one is sent.
        pending = (
            asyncio.ensure_future(read(after, _SNAPSHOT_CHUNK, subtrees)) if after < head else None
        )
        try:
            while pending is not None:
                last, rows = await pending
                pending = None
                if last == after:
                    break
                after = last
                if after < head:
                    pending = asyncio.ensure_future(read(after, _SNAPSHOT_CHUNK, subtrees))
                if rows and rows[-1][0] > head:
                    rows = [row for row in rows if row[0] <= head]
                if rows:
                    await self._send_snapshot_batch(identity, rows)
                    sent += len(rows)
        finally:
            if pending is not None:  # the snapshot was abandoned (stalled, client gone)
                pending.cancel()
                pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        await self._send_snapshot(
            identity,
            [identity, *wire.syncend_frames(request.subtrees_frame, head, self._encoding)],
        )
        self.counters.snapshots += 1
        self.counters.snapshot_events += sent
        log.debug(
            "snapshot for %s: %d events of %s above %d, SYNCEND %d",
            _peer(identity),
            sent,
            request.subtrees or "every subtree",
            request.sequence,
            head,
        )

    async def _send_snapshot_batch(self, identity: bytes, rows: list[tuple[int, Item]]) -> None:
        """SYNC messages for `rows`, many per loop turn.

        Sent through the plain socket (no future per message) with DONTWAIT; every
        `_YIELD_EVERY`-th message and the last one go through the asyncio socket, whose
        send re-checks the socket's events and wakes its pending receive: a send on
        the plain socket may consume the edge-triggered wake-up that the snapshot
        loop's receive waits for. A full queue falls back to the waiting send.
        """
        sync = self._snapshot_sync
        assert sync is not None
        send = functools.partial(zmqio.send_frame, sync)
        first = int(zmq.SNDMORE | zmq.NOBLOCK)  # plain ints: no flag arithmetic per frame
        more = int(zmq.SNDMORE)
        rfc = self._encoding is wire.IntegerEncoding.RFC
        sync_cmd = wire.SYNC
        final = len(rows) - 1
        for i, (seq, (topic, producer, timestamp, uuid, data)) in enumerate(rows):
            seq_frame = seq.to_bytes(8, "big") if rfc else b"%d" % seq
            if i == final or i % _YIELD_EVERY == _YIELD_EVERY - 1:
                frames = [identity, sync_cmd, topic, seq_frame, producer, timestamp, uuid, data]
                await self._send_snapshot(identity, frames)
                if i != final:
                    await asyncio.sleep(0)
                continue
            try:
                # Frame by frame (what send_multipart does, without its per-part checks).
                # ROUTER_MANDATORY decides on the identity frame: when it is refused
                # (queue full, client gone) nothing of the message was sent.
                send(identity, first)
            except zmq.Again:
                frames = [identity, sync_cmd, topic, seq_frame, producer, timestamp, uuid, data]
                await self._send_snapshot(identity, frames)
                continue
            except zmq.ZMQError as e:
                if e.errno == zmq.EHOSTUNREACH:
                    raise _Gone() from None
                raise
            send(sync_cmd, more)
            send(topic, more)
            send(seq_frame, more)
            send(producer, more)
            send(timestamp, more)
            send(uuid, more)
            send(data)

    async def _send_snapshot(self, identity: bytes, frames: list[bytes]) -> None:
        # ROUTER_MANDATORY: a full queue (the client does not read) raises Again instead
        # of silently dropping a SYNC, an unknown identity EHOSTUNREACH. Sent through the
        # asyncio socket (DONTWAIT resolves at once): a send on a shadow socket would eat
        # the edge-triggered wake-up the snapshot loop's pending recv waits for.
        sock = self._sockets["snapshot"]
        waited = 0.0
        while True:
            try:
                await sock.send_multipart(frames, flags=zmq.DONTWAIT)
                return
            except zmq.Again:
                if waited >= self._config.snapshot_stall_timeout:
                    raise _Stalled() from None
                await asyncio.sleep(_STALL_POLL)
                waited += _STALL_POLL
            except zmq.ZMQError as e:
                if e.errno == zmq.EHOSTUNREACH:
                    raise _Gone() from None
                raise

    # -- COLLECTOR ---------------------------------------------------------------------

    async def _collector_loop(self) -> None:
        sock = self._sockets["collector"]
        sync = self._collector_sync
        assert sync is not None
        limit = self._config.max_message_size
        max_batch = self._config.max_batch
        read_queued = zmqio.Reader(sync)
        read = 0
        turn_started = time.monotonic()
        while True:
            # Let the loop run (the engine's writer commits what was registered) at least
            # every `_COLLECT_PUBS` PUBs or `_COLLECT_SECONDS`. The receive below does not
            # yield while PUBs are queued (pyzmq completes it at once), nor may `publish`
            # (the duplicate lookup runs inline when the store allows): without this a
            # flood of PUBs kept the writer from ever running, so nothing was committed
            # or broadcast until the flood stopped (seen with NORMAL). Not after every
            # batch: under a flood that made commits of a few dozen events, each
            # rewriting the same index pages (+7 µs per PUB at 50 per commit against
            # 1,000). A PUB arriving alone yields in the receive anyway.
            if read >= _COLLECT_PUBS or time.monotonic() - turn_started >= _COLLECT_SECONDS:
                await asyncio.sleep(0)
                read = 0
                turn_started = time.monotonic()
            messages = [await sock.recv_multipart()]
            # Take what is already queued: one engine session per batch.
            messages += read_queued(max_batch - 1)
            pubs: list[wire.Publish] = []
            peers: list[bytes] = []
            for frames in messages:
                identity, body = frames[0], frames[1:]
                # The size is summed here, `_oversized` called only to refuse: a call per
                # PUB is measurable at 20,000/s.
                if sum(map(len, body)) > limit and self._oversized("PUB", body, limit, identity):
                    continue
                try:
                    pubs.append(wire.parse_pub(body))
                    peers.append(identity)
                except wire.WireError as e:
                    self.rejections.reject(e.reason, str(e), _peer(identity))
            if not pubs:
                continue
            read += len(pubs)
            result = await self._handler.publish(pubs)
            for index, reason, detail in result.refused:
                self.rejections.reject(reason, detail, _peer(peers[index]))
            self.counters.duplicates += result.duplicates
            self.counters.published += len(pubs) - result.duplicates - len(result.refused)

    # -- ZAP (PLAIN, password = the fleet token) ---------------------------------------

    async def _zap_loop(self) -> None:
        sock = self._sockets["zap"]
        while True:
            msg = await sock.recv_multipart()
            if len(msg) < 6:
                continue  # not a ZAP request; REP still needs an answer
            version, request_id, _domain, address, _identity, mechanism = msg[:6]
            credentials = msg[6:]
            if self._curve is not None:
                user, why = self._curve.authorize(
                    _domain, address.decode(errors="replace"), mechanism, credentials
                )
            else:
                ok = (
                    mechanism == b"PLAIN"
                    and len(credentials) == 2
                    and any(hmac.compare_digest(credentials[1], t.encode()) for t in self._tokens())
                )
                user = credentials[0] if ok else None
                name = credentials[0][:64] if credentials else b""
                why = f"{mechanism.decode(errors='replace')} credentials refused (user {name!r})"
            if user is not None:
                reply = [version, request_id, b"200", b"OK", user, b""]
            else:
                self.rejections.reject(
                    RejectReason.BAD_KEY if mechanism == b"CURVE" else RejectReason.BAD_TOKEN,
                    why,
                    address.decode(errors="replace"),
                )
                reply = [version, request_id, b"400", b"bad credentials", b"", b""]
            await sock.send_multipart(reply)

    # -- connection counting -----------------------------------------------------------

    async def _monitor_loop(self, name: str, monitor: zmq.asyncio.Socket) -> None:
        try:
            while True:
                frames = await monitor.recv_multipart()
                event, _value = struct.unpack("=hi", frames[0][:6])
                endpoint = frames[1].decode(errors="replace") if len(frames) > 1 else ""
                if event == zmq.EVENT_ACCEPTED:
                    self.counters.connections[name] += 1
                elif event == zmq.EVENT_DISCONNECTED:
                    self.counters.connections[name] = max(0, self.counters.connections[name] - 1)
                    if name == "publisher":
                        # Read the unsubscriptions the disconnect queued, so a replica
                        # without commits does not collect them from churning clients.
                        self._read_subscriptions()
                elif self._curve is not None:
                    self.rejections.reject(
                        RejectReason.BAD_KEY,
                        f"{name} handshake failed (a client without CURVE, or with another "
                        "server key?)",
                        endpoint,
                    )
                elif self._token is not None:
                    self.rejections.reject(
                        RejectReason.BAD_TOKEN,
                        f"{name} handshake failed (a client without PLAIN credentials?)",
                        endpoint,
                    )
        finally:
            self._disable_monitors(name)  # before the reading end goes (see there)
            monitor.close(linger=0)
