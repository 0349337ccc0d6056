"""A small Event BUS client written from the RFC (micro-toolkit Event BUS Protocol), for
tests and benchmarks. Deliberately independent of `eventfleet_server.bus`: it builds
and parses frames itself, in either integer encoding ("reference": ASCII decimal,
"rfc": 8 bytes big-endian) and with either subtree separator.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid as uuidlib
from dataclasses import dataclass

import msgpack
import zmq
import zmq.asyncio

HOST = "127.0.0.1"


def encode_int(value: int, encoding: str) -> bytes:
    if encoding == "rfc":
        return value.to_bytes(8, "big")
    return str(value).encode()


def decode_int(frame: bytes, encoding: str) -> int:
    if encoding == "rfc":
        assert len(frame) == 8, f"RFC integer frame must be 8 bytes, got {frame!r}"
        return int.from_bytes(frame, "big")
    assert frame.isdigit(), f"reference integer frame must be ASCII digits, got {frame!r}"
    return int(frame)


@dataclass(frozen=True)
class BusEvent:
    topic: str
    sequence: int
    producer: str
    timestamp: str
    uuid: str
    data: object  # decoded msgpack

    @classmethod
    def from_frames(cls, frames: list[bytes], encoding: str) -> BusEvent:
        assert len(frames) == 6, f"an event has 6 frames, got {len(frames)}: {frames!r}"
        topic, seq, producer, ts, uuid, data = frames
        return cls(
            topic.decode(),
            decode_int(seq, encoding),
            producer.decode(),
            ts.decode(),
            uuid.decode(),
            msgpack.unpackb(data, raw=False) if data else None,
        )


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


class BusClient:
    """SNAPSHOT (DEALER), SUBSCRIBER (SUB) and PUBLISHER (DEALER) connections to one
    server whose SNAPSHOT port is `port` (PUB on port+1, COLLECTOR on port+2)."""

    def __init__(
        self,
        port: int,
        *,
        encoding: str = "reference",
        separator: str = ",",
        plain: tuple[str, str] | None = None,
        host: str = HOST,
        rcvhwm: int | None = None,
        server_encoding: str | None = None,
    ):
        """`encoding` is what this client writes; `server_encoding` (default: the same)
        what it expects from the server (the server writes one configured form)."""
        self.port = port
        self.host = host
        self.encoding = encoding
        self.read_encoding = server_encoding or encoding
        self.separator = separator
        self.plain = plain
        self.rcvhwm = rcvhwm
        self.ctx = zmq.asyncio.Context()
        self._snapshot: zmq.asyncio.Socket | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._pub: zmq.asyncio.Socket | None = None

    def _socket(self, kind: int, offset: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.linger = 0
        if self.plain:
            sock.plain_username = self.plain[0].encode()
            sock.plain_password = self.plain[1].encode()
        if self.rcvhwm is not None:
            sock.rcvhwm = self.rcvhwm
        sock.connect(f"tcp://{self.host}:{self.port + offset}")
        return sock

    @property
    def snapshot_socket(self) -> zmq.asyncio.Socket:
        if self._snapshot is None:
            self._snapshot = self._socket(zmq.DEALER, 0)
        return self._snapshot

    @property
    def publisher_socket(self) -> zmq.asyncio.Socket:
        if self._pub is None:
            self._pub = self._socket(zmq.DEALER, 2)
        return self._pub

    def subscribe(self, *prefixes: str) -> zmq.asyncio.Socket:
        """Connect the SUB socket with these topic prefixes ('' = everything)."""
        if self._sub is None:
            self._sub = self._socket(zmq.SUB, 1)
        for prefix in prefixes or ("",):
            self._sub.subscribe(prefix.encode())
        return self._sub

    async def recv(self, timeout: float = 10.0) -> BusEvent:
        assert self._sub is not None
        frames = await asyncio.wait_for(self._sub.recv_multipart(), timeout)
        return BusEvent.from_frames(frames, self.read_encoding)

    def pending(self) -> list[BusEvent]:
        """Every BROADCAST already queued on the SUB socket (non-blocking)."""
        out = []
        assert self._sub is not None
        sync = zmq.Socket.shadow(self._sub.underlying)
        while True:
            try:
                frames = sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            out.append(BusEvent.from_frames(frames, self.read_encoding))

    async def syncstart(
        self, subtrees: list[str] | str = "", sequence: int = 0, timeout: float = 30.0
    ) -> tuple[list[BusEvent], int]:
        """SYNCSTART -> (the SYNC events, SYNCEND's sequence)."""
        spec = subtrees if isinstance(subtrees, str) else self.separator.join(subtrees)
        sock = self.snapshot_socket
        await sock.send_multipart(
            [b"SYNCSTART", spec.encode(), encode_int(sequence, self.encoding)]
        )
        events = []
        async with asyncio.timeout(timeout):
            while True:
                frames = await sock.recv_multipart()
                if frames[0] == b"SYNCEND":
                    assert len(frames) == 3, frames
                    assert frames[1] == spec.encode(), f"SYNCEND echoes {frames[1]!r}"
                    return events, decode_int(frames[2], self.read_encoding)
                assert frames[0] == b"SYNC", f"unexpected snapshot frame {frames[0]!r}"
                events.append(BusEvent.from_frames(frames[1:], self.read_encoding))

    async def publish(
        self,
        topic: str,
        data: object = None,
        *,
        uuid: str | None = None,
        producer: str = "e2e",
        timestamp: str | None = None,
        raw_data: bytes | None = None,
        timeout: float = 10.0,
    ) -> str:
        """Send a PUB; returns its UUID. The sequence frame is sent empty (the server
        assigns the sequence), as the reference client does. A send that cannot leave
        within `timeout` (no pipe: the server refused or dropped the connection) raises
        `TimeoutError` instead of waiting forever."""
        uuid = uuid or str(uuidlib.uuid4())
        data_frame = raw_data if raw_data is not None else msgpack.packb(data, use_bin_type=True)
        frames = [
            topic.encode(),
            b"" if self.encoding == "reference" else encode_int(0, "rfc"),
            producer.encode(),
            (timestamp if timestamp is not None else now_iso()).encode(),
            uuid.encode(),
            data_frame,
        ]
        await asyncio.wait_for(self.publisher_socket.send_multipart(frames), timeout)
        return uuid

    async def send_raw(self, offset: int, frames: list[bytes]) -> None:
        """Send arbitrary frames to the SNAPSHOT (0) or COLLECTOR (2) socket."""
        sock = self.snapshot_socket if offset == 0 else self.publisher_socket
        await sock.send_multipart(frames)

    def close(self) -> None:
        # destroy: closes every socket of the context first, so term() cannot block.
        self.ctx.destroy(linger=0)

    async def __aenter__(self) -> BusClient:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


async def wait_live(client: BusClient, publisher: BusClient, topic: str, timeout: float = 10.0):
    """Publish a probe on `topic` until the subscriber receives that probe: its
    subscription is live on the server and every PUB `publisher` sent before is
    broadcast (the collector keeps one client's order). Other messages received while
    waiting are dropped; returns them. Needs a subscription covering `topic`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    skipped = []
    markers = set()  # a probe published by an earlier round may arrive late
    while True:
        marker = f"probe-{uuidlib.uuid4()}"
        markers.add(marker)
        await publisher.publish(topic, marker)
        # Any message only proves the subscription; the probe proves the order too.
        probe_deadline = min(loop.time() + 0.5, deadline)
        while loop.time() < probe_deadline:
            try:
                event = await client.recv(timeout=max(probe_deadline - loop.time(), 0.01))
            except TimeoutError:
                break
            if event.topic == topic and event.data in markers:
                return skipped
            skipped.append(event)
        if loop.time() > deadline:
            raise TimeoutError(f"no probe on {topic!r} within {timeout} s")
