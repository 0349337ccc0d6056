"""``POST /backup``: a consistent copy of this replica's store, uploaded to S3.

Admin only (the peer token, like ``POST /flush``). Steps: refuse unless every
configured peer is ``synced`` (a copy of a replica that is behind would miss events
the fleet holds; ``?allow_unsynced=true`` overrides, for a fleet that lost its other
replicas); write the copy with ``VACUUM INTO`` beside the store in a worker thread
(the event loop, the writer and the reader go on); compute its digest; upload it with
the digest as object metadata; delete the local copy; answer the digest.

Answers: 200 ``{"backed_up": true, "bucket", "key", "sha256", "size", "events",
"events_sha256", "last_ids", "server_id", "started", "finished"}``; 400 a bad name;
401 no peer token; 409 a peer is not synced; 429 a backup is already running; 501 no
``backup.target`` configured or boto3 missing; 502 the object store failed; 500 the
copy failed. Errors are ``{"backed_up": false, "error": "..."}``.

``DELETE /backup?name=NAME`` (admin) deletes ``<prefix>NAME.sqlite`` from the target:
how the operator prunes old backups without ever holding the S3 credentials itself.
200 ``{"deleted": true, "key"}`` (also when the object was already gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import pathlib
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from eventfleet_server.backup import s3
from eventfleet_server.backup.s3 import BackupError, Target
from eventfleet_server.http.health import peer_states
from eventfleet_server.storage.snapshot import SnapshotError, SnapshotInfo, take

log = logging.getLogger(__name__)

PATH = "/backup"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def object_metadata(info: SnapshotInfo, server_id: int) -> dict[str, str]:
    """The digest as S3 user metadata (strings; S3 caps all metadata at 2 KiB)."""
    last = ",".join(f"{srv}:{s}:{i}" for srv, (s, i) in sorted(info.last_ids.items()))
    return {
        s3.META_SHA256: info.sha256,
        "events": str(info.events),
        "events-sha256": info.events_sha256,
        "server-id": str(server_id),
        "schema-version": str(info.schema_version),
        "last-ids": last[:1024],
    }


class BackupRoute:
    """The ``POST /backup`` handler; `is_admin` checks the request's token."""

    def __init__(self, replica: Any, is_admin: Callable[[web.Request], bool]):
        self._replica = replica
        self._is_admin = is_admin
        self._running = False

    def _target(self) -> Target | None:
        return Target.from_config((self._replica.conf.get("backup") or {}).get("target"))

    async def __call__(self, request: web.Request) -> web.Response:
        if not self._is_admin(request):
            return _fail("POST /backup needs the peer token (Authorization: Bearer)", 401)
        target = self._target()
        if target is None:
            return _fail("no backup.target configured on this replica", 501)
        name = request.query.get("name") or None
        if name is not None and not NAME.match(name):
            return _fail(f"name {name!r} must match {NAME.pattern}", 400)
        if request.query.get("allow_unsynced", "").lower() not in ("true", "1"):
            behind = unsynced_peers(peer_states(self._replica))
            if behind:
                return _fail(f"not synced with every peer: {behind}", 409)
        if self._running:
            return _fail("a backup is already running on this replica", 429)
        self._running = True
        try:
            return await self._backup(target, name)
        finally:
            self._running = False

    async def delete(self, request: web.Request) -> web.Response:
        """``DELETE /backup?name=NAME``: remove one copy of this fleet's prefix."""
        if not self._is_admin(request):
            return _fail("DELETE /backup needs the peer token (Authorization: Bearer)", 401)
        target = self._target()
        if target is None:
            return _fail("no backup.target configured on this replica", 501)
        name = request.query.get("name") or ""
        if not NAME.match(name):
            return _fail(f"name {name!r} must match {NAME.pattern}", 400)
        key = target.key(name)
        try:
            await asyncio.to_thread(s3.delete, target, key)
        except BackupError as e:
            log.error("delete of backup %s failed: %s", key, e)
            return _fail(str(e), 501 if str(e) == s3.INSTALL_HINT else 502)
        log.info("backup %s deleted", target.describe(key))
        return _json({"deleted": True, "bucket": target.bucket, "key": key})

    async def _backup(self, target: Target, name: str | None) -> web.Response:
        storage = self._replica.storage
        engine = self._replica.engine
        if storage is None or engine is None:
            return _fail("the replica is still starting", 503)
        server_id = engine.server_id
        started = _now()
        name = name or f"{started:%Y%m%dT%H%M%SZ}-server{server_id}"
        key = target.key(name)
        db_path = pathlib.Path(storage.path)
        copy = db_path.with_name(f".backup-{name}.sqlite")
        with contextlib.suppress(FileNotFoundError):
            copy.unlink()  # left by a backup that was killed mid-way
        try:
            info = await asyncio.to_thread(take, db_path, copy)
            await asyncio.to_thread(s3.upload, target, key, copy, object_metadata(info, server_id))
        except SnapshotError as e:
            log.error("backup %s failed: %s", key, e)
            return _fail(str(e), 500)
        except BackupError as e:
            log.error("backup %s failed: %s", key, e)
            return _fail(str(e), 501 if str(e) == s3.INSTALL_HINT else 502)
        finally:
            with contextlib.suppress(FileNotFoundError):
                copy.unlink()
        finished = _now()
        log.info(
            "backup of %d events (%d bytes, sha256 %s) uploaded to %s in %.1f s",
            info.events,
            info.size,
            info.sha256,
            target.describe(key),
            (finished - started).total_seconds(),
        )
        return _json(
            {
                "backed_up": True,
                "bucket": target.bucket,
                "key": key,
                "server_id": server_id,
                **info.as_json(),
                "started": started.isoformat(),
                "finished": finished.isoformat(),
            }
        )


def unsynced_peers(states: list[dict]) -> dict[str, str]:
    """Configured peers whose state is not ``synced``, with their state."""
    return {str(p.get("name")): str(p.get("state")) for p in states if p.get("state") != "synced"}


def _fail(error: str, status: int) -> web.Response:
    return _json({"backed_up": False, "error": error}, status)


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(doc, separators=(",", ":")), status=status, content_type="application/json"
    )
