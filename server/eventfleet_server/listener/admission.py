"""Connection caps and the limits every listener applies before a session exists."""

from __future__ import annotations

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
    pre_init_max_msg_size: int = 64 * 1024
    max_msg_size: int = 16 * 1024 * 1024
    init_timeout: float = 10.0
    init_error_close_timeout: float = 2.0


class Ticket:
    """One admitted connection; `release` (idempotent) frees its place."""

    __slots__ = ("_admission", "_released", "address")

    def __init__(self, admission: Admission, address: str):
        self._admission = admission
        self.address = address
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release(self.address)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Admission:
    """Counts open connections, in total and per remote address, against the limits."""

    def __init__(self, limits: AdmissionLimits, rejections: Rejections):
        self.limits = limits
        self._rejections = rejections
        self._total = 0
        self._per_address: dict[str, int] = {}

    @property
    def open_connections(self) -> int:
        return self._total

    def admit(self, address: str) -> Ticket | None:
        """A ticket for a new connection from `address`, or None (refusal counted)."""
        limits = self.limits
        if self._total >= limits.max_connections:
            self._rejections.reject(
                RejectReason.TOO_MANY_CONNECTIONS,
                f"{self._total} connections open (max_connections {limits.max_connections})",
                address,
            )
            return None
        n = self._per_address.get(address, 0)
        if n >= limits.max_connections_per_address:
            self._rejections.reject(
                RejectReason.TOO_MANY_CONNECTIONS,
                f"{n} connections open from this address "
                f"(max_connections_per_address {limits.max_connections_per_address})",
                address,
            )
            return None
        self._total += 1
        self._per_address[address] = n + 1
        return Ticket(self, address)

    def _release(self, address: str) -> None:
        self._total -= 1
        n = self._per_address.get(address, 0) - 1
        if n > 0:
            self._per_address[address] = n
        else:
            self._per_address.pop(address, None)
