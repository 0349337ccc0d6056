"""The Event BUS's CURVE listeners: ZeroMQ sockets bound through listening sockets of
ours, so that a server-key rotation can add a listener beside the old one.

libzmq copies a socket's options, the CURVE secret key included, into each listener
when it binds, and ties every accepted connection to its listener: unbinding the old
listener would drop every established session. So a new server key gets a *new*
listener on the same port next to the old one: both are listening sockets of this
process in one SO_REUSEPORT group (handed to libzmq with ZMQ_USE_FD), and a classic BPF
program on the group (SO_ATTACH_REUSEPORT_CBPF) steers every new connection to the
newest. Established sessions stay on the old listener with the old key until they end;
new connections use the new key. The old listeners close with the sockets.

Linux only (SO_ATTACH_REUSEPORT_CBPF); `RotatingListeners.rotate` fails before any new
listener takes a connection where the steering is not available.
"""

from __future__ import annotations

import ctypes
import dataclasses
import socket
from collections.abc import Callable

import zmq

# Linux: attach a classic BPF program choosing the socket of a SO_REUSEPORT group.
_SO_ATTACH_REUSEPORT_CBPF = 51
_BPF_RET_K = 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _steer_to(listener: int, index: int) -> None:
    """Every new connection of the SO_REUSEPORT group of the listening descriptor
    `listener` goes to the group's `index`-th socket (in the order they started
    listening)."""
    program = (_SockFilter * 1)(_SockFilter(_BPF_RET_K, 0, 0, index))
    fprog = _SockFprog(1, program)
    view = socket.socket(fileno=listener)  # borrowed: libzmq owns the descriptor
    try:
        view.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_REUSEPORT_CBPF, bytes(fprog))
    finally:
        view.detach()


def _listening_socket(host: str, port: int) -> socket.socket:
    host = "0.0.0.0" if host == "*" else host  # libzmq's "any" spelling
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # as libzmq's ipv6
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclasses.dataclass
class _Endpoint:
    """One port: the ZeroMQ socket bound on it and its listening descriptors (owned by
    libzmq), oldest first (index = position in the SO_REUSEPORT group)."""

    sock: zmq.Socket
    host: str
    port: int
    listeners: list[int] = dataclasses.field(default_factory=list)


def _attach(endpoint: _Endpoint, listener: socket.socket) -> None:
    sock = endpoint.sock
    address = f"tcp://[{endpoint.host}]:{endpoint.port}"
    if ":" not in endpoint.host:
        address = f"tcp://{endpoint.host}:{endpoint.port}"
    sock.setsockopt(zmq.USE_FD, listener.fileno())
    try:
        sock.bind(address)
    except BaseException:
        listener.close()
        raise
    finally:
        sock.setsockopt(zmq.USE_FD, -1)
    # libzmq owns the descriptor now: it closes it with the socket.
    endpoint.listeners.append(listener.detach())


class RotatingListeners:
    """The ports of one Event BUS whose listeners a key rotation renews (module
    docstring)."""

    def __init__(self) -> None:
        self._endpoints: list[_Endpoint] = []

    def bind(self, sock: zmq.Socket, host: str, port: int, *, rotating: bool = True) -> int:
        """Bind `sock` (configured) on `host`:`port` (0: a random port) through a
        listening socket of ours; the port. `rotating`: `rotate` renews it (PLAIN
        listeners are not)."""
        listener = _listening_socket(host, port)
        endpoint = _Endpoint(sock, host, listener.getsockname()[1])
        _attach(endpoint, listener)
        if rotating:
            self._endpoints.append(endpoint)
        return endpoint.port

    def rotate(
        self, configure: Callable[[zmq.Socket], None], restore: Callable[[zmq.Socket], None]
    ) -> None:
        """A new listener beside each rotating one, bound after `configure(sock)` (the
        new key), then every new connection steered to it. Raises (OSError, ZMQError)
        with every port back on its old listener, after `restore(sock)` (the old key),
        when a port or the steering is not available."""
        # Pin the group to the current newest listener first: this fails where the
        # steering is unsupported, before a new listener could take connections at
        # random with a key the clients may not know yet.
        for endpoint in self._endpoints:
            _steer_to(endpoint.listeners[-1], len(endpoint.listeners) - 1)
        fresh: list[socket.socket] = []
        try:
            for endpoint in self._endpoints:
                fresh.append(_listening_socket(endpoint.host, endpoint.port))
        except BaseException:
            for listener in fresh:
                listener.close()
            raise
        before = [len(e.listeners) for e in self._endpoints]
        try:
            for endpoint, listener in zip(self._endpoints, fresh, strict=True):
                configure(endpoint.sock)
                _attach(endpoint, listener)
                _steer_to(endpoint.listeners[-1], len(endpoint.listeners) - 1)
        except BaseException:
            # One key per port set, never a mix: every port back on its old listener
            # (a new one already bound stays idle: libzmq cannot drop it alone).
            for endpoint, count in zip(self._endpoints, before, strict=True):
                restore(endpoint.sock)
                _steer_to(endpoint.listeners[-1], count - 1)
            raise

    def clear(self) -> None:
        """Forget the listeners (called once the sockets are closed)."""
        self._endpoints.clear()
