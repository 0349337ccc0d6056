"""The Event BUS's per-event ZeroMQ loops: reading every queued PUB, sending a commit's
BROADCASTs. One call each, in C where the extension was built, frame by frame through
pyzmq otherwise, with the same result.

- `Reader(sock)(limit)`: the messages already queued (the collector awaits the first
  of a batch, then takes the rest without waiting). C: ~1 µs per seven-frame PUB;
  pyzmq: 7-10 µs (a Python call, a Frame object and a copy per frame).
- `Broadcaster(sock, rfc)(items)`: each ``(sequence, (topic, producer, timestamp, uuid,
  data))`` as one six-frame message, never waiting. C: ~0.7 µs per BROADCAST; pyzmq:
  ~3 µs (a Python call per frame).

The C module is `_zmqio` (`_zmqio.c`, docs/decisions.md "Four small C extensions"). It is
bound to the libzmq that pyzmq loaded, so it works on pyzmq's own sockets. When it is
missing (no compiler at install) or cannot be bound, both fall back to pyzmq; `kind` and
`describe` say which, and the server logs it at start. Socket errors raise
`zmq.ZMQError` either way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import ModuleType

import zmq

Messages = list[list[bytes]]
Frames = tuple[bytes, bytes, bytes, bytes, bytes]
"""A BROADCAST's frames but the sequence: ``(topic, producer, timestamp, uuid, data)``."""
Item = tuple[int, Frames]

# The backend's send, called with the socket: the sugar layer's `Socket.send` adds
# routing-id/group handling we never use, ~40% of the cost of a small frame. Also the
# server's snapshot loop's (the one per-event loop still frame by frame).
send_frame = zmq.backend.Socket.send


@functools.cache
def _libzmq_path() -> str | None:
    """The file of the libzmq this process has loaded (pyzmq's own, bundled or not)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address perms offset dev inode path
                if len(fields) < 6:
                    continue  # an anonymous mapping
                path = fields[5].strip()
                name = path.rsplit("/", 1)[-1]
                if name.startswith("libzmq") and ".so" in name:
                    return path
    except OSError:
        return None
    return None


@functools.cache
def _c_module() -> tuple[ModuleType | None, str]:
    """The C module bound to pyzmq's libzmq, or None and why not."""
    try:
        from eventfleet_server.bus import _zmqio  # optional: built where a compiler is
    except ImportError as e:
        return None, f"the C extension is not built ({e})"
    path = _libzmq_path()
    if path is None:
        return None, "pyzmq's libzmq is not found in /proc/self/maps"
    try:
        _zmqio.bind(path)
    except OSError as e:
        return None, str(e)
    return _zmqio, f"C, {path}"


def _choose(use_c: bool) -> tuple[ModuleType | None, str, str]:
    """``(module or None, kind, describe)``."""
    module, why = _c_module() if use_c else (None, "pyzmq requested")
    if module is not None:
        return module, "c", why
    return None, "pyzmq", f"pyzmq frame by frame ({why})"


def _zmq_error(e: OSError) -> zmq.ZMQError:
    # The extension reports libzmq's errno; the caller sees what pyzmq would raise.
    return zmq.ZMQError(e.errno)


class Reader:
    """``reader(limit)``: up to `limit` messages already queued on the socket, each a list
    of its frames; ``[]`` when none is. Never waits."""

    def __init__(self, sock: zmq.Socket, *, use_c: bool = True):
        self._sock = sock
        module, self.kind, self.describe = _choose(use_c)
        if module is not None:
            drain, address = module.drain, sock.underlying

            def read(limit: int) -> Messages:
                try:
                    return drain(address, limit)
                except OSError as e:
                    raise _zmq_error(e) from None

            self._read: Callable[[int], Messages] = read
        else:
            self._read = self._read_pyzmq

    def __call__(self, limit: int) -> Messages:
        return self._read(limit)

    def _read_pyzmq(self, limit: int) -> Messages:
        recv = self._sock.recv
        nonblocking = int(zmq.NOBLOCK)
        out: Messages = []
        while len(out) < limit:
            try:
                frame = recv(nonblocking, copy=False)
            except zmq.Again:
                break
            # A frame object's `more` is cheaper than asking the socket for RCVMORE.
            frames = [frame.bytes]
            while frame.more:
                frame = recv(0, copy=False)
                frames.append(frame.bytes)
            out.append(frames)
        return out


class Broadcaster:
    """``broadcaster(items)``: send each ``(sequence, (topic, producer, timestamp, uuid,
    data))`` as one message ``[topic, sequence, producer, timestamp, uuid, data]``, in
    order, without waiting (a PUB socket drops what a full subscriber queue cannot take).
    The sequence frame is 8 bytes big-endian when `rfc`, else ASCII decimal."""

    def __init__(self, sock: zmq.Socket, *, rfc: bool, use_c: bool = True):
        self._sock = sock
        self._rfc = rfc
        module, self.kind, self.describe = _choose(use_c)
        if module is not None:
            broadcast, address = module.broadcast, sock.underlying

            def send(items: Sequence[Item]) -> None:
                try:
                    broadcast(address, items, rfc)
                except OSError as e:
                    raise _zmq_error(e) from None

            self._send: Callable[[Sequence[Item]], None] = send
        else:
            self._send = self._send_pyzmq

    def __call__(self, items: Sequence[Item]) -> None:
        self._send(items)

    def _send_pyzmq(self, items: Sequence[Item]) -> None:
        sock = self._sock
        send = send_frame
        more = int(zmq.SNDMORE | zmq.NOBLOCK)  # plain ints: no flag arithmetic per frame
        last = int(zmq.NOBLOCK)
        rfc = self._rfc
        for seq, (topic, producer, timestamp, uuid, data) in items:
            send(sock, topic, more)
            send(sock, seq.to_bytes(8, "big") if rfc else b"%d" % seq, more)
            send(sock, producer, more)
            send(sock, timestamp, more)
            send(sock, uuid, more)
            send(sock, data, last)
