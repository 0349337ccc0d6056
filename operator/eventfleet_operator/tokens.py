"""The fleet's token Secrets as the replicas read them, and whether every replica has
loaded them (a rotation rolls out through the replicas' reload, not a restart).

A token Secret's key holds one token per line (blank lines and ``#`` comments ignored,
duplicates once): every token is accepted, the first is presented. Each replica reports
the fingerprints of the tokens it has loaded in its full ``/status`` (``credentials``,
docs/observability.md); comparing them with the Secrets' tells when a rotation step has
reached every replica.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from eventfleet_operator.constants import ConditionStatus, Reason


def parse(text: str) -> tuple[str, ...]:
    """Tokens of a token file, in order (the replica's ``parse_tokens``)."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and line not in out:
            out.append(line)
    return tuple(out)


def decode(secret: Mapping[str, Any] | None, key: str) -> tuple[str, ...] | None:
    """The tokens in ``secret[data][key]``; None when missing or not base64 UTF-8."""
    data = ((secret or {}).get("data") or {}).get(key)
    if not data:
        return None
    try:
        return parse(base64.b64decode(data).decode())
    except ValueError:
        return None


def fingerprint(token: str) -> str:
    """First 16 hex digits of SHA-256 of the token: what a replica reports."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Expected:
    """Fingerprints of the tokens the Secrets hold now, client and peer, in order."""

    client: tuple[str, ...]
    peer: tuple[str, ...]

    @classmethod
    def of(cls, client: Sequence[str], peer: Sequence[str]) -> Expected:
        return cls(tuple(map(fingerprint, client)), tuple(map(fingerprint, peer)))

    def digest(self) -> str:
        """One short value for the pair (``status.tokensDigest``): changes with any token
        or their order."""
        text = ",".join(self.client) + ";" + ",".join(self.peer)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def loaded_by(self, reported: Mapping[str, Any] | None) -> bool | None:
        """Has a replica reporting ``reported`` loaded exactly these tokens? None: it does
        not say (a replica image from before ``credentials``)."""
        if not isinstance(reported, Mapping):
            return None
        return (
            tuple(reported.get("client") or ()) == self.client
            and tuple(reported.get("peer") or ()) == self.peer
        )


Verdict = tuple[ConditionStatus, Reason, str]


def verdict(
    expected: Expected | None,
    reports: Sequence[tuple[str, Mapping[str, Any] | None, bool]],
    secrets: str,
) -> Verdict:
    """The ``TokensLoaded`` condition.

    ``reports``: (pod, its reported ``credentials``, reachable) per running replica;
    ``secrets``: the Secrets' names for the message.
    """
    if expected is None:
        return (ConditionStatus.UNKNOWN, Reason.TOKENS_UNKNOWN, f"cannot read {secrets}")
    if not reports:
        return (ConditionStatus.UNKNOWN, Reason.TOKENS_UNKNOWN, "no replica runs")
    stale, unknown = [], []
    for pod, reported, reachable in reports:
        loaded = expected.loaded_by(reported) if reachable else None
        if loaded is None:
            unknown.append(pod)
        elif not loaded:
            stale.append(pod)
    if stale:
        return (
            ConditionStatus.FALSE,
            Reason.TOKENS_RELOADING,
            f"{len(stale)} of {len(reports)} replicas still run other tokens than {secrets} "
            f"({', '.join(stale)}): kubelet refreshes the Secret volumes (about a minute) and "
            "each replica re-reads them every token_reload_interval; nothing restarts",
        )
    if unknown:
        return (
            ConditionStatus.UNKNOWN,
            Reason.TOKENS_UNKNOWN,
            f"{', '.join(unknown)}: unreachable or not reporting its tokens (an older image)",
        )
    return (
        ConditionStatus.TRUE,
        Reason.ALL_TOKENS_LOADED,
        f"all {len(reports)} replicas run the tokens of {secrets}",
    )


# The operator's own peer-token rotation (annotation eventfleet.io/rotate-peer-token):
# the runbook's three steps on the generated Secret, each taken once every replica has
# loaded the previous one. Steps name what was just written.
PENDING, ADDING, SWAPPING, REMOVING = "Pending", "Adding", "Swapping", "Removing"
DONE, REFUSED = "Done", "Refused"


@dataclasses.dataclass(frozen=True)
class Step:
    """One pass of a rotation: the step now, the Secret's new tokens (None: no write)."""

    step: str
    write: tuple[str, ...] | None = None
    message: str = ""


def rotation_step(step: str, live: Sequence[str], loaded: bool, new_token: str) -> Step:
    """The next step of a peer-token rotation.

    ``step``: the step recorded so far ("" for a new request); ``live``: the Secret's
    tokens now; ``loaded``: every replica runs exactly ``live`` (TokensLoaded);
    ``new_token``: a fresh token, used only when the rotation starts. At every step each
    replica accepts what every other one presents, so Syncer links and the operator's
    calls keep working.
    """
    live = tuple(live)
    if step in (DONE, REFUSED):
        return Step(step)
    if not loaded:
        return Step(step or PENDING, None, "waiting for every replica to load the current tokens")
    if step in ("", PENDING):
        if not live:
            return Step(REFUSED, None, "the peer token Secret holds no token")
        # Keep what every replica presents now (the first token), add the new one second.
        return Step(ADDING, (live[0], new_token), "added the new peer token as the second line")
    expected = {ADDING: 2, SWAPPING: 2, REMOVING: 1}
    if len(live) != expected.get(step, -1):
        return Step(
            REFUSED,
            None,
            f"the peer token Secret changed during the rotation (step {step}, "
            f"{len(live)} token(s)): stopped; finish by hand (docs/runbook.md)",
        )
    if step == ADDING:
        return Step(SWAPPING, (live[1], live[0]), "the new peer token is now presented")
    if step == SWAPPING:
        return Step(REMOVING, (live[0],), "removed the old peer token")
    return Step(DONE, None, "every replica runs the new peer token alone")
