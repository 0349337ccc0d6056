"""Jetstream messages on the wire: JSON text frames, the server always sends an array.

Engine-free, transport-free. Shapes follow the reference server (npm ``jetstream``
0.13.4) where the protocol page is vague; see docs/jetstream.md.
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring as _string
from typing import Any

# Close codes of the reference (WEBSOCKET_CODE_OFFSET 4096): a denied connection (unknown
# session token, no SessionCreate first, too slow to create a session) and a session the
# server ended (expired).
CLOSE_DENIED = 4096
CLOSE_CLOSED = 4097

CLIENT_TYPES = frozenset({"SessionCreate", "ScopeFetch", "ScopeSync", "Ping"})


class WireError(Exception):
    """A frame or message that cannot be used; `type` and `message` as the reference."""

    def __init__(self, type_: str, message: str):
        super().__init__(message)
        self.type = type_
        self.message = message

    def to_json(self) -> dict:
        return {"message": self.message, "type": self.type}


def error_json(type_: str, message: str) -> dict:
    """A fragment reply / message field ``{"error": {message, type}}``."""
    return {"error": {"message": message, "type": type_}}


def decode(text: str) -> list[dict]:
    """One frame -> its messages (a single object or an array, as the reference accepts).

    Messages are returned in frame order; each is a dict with a string ``type``.
    """
    try:
        data = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError) as e:
        raise WireError("invalid-json", f"frame is not JSON: {str(e)[:80]}") from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise WireError("invalid-message", "empty message array")
    for i, m in enumerate(items):
        if not isinstance(m, dict) or not isinstance(m.get("type"), str):
            raise WireError("invalid-message", f"message {i} is not an object with a string type")
    return items


def _not_json(constant: str) -> None:
    # Python's json reads NaN and ±Infinity; JSON (and a client's JSON.parse) does not: a
    # property of kind "any" would store them and every frame carrying it be unreadable.
    raise ValueError(f"{constant} is not JSON")


FRAGMENTS_JSON = "_fragments_json"
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def dumps(value: Any) -> str:
    """Compact JSON text that is valid UTF-8 once encoded.

    Non-ASCII text is kept as it is (smaller frames), except lone surrogates: JSON may
    carry them (``"\\ud800"``, from a client or a stored event's payload) and Python keeps
    them in `str`, but a websocket text frame must be UTF-8, so strict encoding fails.
    Such text is sent with its escapes, which a client's JSON.parse reads back the same.
    """
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return json.dumps(value, separators=(",", ":"))


def encode(messages: list[dict]) -> str:
    """The frame: a JSON array. A message may carry its ``fragments`` already encoded
    (key `FRAGMENTS_JSON`): a change fanned out to many sessions, or an unchanged scope's
    ScopeState, is then encoded once, not once per session."""
    parts = []
    for m in messages:
        pre = m.get(FRAGMENTS_JSON)
        if pre is None:
            parts.append(dumps(m))
            continue
        # The envelope by hand: this runs once per session of a fan-out, and json.dumps
        # of even a small dict costs more than the socket write.
        head = []
        for k, v in m.items():
            if k == "fragments" or k == FRAGMENTS_JSON:
                continue
            if type(v) is int:
                head.append(f'"{k}":{v}')
            elif type(v) is str:
                head.append(f'"{k}":{_string(v)}')
            else:
                head.append(f'"{k}":{dumps(v)}')
        parts.append("{" + ",".join(head) + ',"fragments":' + pre + "}")
    return "[" + ",".join(parts) + "]"


def index_of(message: dict) -> int:
    """The message's ``index`` (a non-negative integer), else WireError."""
    index = message.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise WireError(
            "invalid-message",
            f"{message.get('type')} index {str(index)[:20]!r} is not an integer >= 0",
        )
    return index


# -- server messages (index assigned by the session) ------------------------------------------


def session_create_reply(token: str) -> dict:
    return {"type": "SessionCreateReply", "sessionToken": token}


def session_create_denied(type_: str, message: str) -> dict:
    return {"type": "SessionCreateReply", "error": {"message": message, "type": type_}}


def scope_fetch_reply(reply_to: int, scope_index: int) -> dict:
    return {"type": "ScopeFetchReply", "replyTo": reply_to, "scopeIndex": scope_index}


def scope_fetch_denied(reply_to: int, type_: str, message: str) -> dict:
    return {
        "type": "ScopeFetchReply",
        "replyTo": reply_to,
        "error": {"message": message, "type": type_},
    }


def scope_state(
    scope_index: int, root: str, fragments: list[dict], encoded: str | None = None
) -> dict:
    m = {"type": "ScopeState", "scopeIndex": scope_index, "rootUUID": root, "fragments": fragments}
    if encoded is not None:
        m[FRAGMENTS_JSON] = encoded
    return m


def scope_sync(scope_index: int, fragments: list[dict], encoded: str | None = None) -> dict:
    m = {"type": "ScopeSync", "scopeIndex": scope_index, "fragments": fragments}
    if encoded is not None:
        m[FRAGMENTS_JSON] = encoded
    return m


def scope_sync_reply(reply_to: int, replies: list[dict]) -> dict:
    return {"type": "ScopeSyncReply", "replyTo": reply_to, "fragmentReplies": replies}


def ping(ack: int, resend_missing: bool = False) -> dict:
    return {"type": "Ping", "index": 0, "ack": ack, "resendMissing": resend_missing}


def describe(message: Any) -> str:
    """Short text for logs: type and index, never the payload."""
    if isinstance(message, dict):
        return f"{message.get('type')}#{message.get('index')}"
    return type(message).__name__
