"""Server-side TLS on an accepted connection, with the handshake in our hands.

Given an ``ssl`` context, asyncio's (and uvloop's) server drops a failed handshake
without telling the application, so nothing could count or log it. Our listeners accept
plain TCP and call `accept_tls` from the accepting protocol's ``connection_made``: the
loop's own TLS protocol is put between the transport and the application protocol at
once, and the returned future says how the handshake ended.

Why at once and not with ``loop.start_tls`` from a task: uvloop starts reading as soon
as ``connection_made`` returns, whatever the protocol asked (a ``pause_reading`` there is
ignored), so a client's ClientHello can be read before such a task runs and is lost to
the TLS layer; both sides then wait for each other until the handshake timeout. That
happened under load in CI on the Eventer and HTTP ports.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ssl
import sys
from collections.abc import Callable
from typing import Any

Failed = Callable[[str, str], None]  # (peer address, cause)


def _tls_protocol_class(loop: asyncio.AbstractEventLoop) -> type:
    """The loop's own TLS protocol: uvloop ships one for its transports (found through
    the loop's class, so this module does not import uvloop), asyncio's otherwise."""
    for base in type(loop).__mro__:
        found = getattr(sys.modules.get(base.__module__), "SSLProtocol", None)
        if isinstance(found, type):
            return found
    return asyncio.sslproto.SSLProtocol


def peer_address(transport: Any) -> str:
    """``host:port`` of the remote end (for log lines)."""
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "?")


def peer_host(transport: Any) -> str:
    """The remote address alone (what admission counts per)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) else str(peer or "?")


def accept_tls(
    transport: Any, app_protocol: asyncio.BaseProtocol, context: ssl.SSLContext, *, timeout: float
) -> asyncio.Future[None]:
    """Start the server side of TLS on `transport`, from its protocol's
    ``connection_made`` (before the loop reads a byte). `app_protocol` gets
    ``connection_made`` with the TLS transport once the handshake is done. The future
    completes then, or with the handshake's error (the transport is closed by then)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    tls = _tls_protocol_class(loop)(
        loop,
        app_protocol,
        context,
        done,
        server_side=True,
        ssl_handshake_timeout=timeout,
    )
    transport.set_protocol(tls)
    tls.connection_made(transport)
    return done


def handshake_failure(error: BaseException, timeout: float) -> str:
    """A failed handshake's cause, as a log line and a test can read it."""
    if isinstance(error, ConnectionAbortedError):  # the TLS layer's own timeout
        return f"no handshake within {timeout:g} s"
    detail = getattr(error, "reason", None) or str(error)
    verify = getattr(error, "verify_message", None)  # why the peer's certificate failed
    if verify:
        detail = f"{detail} ({verify})"
    if not detail and isinstance(error, ConnectionResetError):
        detail = "closed by the client during the handshake"
    return f"{type(error).__name__}: {detail}"


def on_failure(
    done: asyncio.Future[None], transport: Any, report: Callable[[str], None], *, timeout: float
) -> None:
    """Call ``report(cause)`` if the handshake behind `done` fails (and drop the
    connection); nothing when it succeeds."""

    def finished(future: asyncio.Future[None]) -> None:
        error = (
            asyncio.CancelledError("handshake cancelled")
            if future.cancelled()
            else future.exception()
        )
        if error is None:
            return
        transport.abort()
        report(handshake_failure(error, timeout))

    done.add_done_callback(finished)


class _Accept(asyncio.Protocol):
    """The accepted connection's first protocol: hands the transport on at once."""

    def __init__(self, accepted: Callable[[Any], None]) -> None:
        self._accepted = accepted

    def connection_made(self, transport: Any) -> None:
        self._accepted(transport)


async def serve(
    accepted: Callable[[Any], None], host: str, port: int, **kwargs: Any
) -> asyncio.Server:
    """Listen on ``host:port``; ``accepted(transport)`` is called for each connection
    from its ``connection_made`` (where `accept_tls` belongs)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Accept(accepted), host, port, **kwargs)


async def serve_tls(
    make_protocol: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    context: ssl.SSLContext,
    *,
    timeout: float,
    failed: Failed,
) -> asyncio.Server:
    """Listen on ``host:port`` serving TLS to ``make_protocol()`` (e.g. aiohttp's
    server); each failed handshake is reported to ``failed(peer, cause)``."""

    def accepted(transport: Any) -> None:
        address = peer_address(transport)
        done = accept_tls(transport, make_protocol(), context, timeout=timeout)
        on_failure(done, transport, lambda cause: failed(address, cause), timeout=timeout)

    return await serve(accepted, host, port, reuse_address=True)
