"""Jetstream over websockets on the replica's HTTP server (aiohttp).

The endpoint is mounted with `ProtocolContext.mount` (protocols never import ``http``):
``<path>`` is the websocket, ``<path>/demo`` a shared-list page using the reference
client, ``<path>/client.js`` that client bundled. Each connection has a bounded outgoing
queue drained by its own writer task, which also sends the periodic Ping.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import pathlib
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from eventfleet_server.jetstream import demo, wire
from eventfleet_server.jetstream.adapter import EngineBackend
from eventfleet_server.jetstream.config import JetstreamConfig
from eventfleet_server.jetstream.session import JetstreamProtocol, Session
from eventfleet_server.listener import (
    Admission,
    Rejections,
    RejectReason,
    Ticket,
    TokenPolicy,
    receive_text_frames,
)
from eventfleet_server.plugin import ProtocolServer

if TYPE_CHECKING:
    from eventfleet_server.plugin import ProtocolContext

log = logging.getLogger(__name__)

PARAM_PREFIX = "x-jetstream-"
DIRECT_WRITE_LIMIT = 64 * 1024  # bytes buffered in the socket before writes are queued


class Connection:
    """One websocket: the `Outlet` of the session it carries."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        peer: str,
        server: JetstreamServer,
        transport: asyncio.Transport | None = None,
    ):
        self.ws = ws
        self.peer = peer
        self._server = server
        # Uncompressed connections write frames at once when nothing is pending (see send).
        self._transport = transport if not server.config.compress else None
        self._sending = False
        self._queue: list[dict] = []
        self._wakeup = asyncio.Event()
        self._close: tuple[int, str] | None = None
        self.session: Session | None = None

    # Outlet
    def send(self, messages: list[dict]) -> None:
        if self._close is not None:
            return
        if not self._queue and not self._sending and self._write_now(messages):
            return
        self._queue.extend(messages)
        limit = self._server.config.max_queued_messages
        if len(self._queue) > limit:
            self._server.rejections.reject(
                RejectReason.SLOW_SUBSCRIBER,
                f"{len(self._queue)} messages queued (max_queued_messages {limit}); "
                "closing the connection, the session stays resumable",
                self.peer,
            )
            self._queue.clear()
            self.close(wire.CLOSE_CLOSED, "too slow: outgoing queue full")
        self._wakeup.set()

    def _write_now(self, messages: list[dict]) -> bool:
        """Write one text frame straight to the socket, in this call.

        Why: a change fanned out to hundreds of sessions would otherwise wake hundreds of
        writer tasks, one event-loop step each, and the last session would wait for all
        of them. Only when nothing is queued or being sent on this connection (frames stay
        in order) and the socket's buffer is small (a client that does not read takes the
        queued path, whose drain and `max_queued_messages` bound it). Server frames are
        unmasked (RFC 6455 5.1); without permessage-deflate a frame is a header and the
        UTF-8 text, as aiohttp itself writes it.
        """
        t = self._transport
        if t is None or t.is_closing() or t.get_write_buffer_size() > DIRECT_WRITE_LIMIT:
            return False
        payload = wire.encode(messages).encode()
        n = len(payload)
        if n < 126:
            header = bytes((0x81, n))
        elif n < 65536:
            header = bytes((0x81, 126)) + n.to_bytes(2, "big")
        else:
            header = bytes((0x81, 127)) + n.to_bytes(8, "big")
        t.write(header + payload if n < 16384 else header)
        if n >= 16384:
            t.write(payload)
        return True

    def close(self, code: int, reason: str) -> None:
        if self._close is None:
            self._close = (code, reason)
        self._wakeup.set()

    @property
    def closing(self) -> bool:
        return self._close is not None

    async def run_writer(self) -> None:
        """Send queued messages as one array per frame, then close when asked.

        No timer per connection: the server's ping task queues the idle-time Pings.
        """
        while True:
            if not self._queue and self._close is None:
                await self._wakeup.wait()
            self._wakeup.clear()
            if self._queue:
                batch, self._queue = self._queue, []
                self._sending = True
                try:
                    await self.ws.send_str(wire.encode(batch))
                except (ConnectionError, RuntimeError):
                    return
                finally:
                    self._sending = False
            if self._close is not None and not self._queue:
                code, reason = self._close
                # The reason is JSON {message, type} like the reference's denials.
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2.0):
                        await self.ws.close(code=code, message=reason.encode()[:120])
                return


class JetstreamServer(ProtocolServer):
    """`ProtocolServer` for Jetstream (see SCAFFOLD_CONTRACT)."""

    name = "jetstream"

    def __init__(self, config: JetstreamConfig, ctx: ProtocolContext):
        self.config = config
        self._ctx = ctx
        self.rejections = Rejections("jetstream")
        adm = config.admission
        self._pre_init_max = min(adm.pre_init_max_msg_size, config.max_message_size)
        self._init_timeout = adm.init_timeout
        self._admission = Admission(adm.limits(config.max_message_size), self.rejections)
        self._tokens = TokenPolicy.of(ctx.token)
        self.backend = EngineBackend(ctx.engine, config.type_prefix, config.model_schema())
        self.protocol = JetstreamProtocol(
            self.backend,
            authenticate=self._authenticate,
            reject=lambda reason, detail: self.rejections.reject(RejectReason(reason), detail),
            scope_pattern=config.scope_pattern,
            max_fragments=config.max_fragments,
            resend_buffer=config.resend_buffer,
            session_expiry=config.session_expiry,
        )
        # Per-connection tasks only (never critical): a child group so stop() awaits them.
        self._tasks = ctx.tasks.child("connections")
        self._connections: set[Connection] = set()
        self._unmounts: list[Callable[[], None]] = []
        self._ids = itertools.count(1)
        self._bundle = _find_bundle(config.client_bundle)
        self.fanout_messages = 0

    # -- ProtocolServer --------------------------------------------------------------------

    async def start(self) -> None:
        self.backend.start(self._on_changes)
        path = self.config.path
        self._unmounts.append(self._ctx.mount(path, self._handle_ws))
        self._unmounts.append(self._ctx.mount(path + "/demo", self._handle_demo))
        self._unmounts.append(self._ctx.mount(path + "/client.js", self._handle_bundle))
        self._ctx.tasks.spawn("jetstream/expiry", self._expiry_loop())
        self._ctx.tasks.spawn("jetstream/pings", self._ping_loop())
        log.info(
            "jetstream on http path %s (demo %s/demo, client bundle %s)",
            path,
            path,
            self._bundle or "not built: run scripts/tools/jetstream.sh",
        )

    async def stop(self) -> None:
        for unmount in self._unmounts:
            unmount()
        self._unmounts.clear()
        self.backend.stop()
        for conn in list(self._connections):
            conn.close(wire.CLOSE_CLOSED, "server stopping")
        self.protocol.close_all()
        await self._tasks.close()

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def rejected(self) -> Mapping[str, int]:
        return self.rejections.counts

    def health(self) -> str | None:
        return None

    def describe(self) -> dict:
        return {
            # On the replica's HTTP port (websocket upgrade at `path`).
            "port": self._ctx.core.http.port if getattr(self._ctx, "core", None) else None,
            "path": self.config.path,
            "connections": len(self._connections),
            "sessions": len(self.protocol.sessions),
            "scopes": self.protocol.scope_count,
            "syncs_applied": self.protocol.syncs_applied,
            "syncs_rejected": self.protocol.syncs_rejected,
            "fanout_messages": self.fanout_messages,
            "demo": self.config.path + "/demo",
            "client_bundle": bool(self._bundle),
        }

    # -- internals -------------------------------------------------------------------------

    def _authenticate(self, presented) -> str | None:
        if presented is not None and not isinstance(presented, str):
            return "params.token must be a string"
        return self._tokens.check(presented)

    def _on_changes(self, name: str, fragments: list[dict], origin: str | None) -> None:
        self.fanout_messages += self.protocol.broadcast(name, fragments, origin)

    async def _expiry_loop(self) -> None:
        period = max(0.5, min(5.0, self.config.session_expiry / 4))
        while True:
            await asyncio.sleep(period)
            self.protocol.expire_idle()

    async def _ping_loop(self) -> None:
        """About every `ping_interval` (±10 %), a Ping to every session, busy or not: its
        `ack` is what lets the client drop the messages it keeps for a resend (as the
        reference server, which pings on a timer whatever else it sends)."""
        interval = self.config.ping_interval
        while True:
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))
            for conn in list(self._connections):
                session = conn.session
                if session is not None and not conn.closing:
                    conn.send([wire.ping(session.client_index)])

    async def _handle_demo(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=demo.page(self.config), content_type="text/html")

    async def _handle_bundle(self, request: web.Request) -> web.StreamResponse:
        if not self._bundle:
            return web.Response(
                status=404,
                text="the reference client bundle is not built: run scripts/tools/jetstream.sh "
                "or set jetstream.client_bundle",
            )
        return web.FileResponse(self._bundle, headers={"Content-Type": "application/javascript"})

    async def _handle_ws(self, request: web.Request) -> web.StreamResponse:
        peer = request.remote or "?"
        ws = web.WebSocketResponse(
            max_msg_size=self.config.max_message_size,
            autoping=True,
            timeout=2.0,
            compress=self.config.compress,
        )
        if not ws.can_prepare(request).ok:
            return web.Response(
                status=400,
                text=f"Jetstream is a websocket endpoint; try {self.config.path}/demo\n",
            )
        transport = request.transport
        ticket = self._admission.admit(peer, evict=transport.abort if transport else None)
        if ticket is None:
            return web.Response(status=503, text="too many Jetstream connections\n")
        with ticket:
            await ws.prepare(request)
            conn = Connection(ws, peer, self, request.transport)
            self._connections.add(conn)
            writer = self._tasks.spawn(
                f"conn-{next(self._ids)}-writer", conn.run_writer(), critical=False
            )
            try:
                session = await self._open_session(request, ws, conn, ticket)
                if session is not None:
                    conn.session = session
                    await self._serve(ws, conn, session)
            finally:
                self._connections.discard(conn)
                if conn.session is not None:
                    self.protocol.detach(conn.session, conn)
                conn.close(wire.CLOSE_CLOSED, "connection done")
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(3.0):
                        await writer
                writer.cancel()
        return ws

    async def _open_session(
        self, request: web.Request, ws: web.WebSocketResponse, conn: Connection, ticket: Ticket
    ) -> Session | None:
        params = _connection_params(request)
        token = params.get("sessiontoken")
        if token:
            if not self._promote(conn, ticket):
                return None
            session = self.protocol.resume(token, conn)
            if session is None:
                ticket.demote()
                self.rejections.reject(
                    RejectReason.UNKNOWN_SESSION,
                    "resume with an unknown or expired session token",
                    conn.peer,
                )
                conn.close(
                    wire.CLOSE_DENIED,
                    _reason("session-token-unrecognized", "Session token unrecognized"),
                )
            return session
        try:
            async with asyncio.timeout(self._init_timeout):
                msg = await ws.receive()
        except TimeoutError:
            self.rejections.reject(
                RejectReason.INIT_TIMEOUT,
                f"no SessionCreate within {self._init_timeout} s",
                conn.peer,
            )
            conn.close(
                wire.CLOSE_DENIED,
                _reason("session-establish-timedout", "Session took too long to establish"),
            )
            return None
        if msg.type != WSMsgType.TEXT:
            if msg.type == WSMsgType.BINARY:
                self.rejections.reject(
                    RejectReason.BAD_FRAME, "binary frame instead of SessionCreate", conn.peer
                )
                conn.close(
                    wire.CLOSE_DENIED,
                    _reason("unrecognized-handshake", "Binary frames are not Jetstream"),
                )
            return None
        if len(msg.data) > self._pre_init_max:
            self.rejections.reject(
                RejectReason.MESSAGE_TOO_LARGE,
                f"{len(msg.data)} bytes before the session exists "
                f"(pre_init_max_msg_size {self._pre_init_max})",
                conn.peer,
            )
            conn.close(wire.CLOSE_DENIED, _reason("message-too-large", "First message too large"))
            return None
        try:
            messages = wire.decode(msg.data)
        except wire.WireError as e:
            self.rejections.reject(RejectReason.BAD_FRAME, e.message, conn.peer)
            conn.close(wire.CLOSE_DENIED, _reason(e.type, e.message))
            return None
        first = messages[0]
        if len(messages) != 1 or first["type"] != "SessionCreate":
            self.rejections.reject(
                RejectReason.NOT_INITIALIZED,
                f"first message {wire.describe(first)} is not a lone SessionCreate",
                conn.peer,
            )
            conn.close(
                wire.CLOSE_DENIED,
                _reason(
                    "unrecognized-handshake",
                    "Unrecognized handshake, should send SessionCreate message as first "
                    "and only message",
                ),
            )
            return None
        # Credentials: SessionCreate params.token, else the X-Jetstream-Token connection
        # parameter (the reference browser client cannot set SessionCreate params).
        if (
            isinstance(first.get("params"), dict)
            and "token" not in first["params"]
            and "token" in params
        ):
            first = {**first, "params": {**first["params"], "token": params["token"]}}
        elif first.get("params") is None and "token" in params:
            first = {**first, "params": {"token": params["token"]}}
        if not self._promote(conn, ticket):
            return None
        session = self.protocol.create_session(first, conn)
        if session is None:
            ticket.demote()
            conn.close(wire.CLOSE_DENIED, _reason("auth-error", "Session creation denied"))
        return session

    @staticmethod
    def _promote(conn: Connection, ticket: Ticket) -> bool:
        """Take a session place (listener/admission.py) before the credentials are
        checked (synchronously: nobody sees the place taken by a refused one)."""
        if ticket.promote():
            return True
        conn.close(wire.CLOSE_DENIED, _reason("too-many-connections", "Too many sessions"))
        return False

    async def _serve(self, ws: web.WebSocketResponse, conn: Connection, session: Session) -> None:
        async def on_text(text: str) -> None:
            try:
                messages = wire.decode(text)
            except wire.WireError as e:
                self.rejections.reject(RejectReason.BAD_FRAME, e.message, conn.peer)
                return
            for m in messages:
                await self.protocol.handle(session, m)

        await receive_text_frames(
            ws,
            on_text,
            lambda size: self.rejections.reject(
                RejectReason.BAD_FRAME,
                f"binary frame of {size} bytes (Jetstream is JSON text)",
                conn.peer,
            ),
            rejections=self.rejections,
            peer=conn.peer,
            size_limit=f"jetstream.max_message_size {self.config.max_message_size}",
            stop=lambda: conn.closing or session.expired,
        )


def _connection_params(request: web.Request) -> dict[str, str]:
    """``X-Jetstream-*`` headers and query parameters, keys lower-cased without the prefix
    (as the reference: ``X-Jetstream-SessionToken`` -> ``sessiontoken``)."""
    params: dict[str, str] = {}
    for source in (request.headers, request.query):
        for key, value in source.items():
            k = key.lower()
            if k.startswith(PARAM_PREFIX) and len(k) > len(PARAM_PREFIX):
                params[k[len(PARAM_PREFIX) :]] = value
    return params


def _reason(type_: str, message: str) -> str:
    return json.dumps({"message": message, "type": type_}, separators=(",", ":"))


def _find_bundle(configured: str | None) -> str | None:
    candidates = [configured, os.environ.get("EVENTFLEET_JETSTREAM_CLIENT")]
    # A source checkout: <repo>/server/eventfleet_server/jetstream/server.py
    candidates.append(
        str(pathlib.Path(__file__).resolve().parents[3] / ".tools/jetstream/jetstream-client.js")
    )
    for c in candidates:
        if c and pathlib.Path(c).is_file():
            return c
    return None
