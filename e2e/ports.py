"""Free TCP ports for servers that tests start on 127.0.0.1.

Two ways a "free" port goes wrong: an outgoing connection takes it between the check and
the server's bind (ports of the kernel's ephemeral range), and the same port is handed
out twice because the first taker had not bound it yet (ports reserved for pods that do
not run yet, like DNS names). So ports come from below the ephemeral range and none is
handed out twice in a test process.
"""

from __future__ import annotations

import pathlib
import random
import socket
import threading

HOST = "127.0.0.1"
_LOW = 10_000
_lock = threading.Lock()
_handed_out: set[int] = set()


def ephemeral_low() -> int:
    """The lowest port the kernel gives to outgoing connections."""
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_block(width: int, *, align: int = 1) -> int:
    """The first of `width` consecutive ports, all free now and never handed out before
    by this process; the first is a multiple of `align`."""
    high = max(ephemeral_low(), _LOW + 1_000) - width
    with _lock:
        for _ in range(500):
            base = random.randrange(_LOW, high, align)
            block = range(base, base + width)
            if any(p in _handed_out for p in block):
                continue
            if all(bindable(p) for p in block):
                _handed_out.update(block)
                return base
    raise RuntimeError(f"no block of {width} free ports found below {high + width}")


def free_port() -> int:
    """One free port (see `free_block`)."""
    return free_block(1)
