"""AppWebsocket framing: one JSON object per websocket text frame, ``{mt, api, src, ...}``.

Engine-free and transport-free: `decode` turns a frame's text into a message dict or
raises `FrameError` naming what is wrong; `encode` is the compact JSON the peer gets.
"""

from __future__ import annotations

import functools
import json
from typing import Any

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class FrameError(ValueError):
    """A frame that is not an AppWebsocket message; the text says why."""


def decode(text: str) -> dict[str, Any]:
    """Parse one text frame; `FrameError` unless it is an object with a string ``mt``."""
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise FrameError(f"frame is not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise FrameError(f"frame must be a JSON object, got {type(msg).__name__}")
    mt = msg.get("mt")
    if not isinstance(mt, str) or not mt:
        raise FrameError(f"'mt' must be a non-empty string, got {mt!r}")
    api = msg.get("api")
    if api is not None and not isinstance(api, str):
        raise FrameError(f"'api' must be a string, got {api!r}")
    return msg


def encode(msg: dict[str, Any]) -> str:
    return _dumps(msg)


def reply_with_row(request: dict[str, Any], mt: str, usn: int, columns_text: str) -> str:
    """The frame of ``reply(request, mt, usn=usn, columns=<row>)`` (what `encode` makes
    of it, byte for byte) with the row's columns given as their JSON text — encoded once
    when the row changed (`table.Row.text`) and joined here, not encoded per answer."""
    api = request.get("api", _ABSENT)
    src = request.get("src", _ABSENT)
    if type(api) in _HASHABLE and type(src) in _HASHABLE:
        head = _reply_head(mt, api, src)  # a replicator's requests all look alike
    else:
        head = _dumps(reply(request, mt))[:-1]
    return f'{head},"usn":{usn},"columns":{columns_text}}}'


def push_with_row(api: str, mt: str, usn: int, columns_text: str) -> str:
    """The frame of ``{"api", "mt", "usn", "columns"}`` (a live change), the columns
    given as their JSON text (see `reply_with_row`)."""
    return f'{_push_head(api, mt)},"usn":{usn},"columns":{columns_text}}}'


class _Absent:
    """A member the request did not have (not the same as JSON null)."""


_ABSENT = _Absent()
_HASHABLE = (str, int, type(None), _Absent)


@functools.lru_cache(maxsize=256)
def _reply_head(mt: str, api: Any, src: Any) -> str:
    request = {k: v for k, v in (("api", api), ("src", src)) if v is not _ABSENT}
    return _dumps(reply(request, mt))[:-1]


@functools.lru_cache(maxsize=256)
def _push_head(api: str, mt: str) -> str:
    return _dumps({"api": api, "mt": mt})[:-1]


def reply(request: dict[str, Any], mt: str, **fields: Any) -> dict[str, Any]:
    """An answer to `request`: same ``api``, ``src`` echoed (when the request had one)."""
    out: dict[str, Any] = {"mt": mt}
    if "api" in request:
        out["api"] = request["api"]
    if "src" in request:
        out["src"] = request["src"]
    out.update(fields)
    return out


def error_reply(request: dict[str, Any] | None, error: str) -> dict[str, Any]:
    """The answer to a refused request: ``<mt>Result`` with ``error``.

    A frame that could not be parsed (no usable ``mt``) gets ``{"mt": "Error", error}``.
    """
    if not request or not isinstance(request.get("mt"), str):
        return {"mt": "Error", "error": error}
    mt = request["mt"]
    return reply(request, mt if mt.endswith("Result") else f"{mt}Result", error=error)


def parse_columns(value: Any, what: str = "columns") -> dict[str, bool]:
    """A Columns object ``{name: {update?: bool}}`` as ``{name: updatable}``."""
    if not isinstance(value, dict):
        raise FrameError(f"'{what}' must be an object, got {type(value).__name__}")
    out: dict[str, bool] = {}
    for name, spec in value.items():
        if not isinstance(spec, dict):
            raise FrameError(
                f"'{what}.{name}' must be an object like {{\"update\": true}}, got {spec!r}"
            )
        update = spec.get("update", False)
        if not isinstance(update, bool):
            raise FrameError(f"'{what}.{name}.update' must be a boolean, got {update!r}")
        out[name] = update
    return out


def columns_object(columns: dict[str, bool]) -> dict[str, dict[str, bool]]:
    return {name: ({"update": True} if update else {}) for name, update in columns.items()}
