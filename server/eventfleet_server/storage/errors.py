"""Errors of the storage package (one line each: the file, what is wrong, what to do)."""

from __future__ import annotations

__all__ = [
    "RESTORE_HINT",
    "CorruptStoreError",
    "SchemaVersionError",
    "StorageError",
    "StorageFaultError",
]

RESTORE_HINT = (
    "stop this replica, move the file aside and restore the replica from a peer "
    "(docs/runbook.md, 'Restore')"
)


class StorageError(Exception):
    """A write or the database failed; the message names the bad event or value."""


class StorageFaultError(StorageError):
    """The file system under the store failed the write (ENOSPC, EIO, EROFS, the size
    cap): not the events' fault; the message names the cause and the path."""


class CorruptStoreError(StorageError):
    """The database file failed its integrity check at start (one line: the file, what
    is wrong, what to do)."""


class SchemaVersionError(StorageError):
    """The database file has a storage schema version this replica does not know (one
    line: the file and both versions). Raised before anything in the file changes."""

    def __init__(self, path: object, found: int, known: int) -> None:
        self.found, self.known = found, known
        if found > known:
            text = (
                f"{path}: storage schema version {found} is newer than this replica's "
                f"{known} (the store was written by a newer eventfleet): run that version "
                "or a newer one; a downgrade across storage schema versions is not supported"
            )
        else:
            text = (
                f"{path}: storage schema version {found} is older than this replica's "
                f"{known} and no migration from it exists: run the eventfleet version that "
                "wrote it, or restore the replica from a peer (docs/runbook.md, 'Restore')"
            )
        super().__init__(text)
