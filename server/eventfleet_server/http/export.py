"""``GET /export``: a timestamp window of events as an Arrow IPC stream (for analytics).

    GET /export?from=<µs>&to=<µs>[&after=<ts>,<server>,<session>,<instance>]
    Authorization: Bearer <token>          (when the replica has a client token)

Streams every stored event with ``from <= timestamp < to`` (microseconds since the
epoch, the server timestamp) in ascending natural order as an Arrow IPC *stream*
(``application/vnd.apache.arrow.stream``), one record batch per page of SQLite rows,
closed by an empty batch whose custom metadata ``eventfleet.end`` is the event count
(`eventfleet_server.storage.bulk` has the schema and the paging). ``after`` resumes
strictly after that natural-order key (a reader that lost its connection continues
where it stopped).

Answers before the stream starts: 400 a bad or missing parameter (the message names
it), 401 missing or wrong token, 429 too many exports running (``Retry-After``), 501
pyarrow is not installed, 503 the replica is not ready. A failure after the 200 status
line closes the connection without the end batch, which readers treat as an error.

Bounded: at most `MAX_CONCURRENT_EXPORTS` exports per replica at once, each holding
one page in flight; a client that stops reading for `WRITE_TIMEOUT` seconds is cut off
so it cannot hold a slot forever.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web

from eventfleet_server.listener import TokenPolicy

log = logging.getLogger(__name__)

PATH = "/export"
CONTENT_TYPE = "application/vnd.apache.arrow.stream"
MAX_CONCURRENT_EXPORTS = 2
WRITE_TIMEOUT = 60.0
_MIN_I64, _MAX_I64 = -(1 << 63), (1 << 63) - 1


class BadParameter(ValueError):
    """A query parameter is missing or invalid; the message names it."""


def export_refusal(replica: Any, request: web.Request) -> str | None:
    """None when `request` may export, else why not (never echoing a token).

    The one place that decides who may export: any of the replica's client tokens (what
    an Eventer reader presents; the Spark job's ``$EVENTFLEET_TOKEN``) or its peer/admin
    tokens, as ``Authorization: Bearer``; open when the replica has no token at all. The
    export reads every event, which is exactly what an Eventer client may do.
    """
    credentials = getattr(replica, "credentials", None)
    if credentials is not None:
        tokens = tuple(credentials.client) + tuple(credentials.peer)
    else:  # a replica object from before the credentials (tests, embedding)
        token = getattr(replica, "token", None)
        tokens = (token,) if token else ()
    if not tokens:
        return None
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    presented = value.strip() if scheme.lower() == "bearer" and value.strip() else None
    reason = TokenPolicy(tokens).check(presented)
    if reason is None:
        return None
    return f"{reason} (Authorization: Bearer <token>)"


def parse_params(query) -> tuple[int, int, tuple[int, int, int, int] | None]:
    """``(from, to, after)`` of the query string; `BadParameter` names the bad one."""

    def integer(name: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise BadParameter(f"parameter {name}={text!r} is not an integer") from None
        if not _MIN_I64 <= value <= _MAX_I64:
            raise BadParameter(f"parameter {name}={text!r} is out of the 64-bit range")
        return value

    bounds = []
    for name in ("from", "to"):
        text = query.get(name)
        if text is None or text == "":
            raise BadParameter(f"parameter {name} is required (microseconds since the epoch)")
        bounds.append(integer(name, text))
    start, end = bounds
    if end <= start:
        raise BadParameter(f"parameter to={end} must be greater than from={start}")
    after = None
    text = query.get("after")
    if text is not None:
        parts = text.split(",")
        if len(parts) != 4:
            raise BadParameter(
                f"parameter after={text!r} is not <timestamp>,<server>,<session>,<instance>"
            )
        after = tuple(integer("after", p.strip()) for p in parts)
    for name in query:
        if name not in ("from", "to", "after"):
            raise BadParameter(f"unknown parameter {name!r} (from, to, after)")
    return start, end, after  # type: ignore[return-value]


class ExportRoute:
    """The ``/export`` handler of one replica (its concurrency cap lives here)."""

    def __init__(self, replica: Any, max_concurrent: int = MAX_CONCURRENT_EXPORTS):
        self._replica = replica
        self._max = max_concurrent
        self.running = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        refusal = export_refusal(self._replica, request)
        if refusal is not None:
            return _error(401, refusal, {"WWW-Authenticate": "Bearer"})
        try:
            start, end, after = parse_params(request.query)
        except BadParameter as e:
            return _error(400, str(e))
        storage = getattr(self._replica, "storage", None)
        if storage is None or getattr(storage, "_closed", True):
            return _error(503, "the replica's storage is not open (starting or stopping)")
        try:
            from eventfleet_server.storage import bulk
        except ImportError as e:
            return _error(501, f"this replica cannot export: pyarrow is not installed ({e})")
        if self.running >= self._max:
            return _error(
                429, f"{self._max} exports already running; retry later", {"Retry-After": "1"}
            )
        self.running += 1
        try:
            return await self._stream(request, bulk, storage, start, end, after)
        finally:
            self.running -= 1

    async def _stream(self, request, bulk, storage, start, end, after) -> web.StreamResponse:
        stats = bulk.ExportStats()
        t0 = time.perf_counter()
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        chunks = bulk.export_stream(
            storage,
            start,
            end,
            after=None if after is None else bulk.ExportKey(*after),
            stats=stats,
        )
        done = False
        try:
            await response.prepare(request)
            async for chunk in chunks:
                if chunk:
                    await asyncio.wait_for(response.write(chunk), WRITE_TIMEOUT)
            await response.write_eof()
            done = True
        except (ConnectionError, TimeoutError) as e:
            log.warning(
                "export [%d, %d) to %s stopped after %d events: %r",
                start,
                end,
                request.remote,
                stats.events,
                e,
            )
        except Exception:
            log.exception(
                "export [%d, %d) to %s failed after %d events",
                start,
                end,
                request.remote,
                stats.events,
            )
        finally:
            await chunks.aclose()
            if not done and request.transport is not None:
                # After the 200 status line the only error signal left: no end batch,
                # and the connection closes mid-stream.
                request.transport.close()
        if done:
            seconds = time.perf_counter() - t0
            log.info(
                "export [%d, %d) to %s: %d events, %d bytes in %.2f s (%.0f events/s)",
                start,
                end,
                request.remote,
                stats.events,
                stats.bytes,
                seconds,
                stats.events / seconds if seconds > 0 else 0.0,
            )
        return response


def _error(status: int, message: str, headers: dict | None = None) -> web.Response:
    return web.Response(
        text=json.dumps({"error": message}, separators=(",", ":")),
        status=status,
        content_type="application/json",
        headers=headers,
    )
