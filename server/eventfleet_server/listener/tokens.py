"""Token checks with an explicit policy per protocol, and the replica's credentials."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenPolicy:
    """Which tokens a protocol accepts.

    `tokens`: every currently valid token (more than one during a rotation). With none,
    the protocol is open. `allow_missing`: a client that presents no token is admitted
    even though tokens are configured (Eventer's hat-compatible mode; see
    docs/security.md), optionally only from `missing_from` networks (empty: from any
    address). `refuse_unexpected`: a token presented while none is configured is
    refused — Syncer peers must be configured alike, a mismatch is a deployment error.
    """

    tokens: tuple[str, ...] = ()
    allow_missing: bool = False
    refuse_unexpected: bool = False
    missing_from: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(default=())

    @classmethod
    def open(cls) -> TokenPolicy:
        return cls()

    @classmethod
    def of(cls, token: str | None, **kwargs) -> TokenPolicy:
        return cls((token,) if token else (), **kwargs)

    @property
    def configured(self) -> bool:
        return bool(self.tokens)

    def check(self, presented: str | None, address: str | None = None) -> str | None:
        """None when `presented` is acceptable from `address`, else the reason (never
        echoing a token). `address` matters only for a missing token with `missing_from`."""
        if not self.tokens:
            if presented is not None and self.refuse_unexpected:
                return "a token was presented but none is configured here"
            return None
        if presented is None:
            if not self.allow_missing:
                return "a token is required"
            if self.missing_from and not address_in(address, self.missing_from):
                return "a token is required from this address"
            return None
        # surrogatepass: a lone surrogate (JSON "\ud800") must be a wrong token, not a
        # UnicodeEncodeError (found by fuzzing Jetstream's SessionCreate); no configured
        # token encodes to such bytes.
        candidate = presented.encode("utf-8", "surrogatepass")
        # Compare against every token (no early exit): timing says nothing about which.
        ok = False
        for token in self.tokens:
            ok |= hmac.compare_digest(candidate, token.encode())
        return None if ok else "invalid client token"


def parse_networks(
    values: Iterable[str],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """CIDRs or plain addresses as networks; `ValueError` names the bad entry."""
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value, strict=False))
        except ValueError as e:
            raise ValueError(f"{value!r} is not an IP address or CIDR network") from e
    return tuple(out)


def address_in(address: str | None, networks) -> bool:
    """Whether `address` (an IP, maybe IPv4-mapped IPv6) lies in one of `networks`."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == net.version and ip in net for net in networks)


def parse_tokens(text: str) -> tuple[str, ...]:
    """Tokens of a token file: one per line, blank lines and ``#`` comments ignored.

    The first token is the one this replica presents (to its peers); every listed token
    is accepted. A rotation adds the new token as a second line, then moves it first,
    then drops the old one (docs/security.md).
    """
    tokens = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and line not in tokens:
            tokens.append(line)
    return tuple(tokens)


class Credentials:
    """The replica's current tokens, shared by its protocols and HTTP.

    `client`: tokens Eventer (and other client protocols) accept. `peer`: tokens the
    Syncer accepts from peers, the first of which it presents to them, and the admin
    credential of HTTP's state-changing routes. Without a separate peer token the
    client tokens serve both (one shared secret, as before). Replaced as a whole by
    `update` on reload, so a check never sees half of a rotation.
    """

    def __init__(self, client: Iterable[str] = (), peer: Iterable[str] | None = None):
        self.client: tuple[str, ...] = ()
        self.peer: tuple[str, ...] = ()
        self.update(client, peer)

    @classmethod
    def of(cls, token: str | None) -> Credentials:
        """One shared token (or none): the pre-1.x behaviour."""
        return cls((token,) if token else ())

    def update(self, client: Iterable[str], peer: Iterable[str] | None = None) -> bool:
        """Replace the tokens; True when anything changed."""
        client = tuple(client)
        peer = tuple(peer) if peer else client
        changed = (client, peer) != (self.client, self.peer)
        self.client, self.peer = client, peer
        return changed

    @property
    def client_token(self) -> str | None:
        """The client token a local client would present (the first)."""
        return self.client[0] if self.client else None

    @property
    def peer_token(self) -> str | None:
        """The token this replica presents to its peers (the first peer token)."""
        return self.peer[0] if self.peer else None

    def check_admin(self, presented: str | None) -> bool:
        """Whether `presented` is a valid peer/admin token (True when none is configured)."""
        return TokenPolicy(self.peer).check(presented) is None

    def fingerprints(self) -> dict[str, list[str]]:
        """Fingerprints of the current tokens, in file order (the full ``/status``).

        Lets the operator see which tokens each replica has loaded during a rotation
        without the tokens themselves leaving the replica: see `token_fingerprint`.
        """
        return {
            "client": [token_fingerprint(t) for t in self.client],
            "peer": [token_fingerprint(t) for t in self.peer],
        }


def token_fingerprint(token: str) -> str:
    """The first 16 hex digits of SHA-256 of the token (UTF-8): the operator computes the
    same from the Secrets (docs/observability.md, ``credentials``)."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]
