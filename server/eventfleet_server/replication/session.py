"""The publisher side of one AppWebsocket connection, engine-free.

`PublisherSession.handle` takes decoded messages and answers through the `send`
callback; `on_changes` pushes row changes to the tables this session replicates. The
store is reached only through a `Backend` (the engine adapter implements it).

Per table (``api``) a session goes: ReplicateStart -> initial pass (one row per
ReplicateNext) -> end marker (a ReplicateNextResult without ``columns``) -> live.
Usn bookkeeping: the pass works on a snapshot ``S`` (the replica's last sequence number
at ReplicateStart). A row whose usn rose above ``S`` meanwhile is skipped in the pass and
sent right after the end marker as a live change, with every other change above ``S``,
in usn order; from then on changes are pushed as they are stored. The end marker says
``usn: S``, and each live change carries its own ``usn`` (an extension of the seed), so a
replicator that stores the highest usn it saw can always restart incrementally without
missing a change.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from eventfleet_server.listener import Rejections, RejectReason
from eventfleet_server.replication import wire
from eventfleet_server.replication.config import TableConfig
from eventfleet_server.replication.login import (
    Challenges,
    Credentials,
    FailedLogins,
    LoginError,
    check_login,
)
from eventfleet_server.replication.table import Change, OwnWrites, Table, Tables, row_key
from eventfleet_server.replication.wire import FrameError

log = logging.getLogger(__name__)

MAX_USN = (1 << 64) - 1


class WriteError(Exception):
    """A replicator's write was refused by the store; the text names the cause."""


class Backend(Protocol):
    """What a publisher session needs from the replica."""

    guid: str
    tables: Tables
    table_configs: dict[str, TableConfig]

    def last_seq(self) -> int: ...

    def current(self, table: str, key: str) -> dict[str, Any] | None:
        """The row as last written (including writes not yet committed), None if absent."""
        ...

    def write(self, table: str, key: str, columns: dict[str, Any] | None) -> Any:
        """Register the row's new state (None = tombstone); returns the event id.
        Raises `WriteError`."""
        ...


@dataclass
class _Replication:
    table: Table
    columns: dict[str, bool]  # requested & granted; {} = every column
    add: bool
    delete: bool
    snapshot: int
    full: bool
    pending: deque[str] | None  # keys still to send in the initial pass; None = live
    own: OwnWrites = field(default_factory=OwnWrites)  # events this session wrote


class PublisherSession:
    """One connection's login state and replications."""

    def __init__(
        self,
        backend: Backend,
        *,
        credentials: Credentials,
        failed_logins: FailedLogins,
        challenge_ttl: float,
        peer: str,
        send: Callable[[dict[str, Any] | str], None],
        rejections: Rejections,
        claim_session: Callable[[], bool] = lambda: True,
    ):
        # Takes a session place once the login is good (listener/admission.py); False
        # (refusal counted there) when the session budget is full.
        self._claim_session = claim_session
        self._backend = backend
        self._credentials = credentials
        self._failed = failed_logins
        self._challenges = Challenges(challenge_ttl)
        self._peer = peer
        self._send = send
        self._rejections = rejections
        self.user: str | None = None
        self._replications: dict[str, _Replication] = {}
        self.written = 0

    @property
    def logged_in(self) -> bool:
        return self.user is not None

    def describe(self) -> dict[str, Any]:
        return {
            "peer": self._peer,
            "user": self.user,
            "tables": {
                api: ("pass" if r.pending is not None else "live")
                for api, r in self._replications.items()
            },
        }

    # -- inbound -----------------------------------------------------------------------

    def refuse(self, msg: dict | None, reason: RejectReason, error: str) -> None:
        self._rejections.reject(reason, error, self._peer)
        self._send(wire.error_reply(msg, error))

    def handle(self, msg: dict[str, Any]) -> None:
        """One decoded message; every refusal is answered and counted, never raised."""
        mt = msg["mt"]
        try:
            if mt == "AppChallenge":
                self._send(
                    wire.reply(msg, "AppChallengeResult", challenge=self._challenges.issue())
                )
            elif mt == "AppLogin":
                self._login(msg)
            elif not self.logged_in:
                self.refuse(
                    msg,
                    RejectReason.NOT_INITIALIZED,
                    f"{mt}: log in first (AppChallenge, AppLogin)",
                )
            elif mt == "ReplicateStart":
                self._start(msg)
            elif mt == "ReplicateNext":
                self._next(msg)
            elif mt in ("ReplicateAdd", "ReplicateUpdate", "ReplicateDel"):
                self._write(msg)
            else:
                self.refuse(msg, RejectReason.UNEXPECTED_MESSAGE, f"unknown message type mt={mt!r}")
        except FrameError as e:
            self.refuse(msg, RejectReason.BAD_MESSAGE, f"{mt}: {e}")

    def _login(self, msg: dict[str, Any]) -> None:
        if self.logged_in:
            self.refuse(msg, RejectReason.UNEXPECTED_MESSAGE, "AppLogin: already logged in")
            return
        wait = self._failed.blocked_for(self._peer)
        if wait > 0:
            self._challenges = Challenges(self._challenges.ttl)  # burn any outstanding one
            error = f"too many failed logins from this address; retry in {wait:.0f} s"
            self._rejections.reject(
                RejectReason.LOGIN_RATE_LIMITED, f"AppLogin: {error}", self._peer
            )
            self._send(wire.reply(msg, "AppLoginResult", ok=False, error=error))
            return
        try:
            challenge = self._challenges.take()
            user = check_login(msg, challenge, self._credentials)
        except LoginError as e:
            self._failed.failed(self._peer)
            self._rejections.reject(
                RejectReason.LOGIN_FAILED, f"sip={msg.get('sip')!r}: {e}", self._peer
            )
            self._send(wire.reply(msg, "AppLoginResult", ok=False, error=str(e)))
            return
        if not self._claim_session():
            error = "too many replication sessions; retry later"
            self._send(wire.reply(msg, "AppLoginResult", ok=False, error=error))
            return
        self.user = user
        log.info("replication login from %s as %r", self._peer, user)
        self._send(wire.reply(msg, "AppLoginResult", ok=True))

    def _table(self, msg: dict[str, Any]) -> tuple[str, Table] | None:
        api = msg.get("api")
        if not isinstance(api, str) or api not in self._backend.tables:
            self.refuse(
                msg,
                RejectReason.BAD_MESSAGE,
                f"{msg['mt']}: unknown table api={api!r} (published: "
                f"{sorted(self._backend.tables.tables)})",
            )
            return None
        return api, self._backend.tables[api]

    def _start(self, msg: dict[str, Any]) -> None:
        found = self._table(msg)
        if found is None:
            return
        api, table = found
        conf = self._backend.table_configs[api]
        guid = msg.get("guid", "")
        usn = msg.get("usn", 0)
        if guid is None:
            guid = ""
        if not isinstance(guid, str):
            raise FrameError(f"'guid' must be a hex string, got {guid!r}")
        if isinstance(usn, bool) or not isinstance(usn, int) or not 0 <= usn <= MAX_USN:
            raise FrameError(f"'usn' must be an unsigned 64-bit integer, got {usn!r}")
        add, delete = msg.get("add", False), msg.get("del", False)
        for name, value in (("add", add), ("del", delete)):
            if not isinstance(value, bool):
                raise FrameError(f"'{name}' must be a boolean, got {value!r}")
        requested = wire.parse_columns(msg.get("columns", {}))
        if conf.columns is None:
            granted = dict(requested)
        else:
            unknown = sorted(set(requested) - set(conf.columns))
            if unknown:
                raise FrameError(
                    f"unknown columns {unknown} in table {api!r} (offered: {sorted(conf.columns)})"
                )
            granted = {c: u and conf.columns[c] for c, u in requested.items()}
            if not requested:
                granted = dict(conf.columns)
        if granted and table.key not in granted:
            granted[table.key] = False  # the key always travels: rows are found by it
        snapshot = self._backend.last_seq()
        full = not (guid.lower() == self._backend.guid and 0 < usn <= snapshot)
        keys = table.alive_by_seq() if full else table.changed_since(usn)
        self._replications[api] = _Replication(
            table=table,
            columns=granted,
            add=add and conf.add,
            delete=delete and conf.delete,
            snapshot=snapshot,
            full=full,
            pending=deque(k for _, k in keys),
        )
        log.info(
            "replication %s table %s: %s pass of %d rows from usn %d (snapshot %d)",
            self._peer,
            api,
            "full" if full else "incremental",
            len(keys),
            0 if full else usn,
            snapshot,
        )
        offered = conf.columns if not granted and conf.columns is not None else granted
        self._send(
            wire.reply(
                msg,
                "ReplicateStartResult",
                guid=self._backend.guid,
                usn=snapshot,
                columns=wire.columns_object(offered),
                full=full,
                rows=len(keys),
                add=add and conf.add,
                **{"del": delete and conf.delete},
            )
        )

    def _project(self, rep: _Replication, row: dict[str, Any]) -> dict[str, Any]:
        if not rep.columns:
            return row
        return {c: row[c] for c in rep.columns if c in row}

    def _next(self, msg: dict[str, Any]) -> None:
        api = msg.get("api")
        rep = self._replications.get(api) if isinstance(api, str) else None
        if rep is None:
            self.refuse(
                msg,
                RejectReason.UNEXPECTED_MESSAGE,
                f"ReplicateNext: no ReplicateStart for api={api!r}",
            )
            return
        if rep.pending is None:
            # Pipelining replicators may have asked for more rows than there were: the
            # pass is over, say so again (not an error).
            self._send(wire.reply(msg, "ReplicateNextResult", usn=rep.snapshot))
            return
        rows = rep.table.rows
        pending = rep.pending
        while pending:
            key = pending.popleft()
            row = rows[key]
            if row.seq > rep.snapshot:
                continue  # changed during the pass: sent after the end marker
            if row.columns is None:
                self._send(
                    {
                        "api": api,
                        "mt": "ReplicateDel",
                        "usn": row.seq,
                        "columns": {rep.table.key: _key_value(rep.table, key)},
                    }
                )
                continue
            if row.text is not None and not rep.columns:
                # Every column: the row's JSON, encoded once when it changed, joined in.
                self._send(wire.reply_with_row(msg, "ReplicateNextResult", row.seq, row.text))
            else:
                self._send(
                    wire.reply(
                        msg,
                        "ReplicateNextResult",
                        usn=row.seq,
                        columns=self._project(rep, row.columns),
                    )
                )
            return
        # End of the initial pass, then catch-up, then live: one synchronous step, so no
        # change stored meanwhile can fall between them.
        rep.pending = None
        self._send(wire.reply(msg, "ReplicateNextResult", usn=rep.snapshot))
        for seq, key in rep.table.changed_since(rep.snapshot):
            row = rows[key]
            if row.columns is None:
                if not rep.full:
                    self._push(
                        rep, api, "ReplicateDel", seq, {rep.table.key: _key_value(rep.table, key)}
                    )
            else:
                self._push(
                    rep,
                    api,
                    "ReplicateAdd" if rep.full else "ReplicateUpdate",
                    seq,
                    row.columns,
                    row.text,
                )

    def _push(
        self,
        rep: _Replication,
        api: str,
        mt: str,
        usn: int,
        columns: dict[str, Any],
        text: str | None = None,
    ) -> None:
        """Send a row change; `columns` is the whole row (projected here) and `text` its
        JSON when known (joined as is when the session takes every column)."""
        if text is not None and not rep.columns:
            self._send(wire.push_with_row(api, mt, usn, text))
            return
        self._send({"api": api, "mt": mt, "usn": usn, "columns": self._project(rep, columns)})

    # -- writes from the replicator ----------------------------------------------------

    def _write(self, msg: dict[str, Any]) -> None:
        mt = msg["mt"]
        api = msg.get("api")
        rep = self._replications.get(api) if isinstance(api, str) else None
        if rep is None:
            self.refuse(
                msg, RejectReason.UNEXPECTED_MESSAGE, f"{mt}: no ReplicateStart for api={api!r}"
            )
            return
        columns = msg.get("columns")
        if not isinstance(columns, dict):
            raise FrameError(f"'columns' must be an object (the row), got {type(columns).__name__}")
        table = rep.table
        if table.key not in columns:
            raise FrameError(f"row has no key column {table.key!r}")
        try:
            key = row_key(columns[table.key])
        except ValueError as e:
            raise FrameError(str(e)) from None
        current = self._backend.current(table.name, key)
        if mt == "ReplicateDel":
            if not rep.delete:
                self._refuse_write(
                    msg, rep, key, "deleting rows was not granted (ReplicateStart del)"
                )
                return
            if current is None:
                return  # already gone: deleting is idempotent
            new = None
        else:
            allowed = rep.columns
            if mt == "ReplicateAdd" and current is None:
                if not rep.add:
                    self._refuse_write(
                        msg, rep, key, "adding rows was not granted (ReplicateStart add)"
                    )
                    return
                bad = sorted(c for c in columns if allowed and c not in allowed)
                if bad:
                    self._refuse_write(
                        msg, rep, key, f"columns {bad} are not replicated in this session"
                    )
                    return
                new = dict(columns)
            else:
                if current is None:
                    self._refuse_write(
                        msg, rep, key, f"no row with {table.key}={columns[table.key]!r}"
                    )
                    return
                writable = {c for c, u in allowed.items() if u} if allowed else None
                # Repeating a column's current value is not writing it.
                bad = sorted(
                    c
                    for c in columns
                    if c != table.key
                    and writable is not None
                    and c not in writable
                    and (c not in current or current[c] != columns[c])
                )
                if bad:
                    self._refuse_write(
                        msg, rep, key, f"columns {bad} are not updatable (update: true)"
                    )
                    return
                new = {**current, **columns}
            if new == current:
                return  # nothing changes: no event (this also ends echo loops)
        try:
            event_id = self._backend.write(table.name, key, new)
        except WriteError as e:
            self._refuse_write(msg, rep, key, str(e), RejectReason.REGISTER_FAILED)
            return
        rep.own.add(event_id)
        self.written += 1

    def _refuse_write(
        self,
        msg: dict[str, Any],
        rep: _Replication,
        key: str,
        error: str,
        reason: RejectReason = RejectReason.WRITE_REFUSED,
    ) -> None:
        """A refused write: ``<mt>Result{error, columns: the row as it stands}`` so the
        replicator can put its copy back (``columns`` absent if the row does not exist)."""
        self._rejections.reject(
            reason, f"{msg['mt']} table {rep.table.name} row {key!r}: {error}", self._peer
        )
        current = rep.table.get(key)
        fields: dict[str, Any] = {"error": f"{msg['mt']} refused: {error}"}
        if current is not None:
            fields["columns"] = self._project(rep, current)
        self._send(wire.reply(msg, f"{msg['mt']}Result", **fields))

    # -- changes stored on this replica ------------------------------------------------

    def on_changes(self, changes: list[Change]) -> None:
        for change in changes:
            rep = self._replications.get(change.table)
            if rep is None or rep.pending is not None:
                continue  # not replicated here, or still in the pass (caught up at its end)
            if rep.own.take(change.event.id):
                continue  # the replicator's own write: it has it already
            api = change.table
            if change.after is None:
                if change.before is not None:
                    self._push(
                        rep,
                        api,
                        "ReplicateDel",
                        change.seq,
                        {rep.table.key: _key_value(rep.table, change.key, change.before)},
                    )
            elif change.before is None:
                self._push(rep, api, "ReplicateAdd", change.seq, change.after, change.after_text)
            else:
                self._push(rep, api, "ReplicateUpdate", change.seq, change.after, change.after_text)


def _key_value(table: Table, key: str, columns: dict[str, Any] | None = None) -> Any:
    """The key column's value as the rows carried it (an integer key stays an integer)."""
    if columns and table.key in columns:
        return columns[table.key]
    return key
