"""Process set-up: logging (key=value text for people, JSON lines for log collectors)
and the file-creation mask."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

# Files and directories the process creates are its user's only (0600 / 0700), as
# PostgreSQL does for its data: events may be confidential, and a copy, a backup or a
# volume mounted elsewhere keeps the modes it was created with.
PRIVATE_UMASK = 0o077


def private_umask() -> int:
    """Set the process umask to `PRIVATE_UMASK` (inherited by child processes); returns
    the previous one. Called first thing by ``eventfleet server`` and ``eventfleet fleet``."""
    return os.umask(PRIVATE_UMASK)


class JsonFormatter(logging.Formatter):
    def __init__(self, static: dict | None = None):
        super().__init__()
        self._static = static or {}

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self._static,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "INFO", fmt: str = "text", static: dict | None = None) -> None:
    """Configure the root logger once, on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(static))
    else:
        prefix = " ".join(f"{k}={v}" for k, v in (static or {}).items())
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {prefix} %(name)s: %(message)s".strip())
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
