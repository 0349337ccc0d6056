"""The replicator role: replicate an external publisher's table into this replica.

One `Upstream` per ``replication.upstreams`` entry: connect (aiohttp client), log in
with the digest, ReplicateStart with the stored guid/usn, take the initial pass into
local rows, then keep both sides in step: the publisher's live changes become local
events, and local changes of the table (any protocol, any peer) go back upstream.

State kept in the store's meta table under ``replication_upstream/<name>``:
``guid`` and ``usn`` of the publisher (written only after the rows up to that usn are
committed, so a restart never skips a row) and ``local_seq``, the local sequence number
up to which local changes were handed upstream. Conflicts: while connected, the last
writer wins on each side; after a reconnect, rows the publisher changed meanwhile win,
and local changes to other rows since ``local_seq`` are sent upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

import aiohttp

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.secretfile import read_secret_file
from eventfleet_server.listener import Rejections
from eventfleet_server.replication import wire
from eventfleet_server.replication.config import UpstreamConfig
from eventfleet_server.replication.login import digest
from eventfleet_server.replication.outbox import Outbox
from eventfleet_server.replication.session import WriteError
from eventfleet_server.replication.table import Change, OwnWrites, row_key

log = logging.getLogger(__name__)

PERSIST_INTERVAL = 1.0
OUTBOX_LIMIT = 100_000
PASS_BATCH = 500  # rows registered per engine session during a pass
_MISSING = object()


class UpstreamError(Exception):
    """The publisher refused or broke the protocol; the text says how."""


class Upstream:
    def __init__(
        self,
        config: UpstreamConfig,
        backend: Any,
        token: str | None,
        tasks: Tasks,
        rejections: Rejections,
    ):
        self.config = config
        self._backend = backend
        self._token = token
        self._tasks = tasks.child(f"upstream-{config.name}")
        self._rejections = rejections
        self._state_key = f"replication_upstream/{config.name}"
        self._table = backend.tables[config.local_table]
        self.guid = ""
        self.usn = 0
        self.local_seq = 0
        self._saved: tuple[str, int, int] | None = None
        self._own = OwnWrites()
        # Rows received but not yet handed to the engine (batched during a pass).
        self._batch: dict[str, dict[str, Any] | None] = {}
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._outbox: Outbox | None = None
        self._live = False
        self.state = "starting"
        self.last_error: str | None = None
        self.passes = {"full": 0, "incremental": 0}
        self.rows_received = 0
        self.changes_sent = 0
        self._unlisten: Any = None
        self._password = ""
        self._urls = (config.url, *config.failover_urls)
        self._url_index = 0

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "table": self.config.table,
            "state": self.state,
            "guid": self.guid,
            "usn": self.usn,
            "local_seq": self.local_seq,
            "passes": dict(self.passes),
            "rows_received": self.rows_received,
            "changes_sent": self.changes_sent,
            "last_error": self.last_error,
        }

    @property
    def url(self) -> str:
        return self._urls[self._url_index]

    async def start(self) -> None:
        cfg = self.config
        if cfg.password_file:
            self._password = read_secret_file(
                cfg.password_file, f"replication.upstreams[{cfg.name}].password_file"
            )
        elif self._token:
            self._password = self._token
        else:
            raise ValueError(
                f"replication.upstreams[{cfg.name}]: no password_file and no fleet token"
            )
        state = await self._backend.load_state(self._state_key) or {}
        self.guid = str(state.get("guid", ""))
        self.usn = int(state.get("usn", 0))
        self.local_seq = int(state.get("local_seq", 0))
        self._saved = (self.guid, self.usn, self.local_seq)
        self._unlisten = self._backend.add_change_listener(self._on_local_changes)
        self._tasks.spawn("connect", self._run())
        self._tasks.spawn("persist", self._persist_loop())

    async def stop(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
        ws = self._ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()
        await self._tasks.close(5.0)
        with contextlib.suppress(Exception):
            await self._persist()

    # -- connection loop -------------------------------------------------------------

    async def _run(self) -> None:
        cfg = self.config
        delay = cfg.reconnect_min_delay
        while True:
            started = asyncio.get_running_loop().time()
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure: log it, back off, try again
                self.last_error = f"{type(e).__name__}: {e}"
            finally:
                self._live = False
                self._ws = None
                self._batch = {}  # not stored; the next pass sends them again (usn unchanged)
            if asyncio.get_running_loop().time() - started > 30:
                delay = cfg.reconnect_min_delay  # it ran for a while: start the backoff over
            # Next URL: another replica of the same fleet serves the same table.
            self._url_index = (self._url_index + 1) % len(self._urls)
            self.state = "reconnecting"
            log.warning(
                "replication upstream %s: %s; reconnecting to %s in %.1f s",
                cfg.name,
                self.last_error,
                self.url,
                delay,
            )
            await asyncio.sleep(delay * (0.8 + 0.4 * random.random()))
            delay = min(delay * 2, cfg.reconnect_max_delay)

    async def _session(self) -> None:
        self.state = "connecting"
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(self.url, heartbeat=30.0, max_msg_size=64 * 1024 * 1024) as ws,
        ):
            self._ws = ws
            self._outbox = Outbox(ws, OUTBOX_LIMIT)
            writer = self._tasks.spawn("send", self._outbox.drain(), critical=False)
            try:
                await self._login(ws)
                await self._replicate(ws)
            finally:
                self._outbox.close()
                self._outbox = None
                writer.cancel()

    async def _receive(self, ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
        # No receive timeout: the websocket heartbeat (30 s) detects a dead publisher.
        frame = await ws.receive()
        if frame.type == aiohttp.WSMsgType.TEXT:
            return wire.decode(frame.data)
        if frame.type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSING,
            aiohttp.WSMsgType.CLOSED,
        ):
            raise ConnectionError(f"publisher closed the connection ({ws.close_code})")
        if frame.type == aiohttp.WSMsgType.ERROR:
            raise ConnectionError(f"websocket error: {frame.data}")
        raise UpstreamError(f"unexpected {frame.type.name} frame from the publisher")

    async def _expect(self, ws: aiohttp.ClientWebSocketResponse, mt: str) -> dict[str, Any]:
        msg = await self._receive(ws)
        if msg["mt"] != mt:
            raise UpstreamError(f"expected {mt}, got {msg['mt']}: {msg.get('error', '')}")
        return msg

    async def _login(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        cfg = self.config
        self.state = "login"
        await ws.send_str(wire.encode({"mt": "AppChallenge", "src": "login"}))
        challenge = (await self._expect(ws, "AppChallengeResult")).get("challenge")
        if not isinstance(challenge, str):
            raise UpstreamError(f"AppChallengeResult without a challenge string: {challenge!r}")
        fields: dict[str, Any] = {
            "app": cfg.app,
            "domain": cfg.domain,
            "sip": cfg.sip,
            "guid": cfg.guid,
            "dn": cfg.dn,
        }
        if cfg.info is not None:
            fields["info"] = cfg.info
        login = {
            "mt": "AppLogin",
            "src": "login",
            **fields,
            "digest": digest(fields, challenge, self._password),
        }
        await ws.send_str(wire.encode(login))
        result = await self._expect(ws, "AppLoginResult")
        if result.get("error") or result.get("ok") is False:
            raise UpstreamError(f"login as {cfg.sip!r} refused: {result.get('error')}")

    async def _replicate(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        cfg = self.config
        api = cfg.table
        start = {
            "api": api,
            "mt": "ReplicateStart",
            "src": "start",
            "guid": self.guid,
            "usn": self.usn,
            "add": cfg.add,
            "del": cfg.delete,
            "columns": wire.columns_object(cfg.columns),
        }
        await ws.send_str(wire.encode(start))
        result = await self._expect(ws, "ReplicateStartResult")
        if result.get("error"):
            raise UpstreamError(f"ReplicateStart refused: {result['error']}")
        guid = result.get("guid")
        if not isinstance(guid, str):
            raise UpstreamError(f"ReplicateStartResult guid {guid!r} is not a string")
        full = bool(result.get("full", guid != self.guid or not self.usn))
        rows = result.get("rows")
        window = min(cfg.window, rows + 1) if isinstance(rows, int) and rows >= 0 else 1
        self.state = "full pass" if full else "incremental pass"
        self.passes["full" if full else "incremental"] += 1
        seen: set[str] = set()
        outstanding = 0
        nxt = {"api": api, "mt": "ReplicateNext", "src": "next"}
        outbox = self._outbox
        for _ in range(window):
            outbox.put(nxt)  # through the outbox: requests leave in batches
            outstanding += 1
        ended = False
        end_usn = 0
        sent_nexts = window
        budget = rows + 1 if isinstance(rows, int) and rows >= 0 else None
        while not ended:
            msg = await self._receive(ws)
            mt = msg["mt"]
            if mt == "ReplicateNextResult":
                outstanding -= 1
                if msg.get("error"):
                    raise UpstreamError(f"ReplicateNext refused: {msg['error']}")
                columns = msg.get("columns")
                if columns is None:
                    ended = True
                    end_usn = _usn(msg.get("usn"), self.usn)
                    break
                key = self._apply_upstream("ReplicateAdd", columns)
                if key is not None:
                    seen.add(key)
                self.rows_received += 1
                if budget is None or sent_nexts < budget:
                    outbox.put(nxt)
                    sent_nexts += 1
                    outstanding += 1
            elif mt in ("ReplicateAdd", "ReplicateUpdate", "ReplicateDel"):
                key = self._apply_upstream(mt, msg.get("columns"))
                if key is not None:
                    seen.add(key)
            else:
                self._upstream_reply(msg)
        # Pass done: the table now matches the publisher's at end_usn.
        self._flush()
        if full:
            for key, row in list(self._table.rows.items()):
                if row.columns is not None and key not in seen and not self._pending_local(key):
                    self._write(key, None)
            self._flush()
        self.guid = guid
        self.usn = end_usn
        self._send_pending_local(seen)
        self._live = True
        self.state = "live"
        self.last_error = None
        log.info(
            "replication upstream %s: %s pass done (%d rows), usn %d, live",
            cfg.name,
            "full" if full else "incremental",
            len(seen),
            self.usn,
        )
        while True:
            msg = await self._receive(ws)
            mt = msg["mt"]
            if mt in ("ReplicateAdd", "ReplicateUpdate", "ReplicateDel"):
                self._apply_upstream(mt, msg.get("columns"))
                self.usn = max(self.usn, _usn(msg.get("usn"), self.usn))
            elif mt == "ReplicateNextResult":
                continue  # answers to ReplicateNext requests still in flight at the end
            else:
                self._upstream_reply(msg)

    def _upstream_reply(self, msg: dict[str, Any]) -> None:
        if msg.get("error"):
            log.warning(
                "replication upstream %s refused %s: %s", self.config.name, msg["mt"], msg["error"]
            )
            columns = msg.get("columns")
            if isinstance(columns, dict):
                self._apply_upstream("ReplicateAdd", columns)  # take the publisher's row back

    # -- applying upstream rows locally ----------------------------------------------

    def _apply_upstream(self, mt: str, columns: Any) -> str | None:
        key_column = self.config.key
        if not isinstance(columns, dict) or key_column not in columns:
            raise UpstreamError(
                f"{mt} without a row object holding key column {key_column!r}: {columns!r}"
            )
        try:
            key = row_key(columns[key_column])
        except ValueError as e:
            raise UpstreamError(f"{mt}: {e}") from None
        current = self._batch.get(key, _MISSING)
        if current is _MISSING:
            current = self._backend.current(self._table.name, key)
        if mt == "ReplicateDel":
            new = None
        elif mt == "ReplicateUpdate" and current is not None:
            new = {**current, **columns}
        else:
            new = dict(columns)
        if new != current:
            self._write(key, new)
        return key

    def _write(self, key: str, columns: dict[str, Any] | None) -> None:
        self._batch[key] = columns
        if not self._live and len(self._batch) < PASS_BATCH:
            return  # in a pass: gather rows, one engine session per batch
        self._flush()

    def _flush(self) -> None:
        if not self._batch:
            return
        rows, self._batch = list(self._batch.items()), {}
        try:
            self._own.update(self._backend.write_many(self._table.name, rows))
        except WriteError as e:
            raise UpstreamError(f"local write of {len(rows)} rows failed: {e}") from e

    # -- local changes going upstream ------------------------------------------------

    def _pending_local(self, key: str) -> bool:
        row = self._table.rows.get(key)
        return row is not None and row.seq > self.local_seq

    def _send_pending_local(self, skip: set[str]) -> None:
        for seq, key in self._table.changed_since(self.local_seq):
            if key in skip:
                continue  # the publisher changed this row meanwhile: its version won
            row = self._table.rows[key]
            self._send_local(key, None, row.columns, seq)
        self.local_seq = max(self.local_seq, self._backend.last_seq())

    def _on_local_changes(self, changes: list[Change]) -> None:
        for change in changes:
            if change.table != self._table.name:
                continue
            if self._own.take(change.event.id):
                continue
            if self._live:
                self._send_local(change.key, change.before, change.after, change.seq)
        if self._live:
            self.local_seq = max(self.local_seq, changes[-1].seq)

    def _send_local(self, key: str, before: Any, after: Any, seq: int) -> None:
        outbox = self._outbox
        if outbox is None:
            return
        cfg = self.config
        if after is None:
            if not cfg.delete:
                return
            msg = {"mt": "ReplicateDel", "columns": {cfg.key: (before or {}).get(cfg.key, key)}}
        else:
            columns = (
                {c: after[c] for c in cfg.columns if c in after} if cfg.columns else dict(after)
            )
            columns[cfg.key] = after.get(cfg.key, key)
            if before is None:
                if not cfg.add:
                    return
                msg = {"mt": "ReplicateAdd", "columns": columns}
            else:
                # Only what changed (and the key): unchanged columns are not written.
                columns = {
                    c: v
                    for c, v in columns.items()
                    if c == cfg.key or c not in before or before[c] != v
                }
                if len(columns) == 1 and not (set(before) - set(after)):
                    return  # nothing this replication carries changed
                msg = {"mt": "ReplicateUpdate", "columns": columns}
        msg["api"] = cfg.table
        if outbox.put(msg):
            self.changes_sent += 1
        elif self._ws is not None:
            # The publisher does not keep up: drop the connection; the next pass resends
            # every local change above the stored local_seq.
            self.local_seq = min(self.local_seq, seq - 1)
            self._tasks.spawn("close-slow", self._ws.close(), critical=False)

    # -- persistence -----------------------------------------------------------------

    async def _persist(self) -> None:
        state = (self.guid, self.usn, self.local_seq)
        if state == self._saved:
            return
        await self._backend.save_state(
            self._state_key, {"guid": state[0], "usn": state[1], "local_seq": state[2]}
        )
        self._saved = state

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_INTERVAL)
            try:
                await self._persist()
            except Exception as e:
                log.error(
                    "replication upstream %s: saving guid/usn failed: %s", self.config.name, e
                )


def _usn(value: Any, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default
