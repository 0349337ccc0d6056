"""AppWebsocket login: challenges, the SHA-256 digest, credentials and a failed-login limit.

Engine-free. The digest is the lowercase hex SHA-256 of
``app:domain:sip:guid:dn[:info]:challenge:password`` (``info`` only when the AppLogin
carries one; an object is serialised as compact JSON).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import pathlib
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from eventfleet_server.common.secretfile import read_secret_file

LOGIN_FIELDS = ("app", "domain", "sip", "guid", "dn")

log = logging.getLogger(__name__)


class LoginError(Exception):
    """Login refused; the text is safe to send to the peer (it never holds a secret)."""


def info_text(info: Any) -> str | None:
    if info is None:
        return None
    if isinstance(info, str):
        return info
    return json.dumps(info, separators=(",", ":"), ensure_ascii=False)


def digest(fields: Mapping[str, Any], challenge: str, password: str) -> str:
    """The digest a client computes for `fields` (app, domain, sip, guid, dn, info?)."""
    parts = [str(fields.get(k, "")) for k in LOGIN_FIELDS]
    info = info_text(fields.get("info"))
    if info is not None:
        parts.append(info)
    parts += [challenge, password]
    return hashlib.sha256(":".join(parts).encode()).hexdigest()


class Credentials:
    """Passwords by sip, with an optional password for every sip.

    A `users_file` is read again when its modification time changes (a mounted Secret
    that kubelet updates): user list changes need no restart. A file that became
    unreadable or invalid keeps the last good list (logged).
    """

    def __init__(
        self,
        users: Mapping[str, str] | None = None,
        default: str | None = None,
        users_file: str | None = None,
    ):
        self._users = dict(users or {})
        self._default = default
        self._users_file = users_file
        self._mtime = _mtime(users_file) if users_file else None

    def __repr__(self) -> str:  # never show a password in a log or a traceback
        default = "set" if self._default else None
        return f"Credentials(users={sorted(self._users)}, default={default})"

    @property
    def empty(self) -> bool:
        return not self._users and not self._default

    def password(self, sip: str) -> str | None:
        if self._users_file:
            self._maybe_reload()
        return self._users.get(sip, self._default)

    def _maybe_reload(self) -> None:
        mtime = _mtime(self._users_file)
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            self._users = _read_users(self._users_file)
        except ValueError as e:
            log.error("%s; keeping the previous user list", e)
            return
        log.info(
            "replication: user list %s reloaded (%d users)", self._users_file, len(self._users)
        )

    @classmethod
    def load(
        cls, users_file: str | None, password_file: str | None, token: str | None
    ) -> Credentials:
        """Users from `users_file` (a JSON/YAML mapping sip -> password), one password
        for everyone from `password_file`, else the fleet token. Errors name the file."""
        users = _read_users(users_file) if users_file else {}
        default = None
        if password_file:
            default = read_secret_file(password_file, "replication.password_file")
        if default is None and not users_file:
            default = token
        return cls(users, default, users_file)


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _read_users(users_file: str) -> dict[str, str]:
    try:
        data = yaml.safe_load(pathlib.Path(users_file).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"replication.users_file {users_file}: cannot read: {e}") from e
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()
    ):
        raise ValueError(
            f"replication.users_file {users_file}: must map user names to non-empty "
            "password strings"
        )
    return data


class Challenges:
    """Single-use, expiring challenges of one connection (at most one outstanding)."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self._clock = clock
        self._current: tuple[str, float] | None = None

    def issue(self) -> str:
        challenge = secrets.token_hex(16)
        self._current = (challenge, self._clock() + self.ttl)
        return challenge

    def take(self) -> str:
        """The outstanding challenge, consumed; `LoginError` if none or expired."""
        current, self._current = self._current, None
        if current is None:
            raise LoginError(
                "no outstanding challenge: send AppChallenge first (each is single-use)"
            )
        challenge, expires = current
        if self._clock() > expires:
            raise LoginError(f"challenge expired (valid {self.ttl:g} s)")
        return challenge


def check_login(msg: Mapping[str, Any], challenge: str, credentials: Credentials) -> str:
    """Verify an AppLogin against `challenge`; returns the sip, or raises `LoginError`."""
    for key in LOGIN_FIELDS:
        if not isinstance(msg.get(key, ""), str):
            raise LoginError(f"AppLogin '{key}' must be a string")
    presented = msg.get("digest")
    if not isinstance(presented, str) or not presented:
        raise LoginError("AppLogin 'digest' must be a non-empty string")
    if not presented.isascii():
        # hmac.compare_digest raises TypeError on non-ASCII text (found by fuzzing); a
        # hex digest is ASCII, so this is simply a wrong one.
        raise LoginError("AppLogin 'digest' must be a hex string")
    sip = msg.get("sip", "")
    password = credentials.password(sip)
    if password is None:
        # Same text as a wrong password: do not tell which user names exist.
        hmac.compare_digest(presented, "0" * 64)
        raise LoginError("login failed: wrong digest")
    try:
        expected = digest(msg, challenge, password)
    except UnicodeEncodeError:
        # A lone surrogate ("\ud800" in the JSON) in a field or in info: no client can
        # have hashed that text as UTF-8 (found by fuzzing).
        raise LoginError("AppLogin fields are not valid Unicode (lone surrogate)") from None
    if not hmac.compare_digest(presented.lower(), expected):
        raise LoginError("login failed: wrong digest")
    return sip


class FailedLogins:
    """Failed logins per remote address in a sliding window."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic):
        self._limit = limit
        self._window = window
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, address: str) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        cutoff = self._clock() - self._window
        while times and times[0] < cutoff:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def blocked_for(self, address: str) -> float:
        """Seconds until `address` may try again (0 = it may now)."""
        times = self._recent(address)
        if times is None or len(times) < self._limit:
            return 0.0
        return max(times[0] + self._window - self._clock(), 0.0)

    def failed(self, address: str) -> None:
        self._failures.setdefault(address, deque()).append(self._clock())
        if len(self._failures) > 10_000:  # bound memory under a scan from many addresses
            for key in list(self._failures)[:1000]:  # the oldest addresses first
                del self._failures[key]
