"""Connection budgets and the limits every listener applies before a session exists.

Two budgets, so that connections nobody has authenticated yet can never take the places
of sessions that are:

* **pending** — accepted, not yet initialised (no init message, TLS handshake or login
  yet). Small: `max_pending` in total, `max_pending_per_address` from one remote
  address, each for at most `init_timeout`. A new connection is never refused for lack of
  a pending place: the oldest pending connection of the address that holds the most
  (its own address first once it holds its share) is dropped instead
  (``evicted_before_init``). A flood of idle connections thus only ever evicts itself,
  and a real client, whose init follows its connect within milliseconds, gets through.
* **sessions** — initialised (token checked). `max_connections` in total,
  `max_connections_per_address` from one address. A connection is refused at accept
  only when the session budget is already full (it could not become a session anyway),
  and again at `Ticket.promote` if the budget filled up meanwhile.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from eventfleet_server.listener.reasons import RejectReason
from eventfleet_server.listener.rejections import Rejections


@dataclass(frozen=True)
class AdmissionLimits:
    """Bounds applied to every connection of one protocol, whatever its transport.

    `pre_init_max_msg_size` is small on purpose: until a peer has initialised (and shown
    a token), it may not make the server buffer more than that.
    """

    max_connections: int = 1000
    max_connections_per_address: int = 100
    max_pending: int = 256
    max_pending_per_address: int = 64
    pre_init_max_msg_size: int = 64 * 1024
    max_msg_size: int = 16 * 1024 * 1024
    init_timeout: float = 10.0
    init_error_close_timeout: float = 2.0


Evict = Callable[[], None]

_PENDING, _SESSION, _DONE = "pending", "session", "done"


class Ticket:
    """One admitted connection: pending until `promote`, a session after; `release`
    (idempotent) frees whichever place it holds."""

    __slots__ = ("_admission", "_evict", "_state", "address")

    def __init__(self, admission: Admission, address: str, evict: Evict | None):
        self._admission = admission
        self.address = address
        self._evict = evict
        self._state = _PENDING

    @property
    def is_session(self) -> bool:
        return self._state == _SESSION

    def promote(self) -> bool:
        """Move this connection from the pending budget to the session budget (call it
        once the peer is authenticated, before answering it). False (refusal counted)
        when the session budget is full or the connection was evicted meanwhile."""
        return self._admission._promote(self)

    def demote(self) -> None:
        """Back to the pending budget, first in line for eviction (an init refused after
        `promote`: the connection only lingers to deliver its error)."""
        self._admission._demote(self)

    def release(self) -> None:
        self._admission._release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Admission:
    """The pending and session budgets of one listener (see the module docstring)."""

    def __init__(self, limits: AdmissionLimits, rejections: Rejections):
        self.limits = limits
        self._rejections = rejections
        self._sessions = 0
        self._sessions_per_address: dict[str, int] = {}
        # address -> its pending tickets, oldest first
        self._pending: dict[str, OrderedDict[Ticket, None]] = {}
        self._pending_total = 0

    @property
    def open_connections(self) -> int:
        """Connections holding a place, pending or session."""
        return self._sessions + self._pending_total

    @property
    def pending_connections(self) -> int:
        return self._pending_total

    @property
    def session_connections(self) -> int:
        return self._sessions

    def admit(self, address: str, evict: Evict | None = None) -> Ticket | None:
        """A pending ticket for a new connection from `address`, or None (refusal
        counted) when the session budget leaves it no chance.

        `evict` closes the connection; it is called (at most once) if the connection is
        still pending when a newer one needs its place. Without it, the new connection
        is refused instead when its place would have to be taken from it.
        """
        if self._session_full(address):
            return None
        limits = self.limits
        own = self._pending.get(address)
        own_n = len(own) if own else 0
        if own_n >= limits.max_pending_per_address:
            if not self._evict_oldest(
                address,
                f"{own_n} connections not initialised from this address "
                f"(max_pending_per_address {limits.max_pending_per_address})",
            ):
                return None
        elif self._pending_total >= limits.max_pending:
            # Take the place from the biggest holder; the newcomer's own address first
            # once it holds at least as many as anyone else.
            victim = max(self._pending, key=lambda a: len(self._pending[a]))
            if own_n >= len(self._pending[victim]):
                victim = address
            if not self._evict_oldest(
                victim,
                f"{self._pending_total} connections not initialised "
                f"(max_pending {limits.max_pending}); {len(self._pending[victim])} of them "
                f"from {victim}, the most",
            ):
                return None
        ticket = Ticket(self, address, evict)
        self._pending.setdefault(address, OrderedDict())[ticket] = None
        self._pending_total += 1
        return ticket

    def _session_full(self, address: str) -> bool:
        limits = self.limits
        if self._sessions >= limits.max_connections:
            self._rejections.reject(
                RejectReason.TOO_MANY_CONNECTIONS,
                f"{self._sessions} sessions open (max_connections {limits.max_connections})",
                address,
            )
            return True
        n = self._sessions_per_address.get(address, 0)
        if n >= limits.max_connections_per_address:
            self._rejections.reject(
                RejectReason.TOO_MANY_CONNECTIONS,
                f"{n} sessions open from this address "
                f"(max_connections_per_address {limits.max_connections_per_address})",
                address,
            )
            return True
        return False

    def _evict_oldest(self, address: str, detail: str) -> bool:
        tickets = self._pending.get(address)
        oldest = next(iter(tickets)) if tickets else None
        if oldest is None or oldest._evict is None:
            self._rejections.reject(RejectReason.TOO_MANY_CONNECTIONS, detail, address)
            return False
        self._drop_pending(oldest)
        oldest._state = _DONE
        self._rejections.reject(
            RejectReason.EVICTED_BEFORE_INIT, f"oldest dropped for a new one: {detail}", address
        )
        evict, oldest._evict = oldest._evict, None
        evict()
        return True

    def _drop_pending(self, ticket: Ticket) -> None:
        tickets = self._pending[ticket.address]
        del tickets[ticket]
        if not tickets:
            del self._pending[ticket.address]
        self._pending_total -= 1

    def _promote(self, ticket: Ticket) -> bool:
        if ticket._state != _PENDING:
            return ticket._state == _SESSION
        if self._session_full(ticket.address):
            return False
        self._drop_pending(ticket)
        ticket._state = _SESSION
        self._sessions += 1
        self._sessions_per_address[ticket.address] = (
            self._sessions_per_address.get(ticket.address, 0) + 1
        )
        return True

    def _demote(self, ticket: Ticket) -> None:
        if ticket._state != _SESSION:
            return
        self._release_session(ticket.address)
        ticket._state = _PENDING
        tickets = self._pending.setdefault(ticket.address, OrderedDict())
        tickets[ticket] = None
        tickets.move_to_end(ticket, last=False)
        self._pending_total += 1

    def _release(self, ticket: Ticket) -> None:
        if ticket._state == _PENDING:
            self._drop_pending(ticket)
        elif ticket._state == _SESSION:
            self._release_session(ticket.address)
        ticket._state = _DONE
        ticket._evict = None

    def _release_session(self, address: str) -> None:
        self._sessions -= 1
        n = self._sessions_per_address.get(address, 0) - 1
        if n > 0:
            self._sessions_per_address[address] = n
        else:
            self._sessions_per_address.pop(address, None)
