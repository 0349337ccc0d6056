"""The HTTP port's pre-request budget: connections that have not sent a request yet.

aiohttp waits without a time limit for the first request on a new connection, so idle
connections to the HTTP port (probes, ``/metrics``, websocket upgrades) were unbounded
in time and in number. Each accepted connection now takes a *pending* place of the
listener's `Admission` (listener/admission.py, the budgets every listener shares) until
its first complete request head arrives, for at most `REQUEST_TIMEOUT` seconds (with
TLS: handshake included). At `HTTP_LIMITS.max_pending` the oldest pending connection of
the address holding the most is dropped for the newcomer (``evicted_before_init``); a
timed-out one is closed (``init_timeout``). Both are counted in the HTTP port's
rejections (``eventfleet_rejected_total{protocol="http"}``).

After its first request a connection is a session. HTTP itself needs no token for the
probes, so the session budget here is wide: what bounds sessions is aiohttp's keep-alive
timeout between requests and, for the websockets, the Jetstream and Replication
listeners' own budgets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from eventfleet_server.listener import Admission, AdmissionLimits, Rejections, RejectReason, Ticket
from eventfleet_server.listener.tls_accept import peer_address, peer_host

log = logging.getLogger(__name__)

# The chatter protocols' default init_timeout: a real client sends its request right
# after connecting (or after the TLS handshake), within milliseconds.
REQUEST_TIMEOUT = 10.0
HTTP_LIMITS = AdmissionLimits(
    # Pre-request: small, as for every listener (a kubelet, a Prometheus and an operator
    # from one node address need a handful at a time).
    max_pending=128,
    max_pending_per_address=32,
    # Sessions (a request was sent): wide, see the module docstring.
    max_connections=4096,
    max_connections_per_address=4096,
    init_timeout=REQUEST_TIMEOUT,
)


class _Connection:
    __slots__ = ("ticket", "timer", "transport")

    def __init__(self, ticket: Ticket, timer: asyncio.TimerHandle, transport: Any):
        self.ticket, self.timer, self.transport = ticket, timer, transport


class RequestBudget:
    """Pending places for the HTTP port's connections until their first request."""

    def __init__(
        self,
        rejections: Rejections,
        limits: AdmissionLimits = HTTP_LIMITS,
    ):
        self.admission = Admission(limits, rejections)
        self._rejections = rejections
        self.timeout = limits.init_timeout
        # keyed by the transport the connection was accepted on, and (TLS) by the
        # transport aiohttp sees after the handshake, which requests carry
        self._by_transport: dict[Any, _Connection] = {}

    def accept(self, transport: Any) -> bool:
        """Take a pending place for a newly accepted connection; False (counted, and the
        connection aborted) when it gets none."""
        ticket = self.admission.admit(peer_host(transport), evict=lambda: self._evicted(transport))
        if ticket is None:
            transport.abort()
            return False
        timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, transport)
        self._by_transport[transport] = _Connection(ticket, timer, transport)
        return True

    def alias(self, accepted: Any, seen: Any) -> None:
        """`seen` (the TLS transport aiohttp gets) belongs to the connection `accepted`."""
        conn = self._by_transport.get(accepted)
        if conn is not None and seen is not accepted:
            self._by_transport[seen] = conn

    def first_request(self, transport: Any) -> bool:
        """A request head arrived on `transport`: the connection leaves the pending budget
        (once). False when the session budget is full (refusal counted)."""
        conn = self._by_transport.get(transport)
        if conn is None or conn.ticket.is_session:
            return True
        conn.timer.cancel()
        return conn.ticket.promote()

    def release(self, transport: Any) -> None:
        """The connection is gone: free its place (idempotent)."""
        conn = self._by_transport.get(transport)
        if conn is None:
            return
        conn.timer.cancel()
        conn.ticket.release()
        for key in [k for k, v in self._by_transport.items() if v is conn]:
            del self._by_transport[key]

    def _evicted(self, transport: Any) -> None:
        # Admission counted it (evicted_before_init) and freed the place already.
        self.release(transport)
        transport.abort()

    def _expire(self, transport: Any) -> None:
        conn = self._by_transport.get(transport)
        if conn is None or conn.ticket.is_session:
            return
        self._rejections.reject(
            RejectReason.INIT_TIMEOUT,
            f"no complete request within {self.timeout:g} s of connecting",
            peer_address(transport),
        )
        self.release(transport)
        transport.abort()

    def protocol(self, inner: asyncio.Protocol, accepted: Any = None) -> asyncio.Protocol:
        """Wrap aiohttp's protocol for one connection. Plain TCP: `accept` runs in its
        ``connection_made``. TLS: the caller accepted `accepted` (the raw transport)."""
        return _Budgeted(self, inner, accepted)

    def middleware(self) -> Callable[..., Any]:
        """The aiohttp middleware that marks each connection's first request (aiohttp
        runs middlewares once a request head is parsed)."""

        @web.middleware
        async def first_request(
            request: web.Request, handler: Callable[[web.Request], Any]
        ) -> web.StreamResponse:
            if not self.first_request(request.transport):
                return web.json_response(
                    {"error": "too many connections"}, status=503, headers={"Connection": "close"}
                )
            return await handler(request)

        return first_request


class _Budgeted(asyncio.Protocol):
    """aiohttp's RequestHandler for one connection, with its place in the budget.

    Delegates every protocol call; asyncio calls nothing else on a server protocol."""

    __slots__ = ("_accepted", "_budget", "_inner", "_refused")

    def __init__(self, budget: RequestBudget, inner: asyncio.Protocol, accepted: Any):
        self._budget, self._inner, self._accepted = budget, inner, accepted
        self._refused = False

    def connection_made(self, transport: Any) -> None:
        if self._accepted is None:
            self._accepted = transport
            if not self._budget.accept(transport):
                self._refused = True
                return
        else:
            self._budget.alias(self._accepted, transport)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._refused else self._inner.eof_received()

    def pause_writing(self) -> None:
        if not self._refused:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if not self._refused:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._budget.release(self._accepted)
        if not self._refused:
            self._inner.connection_lost(exc)
