"""Hat Chatter transport (an asyncio Protocol), wire-compatible with `hat.drivers.chatter`.

Frame: 1 byte N, N-byte big-endian length L, then L bytes of an SBS ``HatChatter.Msg``
whose ``data`` is ``{type, data}`` with a fully qualified message type.

We keep our own implementation (instead of using ``hat.drivers.chatter`` on the server
side) for three reasons a server needs: a message-size limit checked before the body is
read, direct access to the transport's write buffer for slow-consumer policies, and no
per-message queue hops on the hot path. Interoperability is tested against the real
hat-event 0.9.44 client, which uses ``hat.drivers.chatter``.
"""

from eventfleet_server.chatter.connection import (
    Connection,
    Conversation,
    FrameError,
    FrameTooLarge,
    Msg,
    connect,
    serve,
)
from eventfleet_server.chatter.listener import (
    ChatterListener,
    InitRejected,
    frame_error_reason,
    messages,
    refuse,
)

__all__ = [
    "ChatterListener",
    "Connection",
    "Conversation",
    "FrameError",
    "FrameTooLarge",
    "InitRejected",
    "Msg",
    "connect",
    "frame_error_reason",
    "messages",
    "refuse",
    "serve",
]
