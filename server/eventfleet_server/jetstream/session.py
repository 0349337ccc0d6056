"""The Jetstream protocol: sessions, index counters, Ping/resend, scopes and syncs.

Engine-free and transport-free: the websocket side (server.py) feeds decoded messages in
and gives each session an `Outlet`; the event side is a `Backend` (adapter.py) that loads
scopes, stores a sync as one batch and reports changes made anywhere through
`JetstreamProtocol.broadcast`.
"""

from __future__ import annotations

import collections
import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

from eventfleet_server.jetstream import wire
from eventfleet_server.jetstream.scope import ModelWrite, Scope
from eventfleet_server.jetstream.wire import WireError, error_json

log = logging.getLogger(__name__)


class Outlet(Protocol):
    """One live connection of a session."""

    def send(self, messages: list[dict]) -> None: ...

    def close(self, code: int, reason: str) -> None: ...


class Backend(Protocol):
    async def open_scope(self, name: str) -> Scope:
        """The scope, loaded and kept current; one call per `close_scope` to come."""

    def close_scope(self, name: str) -> None: ...

    def scope(self, name: str) -> Scope | None:
        """The open scope `name`, if any."""

    async def store(self, scope: Scope, writes: list[ModelWrite], origin: str) -> None:
        """Store `writes` as ONE batch (all or nothing) and wait for the commit."""


class SyncFailed(Exception):
    """The backend could not store a sync (nothing was stored)."""


# (reason, detail) -> counted, rate-limited rejection; reasons are RejectReason values.
RejectFn = Callable[[str, str], None]


class Session:
    """Server-side state of one client session; survives reconnects until it expires."""

    def __init__(self, token: str, params: dict, resend_buffer: int):
        self.token = token
        self.params = params
        self.scopes: list[str | None] = []  # scope name by scopeIndex (None: failed fetch)
        self.next_index = 0  # the next outgoing index; 0 is the SessionCreateReply's
        self.client_index = 0  # the highest client index seen (duplicates at or below dropped)
        self.buffer: collections.deque[dict] = collections.deque(maxlen=resend_buffer)
        self.outlet: Outlet | None = None
        self.last_activity = time.monotonic()
        self.expired = False
        self.resends = 0

    def emit(self, message: dict) -> dict:
        """Give `message` the next index, keep it for resendMissing, send it if connected."""
        message["index"] = self.next_index
        self.next_index += 1
        if message["index"] != 0:
            self.buffer.append(message)
        if self.outlet is not None:
            self.outlet.send([message])
        return message

    def acknowledge(self, ack: int) -> None:
        while self.buffer and self.buffer[0]["index"] <= ack:
            self.buffer.popleft()

    def describe(self) -> str:
        return f"session {self.token[:8]}…"


class JetstreamProtocol:
    def __init__(
        self,
        backend: Backend,
        *,
        authenticate: Callable[[Any], str | None],
        reject: RejectFn,
        scope_pattern: str,
        max_fragments: int,
        resend_buffer: int,
        session_expiry: float,
    ):
        self._backend = backend
        self._authenticate = authenticate
        self._reject = reject
        self._scope_re = re.compile(scope_pattern)
        self._max_fragments = max_fragments
        self._resend_buffer = resend_buffer
        self._expiry = session_expiry
        self.sessions: dict[str, Session] = {}
        self._subscribers: dict[str, set[tuple[Session, int]]] = {}
        self.syncs_applied = 0
        self.syncs_rejected = 0

    # -- sessions --------------------------------------------------------------------------

    def create_session(self, message: dict, outlet: Outlet) -> Session | None:
        """Answer a SessionCreate; None (after a denial reply) when refused."""
        params = message.get("params")
        if params is None:
            params = {}
        version = message.get("version")
        problem = None
        if not isinstance(params, dict):
            problem = ("invalid-params", "SessionCreate params must be an object")
        elif not isinstance(version, str) or not version:
            problem = ("invalid-version", "SessionCreate requires a version string")
        else:
            why = self._authenticate(params.get("token"))
            if why:
                problem = ("auth-error", f"could not authenticate: {why}")
        if problem:
            self._reject("bad_token" if problem[0] == "auth-error" else "bad_message", problem[1])
            denied = wire.session_create_denied(*problem)
            denied["index"] = 0
            outlet.send([denied])
            return None
        token = secrets.token_hex(24)
        session = Session(token, params, self._resend_buffer)
        session.outlet = outlet
        self.sessions[token] = session
        session.emit(wire.session_create_reply(token))
        log.debug("%s created", session.describe())
        return session

    def resume(self, token: str, outlet: Outlet) -> Session | None:
        """Attach a reconnected client to its session; None if unknown or expired."""
        session = self.sessions.get(token)
        if session is None or session.expired:
            return None
        old = session.outlet
        session.outlet = outlet
        session.last_activity = time.monotonic()
        if old is not None and old is not outlet:
            # The client reconnected before we noticed the old connection die.
            old.close(wire.CLOSE_CLOSED, "session resumed on another connection")
        return session

    def detach(self, session: Session, outlet: Outlet) -> None:
        if session.outlet is outlet:
            session.outlet = None

    def expire_idle(self, now: float | None = None) -> int:
        """Expire sessions without a client message for `session_expiry`; returns how many."""
        now = time.monotonic() if now is None else now
        idle = [s for s in self.sessions.values() if now - s.last_activity > self._expiry]
        for session in idle:
            self.expire(session)
        return len(idle)

    def expire(self, session: Session) -> None:
        if session.expired:
            return
        session.expired = True
        self.sessions.pop(session.token, None)
        for index, name in enumerate(session.scopes):
            if name is None:
                continue
            subs = self._subscribers.get(name)
            if subs is not None:
                subs.discard((session, index))
                if not subs:
                    del self._subscribers[name]
            self._backend.close_scope(name)
        session.scopes = []
        if session.outlet is not None:
            session.outlet.close(wire.CLOSE_CLOSED, "session expired")
            session.outlet = None
        log.debug("%s expired", session.describe())

    def close_all(self) -> None:
        for session in list(self.sessions.values()):
            self.expire(session)

    # -- messages of an established session ------------------------------------------------

    async def handle(self, session: Session, message: dict) -> None:
        """One client message. Bad input is answered where the protocol has a reply, and
        counted; the session goes on."""
        session.last_activity = time.monotonic()
        kind = message["type"]
        try:
            index = wire.index_of(message)
        except WireError as e:
            self._reject("bad_message", e.message)
            return
        if index != 0:
            if index <= session.client_index:
                return  # a resend of something already handled (reference behaviour)
            session.client_index = index
        if kind == "Ping":
            self._on_ping(session, message)
        elif kind == "ScopeFetch":
            await self._on_fetch(session, index, message)
        elif kind == "ScopeSync":
            await self._on_sync(session, index, message)
        elif kind == "SessionCreate":
            self._reject("unexpected_message", "SessionCreate inside an established session")
        else:
            self._reject("unexpected_message", f"unknown message type {kind[:40]!r}")

    def _on_ping(self, session: Session, message: dict) -> None:
        ack = message.get("ack")
        if isinstance(ack, bool) or not isinstance(ack, int) or ack < 0:
            self._reject("bad_message", f"Ping ack {str(ack)[:20]!r} is not an integer >= 0")
            return
        session.acknowledge(ack)
        if message.get("resendMissing") is not True or session.outlet is None:
            return
        last_sent = session.next_index - 1
        session.outlet.send([wire.ping(session.client_index, True)])
        if ack >= last_sent:
            return
        if session.buffer and session.buffer[0]["index"] == ack + 1:
            session.resends += 1
            session.outlet.send(list(session.buffer))
            return
        # Part of what the client misses fell out of the bounded buffer. The client has
        # seen exactly up to `ack`: continue numbering from there and send every fetched
        # scope's full state (a client must accept a ScopeState at any time).
        log.info(
            "%s: resend of %d..%d not possible (buffer holds %s); sending fresh ScopeState",
            session.describe(),
            ack + 1,
            last_sent,
            f"{session.buffer[0]['index']}.." if session.buffer else "nothing",
        )
        session.buffer.clear()
        session.next_index = ack + 1
        for scope_index, name in enumerate(session.scopes):
            scope = self._scope(name)
            if scope is not None:
                fragments, encoded = scope.state()
                session.emit(wire.scope_state(scope_index, scope.root_uuid, fragments, encoded))

    def _scope(self, name: str | None) -> Scope | None:
        if name is None:
            return None
        return self._backend.scope(name)

    async def _on_fetch(self, session: Session, index: int, message: dict) -> None:
        name = message.get("name")
        if not isinstance(name, str) or not self._scope_re.fullmatch(name):
            self._reject(
                "bad_scope", f"ScopeFetch name {str(name)[:60]!r} is not a valid scope name"
            )
            session.emit(
                wire.scope_fetch_denied(
                    index, "invalid-scope-name", f"scope name {str(name)[:60]!r} is not allowed"
                )
            )
            return
        try:
            scope = await self._backend.open_scope(name)
        except Exception as e:
            log.warning("%s: fetch of scope %r failed: %s", session.describe(), name, e)
            session.emit(
                wire.scope_fetch_denied(index, "scope-unavailable", f"scope {name!r}: {e}")
            )
            return
        if session.expired:
            self._backend.close_scope(name)
            return
        scope_index = len(session.scopes)
        session.scopes.append(name)
        self._subscribers.setdefault(name, set()).add((session, scope_index))
        session.emit(wire.scope_fetch_reply(index, scope_index))
        fragments, encoded = scope.state()
        session.emit(wire.scope_state(scope_index, scope.root_uuid, fragments, encoded))

    async def _on_sync(self, session: Session, index: int, message: dict) -> None:
        fragments = message.get("fragments")
        if not isinstance(fragments, list):
            self._reject("bad_message", "ScopeSync fragments must be a list")
            session.emit(wire.scope_sync_reply(index, []))
            return
        scope_index = message.get("scopeIndex")
        atomic = message.get("atomic", False)
        name = None
        if isinstance(scope_index, int) and not isinstance(scope_index, bool):
            if 0 <= scope_index < len(session.scopes):
                name = session.scopes[scope_index]
        scope = self._scope(name)
        if scope is None:
            self._reject(
                "bad_scope", f"ScopeSync for scopeIndex {str(scope_index)[:20]} never fetched"
            )
            err = error_json("scope-index-not-found", f"scope at index {scope_index} was not found")
            session.emit(wire.scope_sync_reply(index, [err] * len(fragments)))
            return
        if len(fragments) > self._max_fragments:
            self._reject("bad_message", f"ScopeSync with {len(fragments)} fragments")
            err = error_json(
                "too-many-fragments",
                f"{len(fragments)} fragments in one sync (max_fragments {self._max_fragments})",
            )
            session.emit(wire.scope_sync_reply(index, [err] * len(fragments)))
            return
        if not isinstance(atomic, bool):
            atomic = bool(atomic)
        plan = scope.plan_sync(fragments, atomic)
        if plan.rejected:
            self.syncs_rejected += 1
            errors = [r["error"] for r in plan.replies if "error" in r]
            # The cause, not the "rejected because another fragment failed" replies.
            first = next((e for e in errors if e["type"] != "atomic-sync-rejected"), errors[0])
            self._reject(
                "bad_fragment",
                f"{plan.rejected} of {len(fragments)} fragments refused"
                f"{' (atomic: none applied)' if atomic else ''}: {first['message']}",
            )
        if plan.writes:
            try:
                await self._backend.store(scope, plan.writes, session.token)
            except Exception as e:
                log.warning(
                    "%s: sync of %d models not stored: %s", session.describe(), len(plan.writes), e
                )
                err = error_json("could-not-apply-sync-message", f"not stored: {e}")
                plan.replies = [r if "error" in r else err for r in plan.replies]
            else:
                self.syncs_applied += 1
        session.emit(wire.scope_sync_reply(index, plan.replies))

    # -- changes from anywhere -------------------------------------------------------------

    def broadcast(self, name: str, fragments: list[dict], origin: str | None) -> int:
        """Send `fragments` of scope `name` to every session that fetched it, except the
        session whose sync produced them (it has its ScopeSyncReply). Returns the count."""
        subs = self._subscribers.get(name)
        if not subs or not fragments:
            return 0
        sent = 0
        encoded = wire.dumps(fragments)  # once, whatever the number of sessions
        for session, scope_index in list(subs):
            if session.token == origin:
                continue
            session.emit(wire.scope_sync(scope_index, fragments, encoded))
            sent += 1
        return sent

    @property
    def scope_count(self) -> int:
        return len(self._subscribers)
