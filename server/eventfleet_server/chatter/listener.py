"""A chatter listener with admission: what every chatter protocol server shares.

The protocol supplies one coroutine, ``initialize(conn, first_msg) -> session`` (or it
raises `InitRejected`), and sessions with a ``run()`` coroutine. This module does the
rest, identically for every protocol: the pre-init and session budgets (total and per
address, `listener.admission`), the small frame limit until init and the configured one
after, the init timeout, the init-error-then-close sequence with a bounded wait, counted
and rate-limited refusals, and closing every session on stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from eventfleet_server.chatter.connection import Connection, FrameError, FrameTooLarge, Msg
from eventfleet_server.listener import (
    Admission,
    AdmissionLimits,
    Rejections,
    RejectReason,
    Ticket,
    tls_accept,
)

log = logging.getLogger(__name__)


class Session(Protocol):
    conn: Connection

    async def run(self) -> None: ...


class InitRejected(Exception):
    """Raised by a protocol's ``initialize``: refuse the session.

    `reply` (message type, encoded body) is sent on the init conversation before the
    connection is closed; `client` names the client in the log when known.
    """

    def __init__(
        self,
        reason: RejectReason,
        error: str,
        reply: tuple[str, bytes] | None = None,
        client: str | None = None,
    ):
        super().__init__(error)
        self.reason = reason
        self.error = error
        self.reply = reply
        self.client = client


Initialize = Callable[[Connection, Msg], Awaitable[Session]]


def frame_error_reason(error: FrameError) -> RejectReason:
    return (
        RejectReason.MESSAGE_TOO_LARGE
        if isinstance(error, FrameTooLarge)
        else RejectReason.BAD_FRAME
    )


class ChatterListener:
    """Listens on host:port for one chatter protocol named `protocol`."""

    def __init__(
        self,
        protocol: str,
        host: str,
        port: int,
        *,
        init_type: str,
        initialize: Initialize,
        limits: AdmissionLimits,
        rejections: Rejections,
        ping_delay: float | None = 20.0,
        ping_timeout: float = 20.0,
        ssl: Any = None,
    ):
        self.protocol = protocol
        self._ssl = ssl  # an ssl.SSLContext: serve TLS (handshake bounded by init_timeout)
        self._host = host
        self._port = port
        self._init_type = init_type
        self._initialize_cb = initialize
        self.limits = limits
        self.rejections = rejections
        self.admission = Admission(limits, rejections)
        self._ping = (ping_delay, ping_timeout)
        self._server: asyncio.Server | None = None
        self._bound_port: int | None = None
        self._conns: set[Connection] = set()
        self._serving: set[asyncio.Task] = set()  # one per connection (a reference kept)
        self.sessions: set[Any] = set()

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0); still known after `stop`, when
        /status may be asked while the replica drains."""
        assert self._bound_port is not None, "listener not started"
        return self._bound_port

    async def start(self) -> None:
        # TLS is started per connection (`_accept_tls`), not by the server: a handshake
        # that fails inside asyncio's server is dropped without a trace (logged only in
        # the loop's debug mode), and a refusal nobody can see is no refusal.
        if self._ssl is not None:
            self._server = await tls_accept.serve(self._accept_tls, self._host, self._port)
        else:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(self._protocol, self._host, self._port)
        self._bound_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server:
            self._server.close()
        for conn in list(self._conns):
            conn.close()
        if self._server:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()
        self.rejections.flush()

    def _protocol(self) -> Connection:
        """A plain connection's protocol: admission when it is made, then the session."""
        delay, timeout = self._ping
        return Connection(
            max_msg_size=self.limits.pre_init_max_msg_size,
            ping_delay=delay,
            ping_timeout=timeout,
            on_made=self._admit,
        )

    def _admit(self, conn: Connection) -> None:
        transport = conn._transport
        ticket = self.admission.admit(conn.address, evict=transport.abort)  # type: ignore[union-attr]
        if ticket is None:
            conn.abort(quiet=True)
            return
        self._start(conn, ticket)

    def _start(self, conn: Connection, ticket: Ticket) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(conn, ticket))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    def _accept_tls(self, transport: Any) -> None:
        """A TLS connection, from its ``connection_made``: admission first (a refused
        client costs no handshake; handshakes count against the caps), then the TLS
        layer, bounded by `init_timeout`. A failed handshake is counted
        (``tls_handshake``) with its cause and the connection dropped."""
        address = tls_accept.peer_host(transport)
        ticket = self.admission.admit(address, evict=transport.abort)
        if ticket is None:
            transport.abort()
            return
        delay, ping_timeout = self._ping
        app = Connection(
            max_msg_size=self.limits.pre_init_max_msg_size,
            ping_delay=delay,
            ping_timeout=ping_timeout,
            on_made=lambda conn: self._start(conn, ticket),
        )
        timeout = self.limits.init_timeout
        done = tls_accept.accept_tls(transport, app, self._ssl, timeout=timeout)

        def failed(cause: str) -> None:
            ticket.release()
            self.rejections.reject(RejectReason.TLS_HANDSHAKE, f"TLS handshake: {cause}", address)

        tls_accept.on_failure(done, transport, failed, timeout=timeout)

    async def _serve(self, conn: Connection, ticket: Ticket) -> None:
        with ticket:
            self._conns.add(conn)
            try:
                session = await self._initialize(conn, ticket)
                if session is None:
                    return
                conn.set_max_msg_size(self.limits.max_msg_size)
                self.sessions.add(session)
                try:
                    await session.run()
                finally:
                    self.sessions.discard(session)
            except Exception:
                log.exception("%s connection %s: handler failed", self.protocol, conn.peer)
            finally:
                self._conns.discard(conn)
                conn.close()

    async def _initialize(self, conn: Connection, ticket: Ticket) -> Session | None:
        limits = self.limits
        try:
            async with asyncio.timeout(limits.init_timeout):
                msg = await conn.receive()
        except TimeoutError:
            self._refuse(conn, RejectReason.INIT_TIMEOUT, f"no init within {limits.init_timeout} s")
            return None
        except FrameError as e:
            self._refuse(conn, frame_error_reason(e), f"before init: {e}", abort=True)
            return None
        except ConnectionError:
            return None
        if msg.type != self._init_type:
            self._refuse(
                conn,
                RejectReason.NOT_INITIALIZED,
                f"first message is {msg.type!r}, expected {self._init_type}",
            )
            return None
        # The session place is taken before the protocol checks the token and answers
        # (the callbacks decide without awaiting, so no other connection sees the place
        # taken by one that is then refused); a refused init gives it back at once.
        if not ticket.promote():  # refusal counted by the admission
            conn.close(f"{self.protocol}: no session place left", quiet=True)
            return None
        try:
            return await self._initialize_cb(conn, msg)
        except InitRejected as e:
            ticket.demote()
            client = f" client {e.client!r}" if e.client else ""
            self.rejections.reject(e.reason, f"init of{client} rejected: {e.error}", conn.peer)
            if e.reply is not None:
                with contextlib.suppress(ConnectionError):
                    conn.send(e.reply[0], e.reply[1], conv=msg.conv)
            await conn.close_after_flush(
                limits.init_error_close_timeout, f"{self.protocol}: {e.error}"
            )
            return None

    def _refuse(self, conn: Connection, reason: RejectReason, detail: str, *, abort=False):
        self.rejections.reject(reason, detail, conn.peer)
        if abort:
            conn.abort(f"{self.protocol}: {detail}", quiet=True)
        else:
            conn.close(f"{self.protocol}: {detail}", quiet=True)


async def messages(conn: Connection, rejections: Rejections, label: str) -> AsyncIterator[Msg]:
    """The application messages of an initialised connection until it closes.

    A bad or oversize frame is a counted refusal and aborts the connection; a closed
    connection simply ends the iteration.
    """
    while True:
        try:
            msg = await conn.receive()
        except FrameError as e:
            rejections.reject(frame_error_reason(e), f"{label}: {e}", conn.peer)
            conn.abort(f"{label}: {e}", quiet=True)
            return
        except ConnectionError:
            return
        yield msg


def refuse(
    conn: Connection, rejections: Rejections, reason: RejectReason, detail: str, *, abort=False
) -> None:
    """Count, log (rate-limited) and close a session for `reason`."""
    rejections.reject(reason, detail, conn.peer)
    if abort:
        conn.abort(detail, quiet=True)
    else:
        conn.close(detail, quiet=True)
