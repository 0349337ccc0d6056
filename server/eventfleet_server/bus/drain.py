"""Reading every queued message off a ZeroMQ socket in one call.

The collector takes PUBs in batches: after the first message of a batch is awaited, what
is already queued is read without waiting. Two readers do that with the same result:

- `_drain` (C, `_drain.c`): one call reads the whole queue, one bytes object per frame.
  ~1 µs per seven-frame PUB.
- pyzmq frame by frame (the fallback when the extension was not built, or the libzmq
  pyzmq loaded cannot be found): ~7-10 µs per PUB, a Python call, a Frame object and a
  copy per frame.

`reader(sock)` picks the first that works and says which in `Reader.kind`; the server
logs it at start. Both raise `zmq.ZMQError` for a socket error other than "nothing
queued".
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import zmq

log = logging.getLogger(__name__)

Messages = list[list[bytes]]


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
def _c_drain() -> tuple[Callable[[int, int], Messages] | None, str]:
    """The C reader bound to pyzmq's libzmq, or None and why not."""
    try:
        from eventfleet_server.bus import _drain  # optional: built where a compiler is
    except ImportError as e:
        return None, f"the C extension is not built ({e})"
    path = _libzmq_path()
    if path is None:
        return None, "pyzmq's libzmq is not found in /proc/self/maps"
    try:
        _drain.bind(path)
    except OSError as e:
        return None, str(e)
    return _drain.drain, f"C, {path}"


class Reader:
    """``reader(limit)``: up to `limit` messages already queued on the socket, each a list
    of its frames; ``[]`` when none is. Never waits."""

    def __init__(self, sock: zmq.Socket, *, use_c: bool = True):
        self._sock = sock
        drain, why = _c_drain() if use_c else (None, "pyzmq requested")
        if drain is not None:
            address = sock.underlying
            self.kind = "c"
            self.describe = why
            self._read = lambda limit: _checked(drain, address, limit)
        else:
            self.kind = "pyzmq"
            self.describe = f"pyzmq frame by frame ({why})"
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


def _checked(drain: Callable[[int, int], Messages], address: int, limit: int) -> Messages:
    try:
        return drain(address, limit)
    except OSError as e:
        # The extension reports libzmq's errno; the caller sees what pyzmq would raise.
        raise zmq.ZMQError(e.errno) from None
