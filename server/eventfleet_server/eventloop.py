"""Which asyncio event loop the replica runs on.

uvloop (libuv) is the usual fast loop for asyncio servers: fewer CPU cycles per socket
read/write and per callback than the stock selector loop. It is an optional
dependency (the ``server`` extra installs it where it builds) and the stock loop is the
fallback. Configured with the top-level ``event_loop`` key: ``auto`` (uvloop when it
imports, the default), ``uvloop`` (required: start fails without it) or ``asyncio``.

The replica also sets the interpreter's thread switch interval (`SWITCH_INTERVAL`).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")

SWITCH_INTERVAL = 0.0005
"""Seconds a thread waiting for the GIL lets its holder run before asking it to let go
(`sys.setswitchinterval`; Python's default is 0.005). The storage's writer thread lets
go of the GIL inside each SQLite step and needs it back after every one; while the event
loop runs Python code without a pause (decoding a Syncer catch-up's next messages), each
of those can take the whole interval. Measured with the main thread running Python
meanwhile: the writer waited 4.4-8.7 µs per merged row for the GIL at 5 ms, 1.5-3.1 at
0.5 ms (28 µs with one step per row); see docs/performance.md, run L. Shorter intervals
only add switches."""


class EventLoopError(Exception):
    """The configured event loop cannot be used (the message says why)."""


def loop_factory(choice: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """(name of the loop that will run, factory or None for the stock loop)."""
    if choice not in CHOICES:
        raise EventLoopError(f"event_loop {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return "asyncio", None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as e:
        if choice == "uvloop":
            raise EventLoopError(
                f"event_loop 'uvloop' is configured but uvloop cannot be imported ({e}); "
                "install it (pip install uvloop) or set event_loop to 'auto' or 'asyncio'"
            ) from e
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """`asyncio.run(main)` on the configured loop, with the replica's `SWITCH_INTERVAL`."""
    name, factory = loop_factory(choice)
    sys.setswitchinterval(SWITCH_INTERVAL)
    log.info("event loop: %s (event_loop=%s)", name, choice)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
