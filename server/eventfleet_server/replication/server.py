"""The replication protocol server: the publisher websocket endpoint and the upstreams.

Mounted on the replica's HTTP server through ``ctx.mount`` (this package never imports
the ``http`` room). Each websocket connection gets a `PublisherSession` (engine-free)
and a bounded outbox; a connection that does not read its messages is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import Any

from aiohttp import WSCloseCode, web

from eventfleet_server.listener import (
    Admission,
    Rejections,
    RejectReason,
    Ticket,
    receive_text_frames,
)
from eventfleet_server.plugin import ProtocolServer
from eventfleet_server.replication import wire
from eventfleet_server.replication.adapter import EngineBackend
from eventfleet_server.replication.config import ReplicationConfig
from eventfleet_server.replication.login import Credentials, FailedLogins
from eventfleet_server.replication.outbox import Outbox
from eventfleet_server.replication.replicator import Upstream
from eventfleet_server.replication.session import PublisherSession
from eventfleet_server.replication.table import Change

log = logging.getLogger(__name__)

HEARTBEAT = 30.0


class ReplicationServer(ProtocolServer):
    """`ProtocolServer` for Replication: publisher endpoint plus replicator upstreams."""

    name = "replication"

    def __init__(self, config: ReplicationConfig, ctx: Any):
        self.config = config
        self._ctx = ctx
        self._rejections = Rejections("replication")
        self._limits = config.admission.limits(config.max_message_size)
        self._admission = Admission(self._limits, self._rejections)
        self._failed_logins = FailedLogins(config.failed_login_limit, config.failed_login_window)
        self._tasks = ctx.tasks.child("replication")
        self.backend = EngineBackend(ctx.engine, config)
        self._credentials: Credentials | None = None
        self._connections: set[_Connection] = set()
        self._ids = itertools.count(1)
        self._unmount: Any = None
        self._unlisten: Any = None
        self.upstreams: list[Upstream] = []
        self._stopping = False

    # -- ProtocolServer ------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self._credentials = Credentials.load(cfg.users_file, cfg.password_file, self._ctx.token)
        if self._credentials.empty and cfg.tables:
            raise ValueError(
                "replication: no password source: set replication.users_file or "
                "replication.password_file, or give the fleet a token"
            )
        await self.backend.start()
        self._unlisten = self.backend.add_change_listener(self._on_changes)
        self._unmount = self._ctx.mount(cfg.path, self._handle, method="GET")
        for up in cfg.upstreams:
            upstream = Upstream(up, self.backend, self._ctx.token, self._tasks, self._rejections)
            await upstream.start()
            self.upstreams.append(upstream)
        log.info(
            "replication publishing %s on %s (guid %s), upstreams %s",
            sorted(self.backend.tables.tables),
            cfg.path,
            self.backend.guid,
            [u.config.name for u in self.upstreams],
        )

    async def stop(self) -> None:
        self._stopping = True
        if self._unmount is not None:
            self._unmount()
        for upstream in self.upstreams:
            await upstream.stop()
        for conn in list(self._connections):
            await conn.close(WSCloseCode.GOING_AWAY, "server stopping")
        if self._unlisten is not None:
            self._unlisten()
        self.backend.stop()
        await self._tasks.close(5.0)
        self._rejections.flush()

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def rejected(self) -> dict[str, int]:
        return self._rejections.counts

    def health(self) -> str | None:
        return None  # an unreachable upstream is reported in describe(), not as unready

    def describe(self) -> dict[str, Any]:
        return {
            "path": self.config.path,
            "guid": self.backend.guid,
            "usn": self.backend.last_seq(),
            "tables": {n: len(t.snapshot()) for n, t in self.backend.tables.tables.items()},
            "sessions": [c.session.describe() for c in self._connections],
            "upstreams": {u.config.name: u.describe() for u in self.upstreams},
            "rejected": self._rejections.counts,
        }

    # -- fan-out ---------------------------------------------------------------------

    def _on_changes(self, changes: list[Change]) -> None:
        for conn in list(self._connections):
            if conn.session.logged_in:
                conn.session.on_changes(changes)

    # -- websocket endpoint ----------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.remote or "unknown"
        if self._stopping:
            return web.json_response({"error": "replica is stopping"}, status=503)
        transport = request.transport
        ticket = self._admission.admit(peer, evict=transport.abort if transport else None)
        if ticket is None:
            return web.json_response({"error": "too many replication connections"}, status=503)
        with ticket:
            ws = web.WebSocketResponse(
                max_msg_size=self.config.max_message_size, heartbeat=HEARTBEAT, compress=False
            )
            await ws.prepare(request)
            conn = _Connection(self, ws, peer, next(self._ids), ticket)
            self._connections.add(conn)
            try:
                await conn.run()
            finally:
                self._connections.discard(conn)
                await conn.close()
        return ws


class _Connection:
    def __init__(
        self,
        server: ReplicationServer,
        ws: web.WebSocketResponse,
        peer: str,
        n: int,
        ticket: Ticket,
    ):
        self._server = server
        self._ws = ws
        self.peer = peer
        self.name = f"session-{n}"
        cfg = server.config
        self._outbox = Outbox(ws, cfg.max_send_queue)
        self._rejections = server._rejections
        self.session = PublisherSession(
            server.backend,
            credentials=server._credentials,  # type: ignore[arg-type]
            failed_logins=server._failed_logins,
            challenge_ttl=cfg.challenge_ttl,
            peer=peer,
            send=self._send,
            rejections=server._rejections,
            claim_session=ticket.promote,
        )
        self._closing = False
        # The last ReplicateNext frame and its message: a replicator in its initial pass
        # sends the same frame once per row, decoded once here (handling never changes
        # a message).
        self._next_text: str | None = None
        self._next_msg: dict[str, Any] = {}

    def _send(self, msg: dict[str, Any] | str) -> None:
        if not self._outbox.put(msg) and self._outbox.overflowed and not self._closing:
            self._refuse_and_close(
                RejectReason.SLOW_SUBSCRIBER,
                f"{len(self._outbox)} messages unsent (replication.max_send_queue); closing",
                "too slow: send queue full",
            )

    def _refuse_and_close(self, reason: RejectReason, detail: str, close_message: str) -> None:
        """Count the refusal and close the connection from a task (the callers are sync:
        a send, a timer); nothing is read or queued after this."""
        self._rejections.reject(reason, detail, self.peer)
        self._closing = True
        self._server._tasks.spawn(
            f"{self.name}/close",
            self.close(WSCloseCode.POLICY_VIOLATION, close_message),
            critical=False,
        )

    async def close(self, code: int = WSCloseCode.OK, message: str = "") -> None:
        self._closing = True
        self._outbox.close()
        if not self._ws.closed:
            with contextlib.suppress(Exception):
                await self._ws.close(code=code, message=message.encode())

    async def run(self) -> None:
        tasks = self._server._tasks
        writer = tasks.spawn(f"{self.name}/send", self._outbox.drain(), critical=False)
        timer = asyncio.get_running_loop().call_later(
            self._server._limits.init_timeout, self._login_expired
        )
        try:
            await self._read()
        finally:
            timer.cancel()
            self._outbox.close()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, Exception):
                await writer

    def _login_expired(self) -> None:
        if not self.session.logged_in and not self._closing:
            self._refuse_and_close(
                RejectReason.INIT_TIMEOUT,
                f"not logged in within {self._server._limits.init_timeout:g} s",
                "login timeout",
            )

    async def _read(self) -> None:
        await receive_text_frames(
            self._ws,
            self._on_text,
            lambda size: self.session.refuse(
                None,
                RejectReason.BAD_FRAME,
                f"binary frame of {size} bytes: AppWebsocket uses JSON text frames",
            ),
            rejections=self._rejections,
            peer=self.peer,
            size_limit=f"replication.max_message_size {self._server.config.max_message_size}",
            stop=lambda: self._closing,
        )

    def _on_text(self, text: str) -> None:
        session = self.session
        if text == self._next_text:
            session.handle(self._next_msg)
            return
        # Until login, a peer may not make us parse more than this per frame.
        pre_login_max = self._server._limits.pre_init_max_msg_size
        if not session.logged_in and len(text) > pre_login_max:
            session.refuse(
                None,
                RejectReason.MESSAGE_TOO_LARGE,
                f"frame of {len(text)} bytes before login (max {pre_login_max})",
            )
            return
        try:
            msg = wire.decode(text)
        except wire.FrameError as e:
            session.refuse(None, RejectReason.BAD_FRAME, str(e))
            return
        if msg["mt"] == "ReplicateNext" and session.logged_in:
            self._next_text, self._next_msg = text, msg
        session.handle(msg)
