"""The replica's HTTP endpoint (aiohttp): observability routes plus protocol mount points.

Built-in routes: ``/metrics``, ``/healthz``, ``/readyz``, ``/status``,
``GET /export`` (Arrow bulk export, `eventfleet_server.http.export`) and ``POST /backup``
(a copy of the store to S3, `eventfleet_server.http.backup`).
Protocols mount their own paths — websockets (``/replication``, ``/jetstream``) with
`HttpServer.mount`, JSON routes (the Syncer's ``POST /flush``) with
`HttpServer.mount_json` — and add scrape-time metrics with `HttpServer.add_metrics`, at
any time — before or after `start` — and never see each other: each owns its exact
paths, a second claim on a path is an error. The server starts first in the replica, so
probes answer during a long start-up (initial sync) with "alive, not ready" instead of
timing out.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from eventfleet_server.http.backup import PATH as BACKUP_PATH
from eventfleet_server.http.backup import BackupRoute
from eventfleet_server.http.budget import RequestBudget
from eventfleet_server.http.export import PATH as EXPORT_PATH
from eventfleet_server.http.export import ExportRoute
from eventfleet_server.http.health import LoopMonitor, readiness
from eventfleet_server.http.metrics import Metrics
from eventfleet_server.http.status import status_document
from eventfleet_server.listener import Rejections, RejectReason, tls_accept
from eventfleet_server.plugin import JsonHandler, JsonRequest, MetricsSource

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BUILTIN_PATHS = frozenset({"/metrics", "/healthz", "/readyz", "/status"})

# Routes a protocol mounts, answered 501 (not implemented by this replica) rather than 404
# when that protocol is disabled, so a caller such as the operator's scale-down tells "this
# replica runs no Syncer" from a wrong address; other methods get 405 as when mounted.
# (method, path) -> (the route's result key, the reason).
PROTOCOL_ROUTES = {("POST", "/flush"): ("flushed", "this replica runs no Syncer")}

# The HTTP port has no admission section: the same bound as the chatter protocols'
# default init_timeout (a client that opens a connection and never sends a ClientHello).
TLS_HANDSHAKE_TIMEOUT = 10.0


def presented_token(request: web.Request) -> str | None:
    """The bearer token of ``Authorization: Bearer <token>``, None without one."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


class HttpServer:
    """One aiohttp server per replica on ``host:port`` (port 0 picks a free one).

    `replica` is read duck-typed (``conf``, ``engine``, ``storage``, ``credentials``,
    ``protocol_states``) so this package does not depend on the replica's entry point.
    """

    def __init__(
        self,
        replica: Any,
        host: str,
        port: int,
        *,
        shutdown_timeout: float = 5.0,
        ssl_context: Any = None,
    ):
        self._replica = replica
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self.rejections = Rejections("http")
        # Connections that have not sent a request yet: bounded in number and time
        # (http/budget.py), counted in this port's rejections.
        self.budget = RequestBudget(self.rejections)
        self._host = host
        self._port = port
        self.metrics = Metrics(replica)
        self._monitor = LoopMonitor(self.metrics.loop_lag.observe)
        self._mounts: dict[str, dict[str, Handler]] = {}
        self._app = web.Application(middlewares=[self.budget.middleware()])
        self._app.router.add_get("/metrics", self._handle_metrics)
        self._app.router.add_get("/healthz", self._handle_healthz)
        self._app.router.add_get("/readyz", self._handle_readyz)
        self._app.router.add_get("/status", self._handle_status)
        # Everything else goes through the mount table, which (unlike aiohttp's router)
        # may change after start: protocols come and go with the replica's lifecycle.
        self._app.router.add_route("*", "/{path:.*}", self._dispatch)
        # Bulk export for analytics (http/export.py); a mount, so it stays one line here.
        self.export = ExportRoute(replica)
        self.unmount_export = self.mount(EXPORT_PATH, self.export)
        # Backups to S3 (http/backup.py): admin only, like POST /flush.
        self.backup = BackupRoute(replica, self._is_admin)
        self.mount(BACKUP_PATH, self.backup, method="POST")
        self.mount(BACKUP_PATH, self.backup.delete, method="DELETE")
        # No access log: kubelet probes and scrapes would drown the replica's own log.
        self._runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=shutdown_timeout)

    # -- mount points ----------------------------------------------------------------------

    def mount(self, path: str, handler: Handler, *, method: str = "GET") -> Callable[[], None]:
        """Serve `method` `path` with `handler`; returns a function that unmounts it.

        A websocket endpoint is a GET handler that prepares a `web.WebSocketResponse`.
        """
        method = method.upper()
        if not path.startswith("/"):
            raise ValueError(f"path {path!r} must start with '/'")
        if path in BUILTIN_PATHS:
            raise ValueError(f"path {path} is reserved for the HTTP server itself")
        methods = self._mounts.setdefault(path, {})
        if method in methods:
            raise ValueError(f"{method} {path} is already mounted")
        methods[method] = handler

        def unmount() -> None:
            if self._mounts.get(path, {}).get(method) is handler:
                del self._mounts[path][method]
                if not self._mounts[path]:
                    del self._mounts[path]

        return unmount

    def mount_json(
        self, path: str, handler: JsonHandler, *, method: str = "POST"
    ) -> Callable[[], None]:
        """Serve `method` `path` with a `JsonHandler` (for protocols that do not import
        aiohttp): it gets the query and whether the caller is admin, and returns (status,
        document). Returns a function that unmounts it."""

        async def serve(request: web.Request) -> web.Response:
            status, doc = await handler(
                JsonRequest(query=dict(request.query), admin=self._is_admin(request))
            )
            return _json(doc, status)

        return self.mount(path, serve, method=method)

    def add_metrics(self, source: MetricsSource) -> Callable[[], None]:
        """Add scrape-time metric families to ``/metrics``; returns a function that removes
        them."""
        return self.metrics.add_source(source)

    def add_routes(self, routes: Iterable[web.RouteDef]) -> Callable[[], None]:
        """Mount aiohttp route definitions (``web.get(...)``, ...); returns one unmount."""
        unmounts = [self.mount(r.path, r.handler, method=r.method) for r in routes]

        def unmount_all() -> None:
            for unmount in unmounts:
                unmount()

        return unmount_all

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        if request.path in BUILTIN_PATHS:
            # The built-in route exists, for another method (e.g. GET /flush).
            return _json({"error": f"{request.method} not allowed on {request.path}"}, 405)
        methods = self._mounts.get(request.path)
        if not methods:
            unserved = PROTOCOL_ROUTES.get((request.method, request.path))
            if unserved is not None:
                key, error = unserved
                return _json({key: False, "error": error}, 501)
            if any(path == request.path for _, path in PROTOCOL_ROUTES):
                return _json({"error": f"{request.method} not allowed on {request.path}"}, 405)
            return _json({"error": f"no such endpoint: {request.path}"}, 404)
        handler = methods.get(request.method)
        if handler is None and request.method == "HEAD":
            handler = methods.get("GET")
        if handler is None:
            return _json({"error": f"{request.method} not allowed on {request.path}"}, 405)
        return await handler(request)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        return self.address[1]

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        if self._server is None:
            raise RuntimeError("the HTTP server is not started")
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> None:
        await self._runner.setup()
        # Our own listening socket rather than aiohttp's TCPSite, so that every
        # connection passes the pre-request budget; the runner's cleanup still closes
        # the connections aiohttp serves.
        handler = self._runner.server
        assert handler is not None  # set up just above
        try:
            if self._ssl is not None:
                self._server = await tls_accept.serve(self._accept_tls, self._host, self._port)
            else:
                self._server = await asyncio.get_running_loop().create_server(
                    lambda: self.budget.protocol(handler()),
                    self._host,
                    self._port,
                    reuse_address=True,
                )
        except BaseException:
            await self._runner.cleanup()
            raise
        self._monitor.start()
        log.info("http listening on %s:%s%s", self._host, self.port, " (TLS)" if self._ssl else "")

    def _accept_tls(self, transport: Any) -> None:
        """A TLS connection: its pending place from accept (the handshake counts against
        the request timeout); failed handshakes are counted (tls_accept.py)."""
        if not self.budget.accept(transport):
            return
        address = tls_accept.peer_address(transport)
        protocol = self.budget.protocol(self._runner.server(), accepted=transport)
        done = tls_accept.accept_tls(transport, protocol, self._ssl, timeout=TLS_HANDSHAKE_TIMEOUT)

        def report(cause: str) -> None:
            # The app protocol never saw the connection: free its place here.
            self.budget.release(transport)
            self._tls_failed(address, cause)

        tls_accept.on_failure(done, transport, report, timeout=TLS_HANDSHAKE_TIMEOUT)

    def _tls_failed(self, peer: str, cause: str) -> None:
        self.rejections.reject(RejectReason.TLS_HANDSHAKE, f"TLS handshake: {cause}", peer)

    @property
    def rejected(self) -> dict[str, int]:
        """Refusals of the HTTP port by reason (failed TLS handshakes, connections
        without a request in time or evicted for newer ones: http/budget.py)."""
        return self.rejections.counts

    async def stop(self) -> None:
        self.metrics.close()
        await self._monitor.stop()
        if self._server is not None:
            self._server.close()  # no new connections; the runner drains the rest
        await self._runner.cleanup()
        if self._server is not None:
            await self._server.wait_closed()

    # -- built-in routes -------------------------------------------------------------------

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        body, content_type = await self.metrics.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _handle_healthz(self, request: web.Request) -> web.Response:
        # Being able to answer is the check: a wedged loop never gets here.
        return _json({"alive": True, "loop_lag_seconds": round(self._monitor.last_lag, 6)})

    async def _handle_readyz(self, request: web.Request) -> web.Response:
        ready, reason = readiness(self._replica)
        if ready:
            return _json({"ready": True})
        return _json({"ready": False, "reason": reason}, 503)

    def _is_admin(self, request: web.Request) -> bool:
        """Whether the request carries the peer/admin token (True when none is set)."""
        credentials = getattr(self._replica, "credentials", None)
        return credentials is None or credentials.check_admin(presented_token(request))

    async def _handle_status(self, request: web.Request) -> web.Response:
        # Anonymous callers get only what an Eventer client could learn anyway (see
        # docs/security.md); the operator presents the peer token and gets everything.
        return _json(await status_document(self._replica, full=self._is_admin(request)))


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(doc, separators=(",", ":")),
        status=status,
        content_type="application/json",
    )
