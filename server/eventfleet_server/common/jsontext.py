"""JSON payload text as stored: parsed where it parses.

The server stores JSON payloads as the text it received and parses them only where a
reader needs the value (the BUS's records, Jetstream's models, Replication's rows, the
CLI). Every such reader treats text that does not parse the same way, and that includes
text nested deeper than Python's parser follows: it raises RecursionError, not
ValueError, and one uncaught once lost whole broadcasts.
"""

from __future__ import annotations

import json
from typing import Any

NOT_JSON: Any = object()
"""What `parse` returns for text that is not JSON, or is nested too deeply to parse."""


def parse(text: str) -> Any:
    """``json.loads(text)``, or `NOT_JSON`."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return NOT_JSON
