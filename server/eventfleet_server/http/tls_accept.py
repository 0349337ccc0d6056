"""TLS for the HTTP port with the handshake in our hands.

aiohttp given an ``ssl_context`` lets asyncio's TLS layer drop a failed handshake
without telling the application, so nothing could count or log it. Here the listener
accepts plain TCP, runs the server side of the handshake itself (bounded in time), and
only then hands the TLS transport to aiohttp's protocol. A failure (a plain-HTTP client,
a client that does not trust the CA, no handshake in time) is reported to ``failed``
with the peer and the cause: the replica counts it as
``eventfleet_rejected_total{protocol="http", reason="tls_handshake"}``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

Failed = Callable[[str, str], None]  # (peer, cause)


class TlsAccept(asyncio.Protocol):
    """One accepted connection until its TLS handshake is done (then aiohttp's)."""

    def __init__(
        self,
        make_protocol: Callable[[], asyncio.BaseProtocol],
        context: ssl.SSLContext,
        timeout: float,
        failed: Failed,
    ) -> None:
        self._make_protocol = make_protocol
        self._context = context
        self._timeout = timeout
        self._failed = failed
        self._task: asyncio.Task | None = None

    def connection_made(self, transport: Any) -> None:
        # The ClientHello must wait in the socket for start_tls, not reach this protocol.
        transport.pause_reading()
        self._task = asyncio.get_running_loop().create_task(self._handshake(transport))

    async def _handshake(self, transport: Any) -> None:
        loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if peer else "?"
        inner = self._make_protocol()
        try:
            tls = await loop.start_tls(
                transport,
                inner,
                self._context,
                server_side=True,
                ssl_handshake_timeout=self._timeout,
            )
        except (ssl.SSLError, OSError, TimeoutError, ConnectionError) as e:
            cause = (
                f"no handshake within {self._timeout} s"
                if isinstance(e, TimeoutError)
                else f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"
            )
            self._failed(address, cause)
            transport.abort()
            return
        if tls is None:  # closed during the handshake
            return
        inner.connection_made(tls)

    def data_received(self, data: bytes) -> None:  # pragma: no cover - reading is paused
        pass

    def connection_lost(self, exc: BaseException | None) -> None:
        # Lost before the handshake finished: start_tls raises in the task, which ends.
        pass


async def serve(
    make_protocol: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    context: ssl.SSLContext,
    *,
    timeout: float,
    failed: Failed,
) -> asyncio.Server:
    """Listen on ``host:port`` serving TLS to ``make_protocol`` (aiohttp's server)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: TlsAccept(make_protocol, context, timeout, failed),
        host,
        port,
        reuse_address=True,
    )
