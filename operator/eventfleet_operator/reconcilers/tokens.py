"""Tokens: the client and peer token Secrets, their peer-token rotation, and
``TokensLoaded`` (have the replicas reloaded what the Secrets hold?).

Generated Secrets are made once and kept; referenced ones are only read and their
problems named. The rotation that ``eventfleet.io/rotate-peer-token`` asks for is one
step per pass, each only once the last status shows every replica runs the Secrets'
current tokens (the steps are the pure :mod:`eventfleet_operator.tokens`).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eventfleet_operator import builders, kube, model, naming, tokens
from eventfleet_operator import status as status_mod
from eventfleet_operator.constants import ConditionType, EventType, Reason
from eventfleet_operator.reconcilers.children import Context, Emit


async def token_secret(
    ctx: Context,
    spec: model.FleetSpec,
    log: logging.Logger,
    *,
    field: str = "spec.token",
    seed: Callable[[str], str] | None = None,
    versions: dict[str, str] | None = None,
) -> tuple[dict[str, Any] | None, str, str | None]:
    """The generated Secret to apply (or None), a problem with a referenced one, and the
    token that is presented (the file's first line). ``versions`` gets the
    resourceVersion the generated Secret was read at (see ``children.ensure``).

    ``field`` picks the credential: ``spec.token`` (clients) or ``spec.peerToken``
    (peers; the operator presents it on the replicas' admin routes). ``seed`` turns a
    freshly generated token into the Secret's first text (see :func:`peer_seed`).
    """
    peer = field == "spec.peerToken"
    ref = spec.peer_token_ref if peer else spec.token_ref
    live = await ctx.kube.get(kube.SECRETS, spec.namespace, ref.secret_name)
    if not ref.generated:
        if live is None:
            return None, f"{field}.secretRef.name: Secret {ref.secret_name!r} not found", None
        if ref.key not in (live.get("data") or {}):
            return (
                None,
                f"{field}.secretRef.key: Secret {ref.secret_name!r} has no key {ref.key!r}",
                None,
            )
        return None, "", first_token(live["data"][ref.key])
    text = ""
    if live is not None and versions is not None:
        versions[ref.secret_name] = str((live.get("metadata") or {}).get("resourceVersion"))
    if live is not None:
        try:
            text = base64.b64decode((live.get("data") or {}).get("token", "")).decode()
        except ValueError:
            text = ""
    if not text.strip():
        # Generated once and then kept: replacing it would lock out every client (peer).
        text = secrets.token_urlsafe(32)
        if seed is not None:
            text = seed(text)
        log.info("generated a new token for Secret %s", ref.secret_name)
    build = builders.peer_token_secret if peer else builders.token_secret
    first = next(iter(tokens.parse(text)), None)
    return build(spec, text), "", first


def peer_seed(sts_live: Mapping[str, Any] | None, client_token: str | None) -> Callable[[str], str]:
    """How a new generated peer Secret starts.

    A new fleet: the new token alone. A fleet whose running pods predate the peer
    Secret (an operator upgrade) accepts only the client token from peers and on
    ``/flush``: the Secret then starts as ``client token, new token``, so the replaced
    pods still present what the old ones accept (the first line) and accept the new
    token already. Finishing the split is the peer rotation of docs/runbook.md.
    """
    volumes_ = (((sts_live or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    upgrade = sts_live is not None and not any(
        v.get("name") == "peer-token" for v in volumes_.get("volumes") or []
    )
    if not upgrade or not client_token:
        return lambda new: new
    return lambda new: f"{client_token}\n{new}\n"


def first_token(data: str) -> str | None:
    """The token a replica presents to peers: the first token of the file."""
    try:
        text = base64.b64decode(data).decode()
    except ValueError:
        return None
    return next(iter(tokens.parse(text)), None)


async def rotate_peer_token(
    ctx: Context,
    spec: model.FleetSpec,
    request: str,
    previous: Mapping[str, Any],
    peer_secret: dict[str, Any] | None,
    token: str | None,
    log: logging.Logger,
    emit: Emit,
) -> tuple[dict[str, Any] | None, str | None, dict[str, Any] | None]:
    """One pass of the rotation ``eventfleet.io/rotate-peer-token`` asks for.

    Returns the peer Secret to apply, the token to present and ``status.peerTokenRotation``
    (None: unchanged). A step is taken only when the last status says every replica runs
    exactly the Secrets' current tokens (TokensLoaded True with the same digest), so
    each step has reached every replica before the next is written.
    """
    prev = previous.get("peerTokenRotation") or {}
    same = prev.get("requested") == request
    if same and prev.get("step") in (tokens.DONE, tokens.REFUSED):
        return peer_secret, token, None
    step = str(prev.get("step") or "") if same else ""
    if not spec.peer_token_ref.generated or peer_secret is None:
        result = tokens.Step(
            tokens.REFUSED,
            None,
            f"spec.peerToken.secretRef names your own Secret "
            f"{spec.peer_token_ref.secret_name!r}: rotate it by hand (docs/runbook.md, "
            "'Rotate the tokens')",
        )
    else:
        live = tokens.decode(peer_secret, "token") or ()
        client_ref = spec.token_ref
        client_secret = await ctx.kube.get(kube.SECRETS, spec.namespace, client_ref.secret_name)
        client = tokens.decode(
            client_secret, client_ref.key if not client_ref.generated else "token"
        )
        loaded = (
            bool(client)
            and status_mod.condition_true(previous, ConditionType.TOKENS_LOADED)
            and previous.get("tokensDigest") == tokens.Expected.of(client or (), live).digest()
        )
        result = tokens.rotation_step(step, live, loaded, secrets.token_urlsafe(32))
    if result.write is not None:
        peer_secret = builders.peer_token_secret(spec, "\n".join(result.write) + "\n")
        token = result.write[0]
        log.info("peer token rotation %r: %s", request, result.message)
        emit(EventType.NORMAL, Reason.PEER_TOKEN_ROTATION, f"{request}: {result.message}")
    if result.step == tokens.DONE and prev.get("step") != tokens.DONE:
        emit(EventType.NORMAL, Reason.PEER_TOKEN_ROTATED, f"{request}: {result.message}")
    if result.step == tokens.REFUSED and not (same and prev.get("step") == tokens.REFUSED):
        log.warning("peer token rotation %r refused: %s", request, result.message)
        emit(EventType.WARNING, Reason.PEER_TOKEN_ROTATION_REFUSED, f"{request}: {result.message}")
    moved = result.step != step or not same
    return (
        peer_secret,
        token,
        {
            "requested": request,
            "step": result.step,
            "message": (result.message or str(prev.get("message") or ""))[:500],
            "time": status_mod.now_iso() if moved else str(prev.get("time") or ""),
        },
    )


async def tokens_loaded(
    ctx: Context,
    spec: model.FleetSpec,
    peers: Sequence[status_mod.PeerReport],
    previous: Mapping[str, Any],
    emit: Emit | None = None,
) -> tuple[status_mod.Verdict, str]:
    """``TokensLoaded`` and the Secrets' digest: have the replicas reloaded the tokens?

    A token Secret changed (a rotation step) reaches the replicas without a restart:
    kubelet refreshes the Secret volumes and each replica re-reads them. The operator
    only watches that happen (and says so once with an Event).
    """
    client_ref, peer_ref = spec.token_ref, spec.peer_token_ref
    found = []
    for ref in (client_ref, peer_ref):
        live = await ctx.kube.get(kube.SECRETS, spec.namespace, ref.secret_name)
        if live is not None and ref.generated and not naming.owned_by(live, spec.uid):
            live = None
        found.append(tokens.decode(live, "token" if ref.generated else ref.key))
    names = f"Secrets {client_ref.secret_name} and {peer_ref.secret_name}"
    client, peer = found
    expected = tokens.Expected.of(client, peer) if client and peer else None
    reports = [
        (p.name, p.status.credentials if p.status else None, p.status is not None) for p in peers
    ]
    verdict = tokens.verdict(expected, reports, names)
    digest = expected.digest() if expected else ""
    before = str(previous.get("tokensDigest") or "")
    if emit is not None and digest and before and digest != before:
        emit(
            EventType.NORMAL,
            Reason.TOKENS_CHANGED,
            f"{names} changed: the replicas reload the tokens without a restart "
            "(condition TokensLoaded says when all have)",
        )
    return verdict, digest


async def read_peer_token(ctx: Context, spec: model.FleetSpec) -> str | None:
    """The fleet's peer token for the replicas' /status, read only (a paused fleet)."""
    ref = spec.peer_token_ref
    live = await ctx.kube.get(kube.SECRETS, spec.namespace, ref.secret_name)
    if live is None or (ref.generated and not naming.owned_by(live, spec.uid)):
        return None
    data = (live.get("data") or {}).get(ref.key if not ref.generated else "token")
    return first_token(data) if data else None


@dataclasses.dataclass(frozen=True)
class Secrets:
    """The token Secrets this pass applies and the peer token the operator presents."""

    client: dict[str, Any] | None  # the generated client-token Secret (None: referenced)
    peer: dict[str, Any] | None  # the generated peer-token Secret (None: referenced)
    token: str | None  # presented on every call to a replica (/status, /flush)
    error: str  # a referenced Secret or key that is missing
    rotation: Mapping[str, Any] | None  # status.peerTokenRotation (None: unchanged)
    read_versions: dict[str, str]  # resourceVersion each generated Secret was read at

    def manifests(self) -> list[dict[str, Any]]:
        return [m for m in (self.client, self.peer) if m]


async def reconcile(
    ctx: Context,
    spec: model.FleetSpec,
    meta: Mapping[str, Any],
    previous: Mapping[str, Any],
    sts_live: Mapping[str, Any] | None,
    log: logging.Logger,
    emit: Emit,
) -> Secrets:
    """The token Secrets to apply, and one step of a requested peer-token rotation."""
    read_versions: dict[str, str] = {}
    secret, token_error, client_token = await token_secret(ctx, spec, log, versions=read_versions)
    # Every call of the operator to a replica (/status, /flush) presents the peer token.
    peer_secret, peer_error, token = await token_secret(
        ctx,
        spec,
        log,
        field="spec.peerToken",
        seed=peer_seed(sts_live, client_token),
        versions=read_versions,
    )
    token_error = "; ".join(e for e in (token_error, peer_error) if e)
    rotation = None
    request = str((meta.get("annotations") or {}).get(naming.ROTATE_PEER_TOKEN_ANNOTATION) or "")
    if request and not peer_error:
        peer_secret, token, rotation = await rotate_peer_token(
            ctx, spec, request, previous, peer_secret, token, log, emit
        )
    return Secrets(secret, peer_secret, token, token_error, rotation, read_versions)
