"""Name the cause of a failed write that lies outside the store: a full file system, a
read-only one, an I/O error.

SQLite reports these as SQLITE_FULL ("database or disk is full"), SQLITE_READONLY* and
SQLITE_IOERR* ("disk I/O error": also what a write refused with EROFS becomes), without
the path or the errno an operator searches for, and the Python binding does not expose
``sqlite3_system_errno``. So after such a failure the store's directory is asked
directly: one small file written, synced and removed there gives the errno of the same
file system; ``statvfs`` tells a full disk from the ``storage.max_db_bytes`` cap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import sqlite3

__all__ = ["EIO", "PROBE_NAME", "describe", "room_error"]

EIO = "I/O error (EIO)"  # how `describe` begins an I/O error (`Storage` keys on it)
PROBE_NAME = ".write-probe"  # in the data directory, removed at once
_PROBE_BYTES = 8192  # two pages: about what the failed commit needed at least
# Below this many free bytes SQLITE_FULL is the disk, not the max_db_bytes cap.
_FULL_BELOW = 1 << 20


def describe(path: pathlib.Path, error: sqlite3.Error) -> str | None:
    """One line naming the cause (with its errno name) and `path` when `error` comes
    from the file system under the store, else None (the caller words it itself)."""
    name = getattr(error, "sqlite_errorname", "") or ""
    if name != "SQLITE_FULL" and not name.startswith(("SQLITE_READONLY", "SQLITE_IOERR")):
        return None
    directory = path.parent
    code = _probe(directory, _PROBE_BYTES)
    where = f"{path} ({_space(directory)})"
    # SQLite's words, and what a test write next to the store met (the evidence).
    what = f"{error} [{name}]; a test write in {directory} " + (
        "succeeded" if code is None else f"failed: {_errno_name(code)}"
    )
    if code == errno.EROFS or _read_only(directory):
        # Also when SQLite says SQLITE_IOERR_WRITE: a write refused with EROFS.
        return f"file system is read-only (EROFS) under {where}: {what}"
    if name == "SQLITE_FULL":
        if code == errno.ENOSPC or _full(directory):
            return f"no space left on device (ENOSPC) for {where}: {what}"
        return f"the store reached its size cap (storage.max_db_bytes) at {where}: {what}"
    if name.startswith("SQLITE_IOERR"):
        return f"{EIO} on {where}: {what}"
    return f"the store is read-only at {where}: {what}"


def _errno_name(code: int) -> str:
    return f"{errno.errorcode.get(code, str(code))} ({os.strerror(code)})"


def room_error(path: pathlib.Path, size: int) -> str | None:
    """None when `size` bytes can be written and synced next to the store at `path`,
    else one line naming the cause (ENOSPC, EROFS, EIO) and the path.

    A failing store is not healthy again just because one tiny commit fits: after a
    failed commit the WAL file keeps the space the failed frames took, so a small write
    succeeds on a file system that is still full and the next real batch fails again.
    """
    code = _probe(path.parent, size)
    if code is None:
        return None
    where = f"{path} ({_space(path.parent)})"
    short = _NAMES.get(code, _errno_name(code))
    return f"{short} for {where}: a test write of {size} bytes failed: {os.strerror(code)}"


_NAMES = {
    errno.ENOSPC: "no space left on device (ENOSPC)",
    errno.EDQUOT: "disk quota exceeded (EDQUOT)",
    errno.EROFS: "file system is read-only (EROFS)",
    errno.EIO: EIO,
}


def _probe(directory: pathlib.Path, size: int) -> int | None:
    """The errno of writing and syncing `size` bytes to a file in `directory` (removed
    again), None if it works."""
    probe = directory / PROBE_NAME
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as e:
        return e.errno
    try:
        chunk = b"\0" * min(size, 1 << 20)
        left = size
        while left > 0:
            left -= os.write(fd, chunk[:left])
        os.fsync(fd)
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


def _full(directory: pathlib.Path) -> bool:
    try:
        st = os.statvfs(directory)
    except OSError:
        return True
    return st.f_bavail * st.f_frsize < _FULL_BELOW


def _read_only(directory: pathlib.Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _space(directory: pathlib.Path) -> str:
    try:
        st = os.statvfs(directory)
    except OSError as e:
        return f"statvfs of {directory} failed: {e.strerror}"
    return f"{st.f_bavail * st.f_frsize} of {st.f_blocks * st.f_frsize} bytes free in {directory}"
