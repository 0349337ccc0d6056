"""Logging set-up: key=value text for people, JSON lines for log collectors."""

from __future__ import annotations

import json
import logging
import sys
import time


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
