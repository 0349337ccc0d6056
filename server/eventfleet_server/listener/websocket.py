"""The receive loop of a websocket protocol (Replication, Jetstream): text frames go to
the protocol, everything else is refused, counted and logged here, once for all.

Transport-free by duck typing, so the listener layer imports no aiohttp (an
import-linter contract): a frame is anything with a ``type`` enum whose member names are
RFC 6455's frame kinds (aiohttp's ``WSMsgType``: ``TEXT``, ``BINARY``, ``ERROR``...) and
a ``data``; an ``ERROR`` frame's data is the exception, with the RFC 6455 close code in
``code`` when there is one.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

from eventfleet_server.listener.reasons import RejectReason
from eventfleet_server.listener.rejections import Rejections

MESSAGE_TOO_BIG = 1009  # RFC 6455 close code: the frame is over the receiver's limit


async def receive_text_frames(
    ws: AsyncIterable[Any],
    on_text: Callable[[str], Awaitable[None] | None],
    on_binary: Callable[[int], None],
    *,
    rejections: Rejections,
    peer: str,
    size_limit: str,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Read `ws` until the peer closes, a websocket error, or `stop()` is true at the next
    frame.

    Each text frame's text goes to `on_text` (awaited when it returns an awaitable); a
    binary frame's size to `on_binary`, which refuses it in the protocol's own words (the
    websocket protocols here are JSON text). A frame over the size limit (`size_limit`
    names the setting and its value, for the log) or a broken frame is a counted
    rejection and ends the loop: the transport has failed the connection by then.
    """
    async for frame in ws:
        if stop():
            break
        kind = frame.type.name
        if kind == "TEXT":
            pending = on_text(frame.data)
            if pending is not None:
                await pending
        elif kind == "BINARY":
            on_binary(len(frame.data))
        elif kind == "ERROR":
            error = frame.data
            if getattr(error, "code", None) == MESSAGE_TOO_BIG:
                rejections.reject(
                    RejectReason.MESSAGE_TOO_LARGE, f"frame above {size_limit}; closed", peer
                )
            else:
                rejections.reject(RejectReason.BAD_FRAME, f"websocket error: {error}", peer)
            break
