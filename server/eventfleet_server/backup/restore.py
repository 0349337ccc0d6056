"""Start a new replica from a backup: download, verify, and only then put it in place.

Called by the replica before it opens its store (`eventfleet_server.main`), only when
the data directory holds no store and ``allow_empty_start`` is true. Why that second
condition: a restored store holds events of this replica's own server id, and the
Syncer's identity rule (`eventfleet_server.syncer.bootstrap`) continues above the
highest own id held when no peer answers. That is right for the first boot of a fleet
created from a backup (every replica starts from the same copy; the old fleet is gone),
and wrong for one replica of a running fleet that lost its volume: its peers may hold
newer own events than the copy. Such a replica (``allow_empty_start`` false once the
fleet was ready) ignores ``restore_from`` and re-syncs from its peers, as without it.

Nothing half-written: the copy is downloaded to a temporary file beside the store, its
SHA-256 compared with the expected one (configured, else the object's metadata), its
``PRAGMA quick_check`` and schema checked, then it is fsynced and renamed into place.
Any failure removes the temporary file and raises `BackupError` naming the object.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib

from eventfleet_server.backup import s3
from eventfleet_server.backup.s3 import BackupError, RestoreSource
from eventfleet_server.storage.snapshot import SnapshotError, SnapshotInfo, file_sha256, inspect

log = logging.getLogger(__name__)


def restore(source: RestoreSource, db_path: pathlib.Path) -> SnapshotInfo:
    """Put the verified copy `source` at `db_path` (which must not exist). Blocking."""
    db_path = pathlib.Path(db_path)
    if db_path.exists():
        raise BackupError(f"{db_path} exists: a restore only fills an empty data directory")
    where = source.describe(source.key)
    tmp = db_path.with_name(f".{db_path.name}.restore")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a restore that was killed mid-way
    try:
        metadata = s3.download(source, source.key, tmp)
        os.chmod(tmp, 0o600)  # the store's mode whatever the umask (docs/security.md)
        expected = source.sha256 or metadata.get(s3.META_SHA256)
        if not expected:
            raise BackupError(
                f"{where}: no expected SHA-256 (neither backup.restore_from.sha256 nor the "
                f"object's x-amz-meta-{s3.META_SHA256})"
            )
        actual = file_sha256(tmp)
        if actual != expected:
            raise BackupError(f"{where}: SHA-256 {actual} does not match the expected {expected}")
        try:
            info = inspect(tmp, quick_check=True)
        except SnapshotError as e:
            raise BackupError(f"{where}: {e}") from None
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        # Stale WAL files without their database would be applied to the copy.
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                db_path.with_name(db_path.name + suffix).unlink()
        os.replace(tmp, db_path)
        _fsync_dir(db_path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    log.info(
        "restored %s from %s: %d events, sha256 %s, last ids %s",
        db_path,
        where,
        info.events,
        info.sha256,
        {k: v for k, v in sorted(info.last_ids.items())},
    )
    return info


def _fsync_dir(path: pathlib.Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
