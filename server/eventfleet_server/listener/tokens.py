"""Token checks with an explicit policy per protocol."""

from __future__ import annotations

import hmac
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenPolicy:
    """Which tokens a protocol accepts.

    `tokens`: every currently valid token (more than one during a rotation). With none,
    the protocol is open. `allow_missing`: a client that presents no token is admitted
    even though tokens are configured (Eventer's hat-compatible behaviour; see
    docs/security.md). `refuse_unexpected`: a token presented while none is configured is
    refused — Syncer peers must be configured alike, a mismatch is a deployment error.
    """

    tokens: tuple[str, ...] = ()
    allow_missing: bool = False
    refuse_unexpected: bool = False

    @classmethod
    def open(cls) -> TokenPolicy:
        return cls()

    @classmethod
    def of(cls, token: str | None, **kwargs) -> TokenPolicy:
        return cls((token,) if token else (), **kwargs)

    @property
    def configured(self) -> bool:
        return bool(self.tokens)

    def check(self, presented: str | None) -> str | None:
        """None when `presented` is acceptable, else the reason (never echoing a token)."""
        if not self.tokens:
            if presented is not None and self.refuse_unexpected:
                return "a token was presented but none is configured here"
            return None
        if presented is None:
            return None if self.allow_missing else "a token is required"
        candidate = presented.encode()
        # Compare against every token (no early exit): timing says nothing about which.
        ok = False
        for token in self.tokens:
            ok |= hmac.compare_digest(candidate, token.encode())
        return None if ok else "invalid client token"
