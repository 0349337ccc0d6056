"""Reads of a replica's ``GET /export`` (Arrow IPC stream), for Spark's Python workers.

The replica's other read path for analytics (`eventfleet_server.http.export`): a time
window as Arrow record batches built from SQLite pages, instead of SBS-encoded Eventer
query pages. This module uses only the standard library's HTTP client and pyarrow (the
job may not import aiohttp or the server side).

`read_span_arrow` yields `ExportPage` values: the Arrow batch with the export's columns
(`EXPORT_COLUMNS`) and the event type of each row as a tuple (decoded once per replica
type id, not per event). Pages come in ascending natural order — the order of the
Eventer ``timeseries`` read — so the reader's partial aggregation adds the same numbers
in the same order on both paths and writes the same bytes.

A replica without the route (404, or 501 without pyarrow) raises `ExportUnavailable`:
the source then reads that slice over Eventer. A refused token, a bad window or a
truncated stream raise `ExportReadError`; a dropped connection is retried `retries`
times, resuming after the last event handed out (``after=``); 429 (too many exports
running on that replica) waits ``Retry-After`` and tries again within `timeout`.
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import os
import ssl
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa

from eventfleet_spark.endpoints import TOKEN_ENV, Endpoint
from eventfleet_spark.tls import ClientTls, connect_error

log = logging.getLogger(__name__)

PATH = "/export"
END_METADATA_KEY = b"eventfleet.end"
EXPORT_COLUMNS = (
    "server",
    "session",
    "instance",
    "type_id",
    "type",
    "timestamp",
    "source_timestamp",
    "payload_kind",
    "payload_json",
    "payload_binary_type",
    "payload_binary",
)


class ExportReadError(Exception):
    """Reading ``/export`` failed (the message names the endpoint and the cause)."""


class ExportUnavailable(ExportReadError):
    """The replica has no usable ``/export`` (an older replica): read over Eventer."""


@dataclasses.dataclass
class ExportPage:
    """One record batch of the export and each row's event type as a tuple."""

    batch: pa.RecordBatch
    types: list[tuple[str, ...]]

    def __len__(self) -> int:
        return self.batch.num_rows


class _TypeCache:
    """Replica type id → type tuple (and whether the `types` patterns keep it)."""

    def __init__(self, patterns: Sequence[Sequence[str]] | None):
        self._types: dict[int, tuple[str, ...]] = {}
        self._kept: dict[int, bool] = {}
        self._subscription = None
        if patterns is not None:
            from eventfleet_server.common.subscription import Subscription

            subscription = Subscription([tuple(p) for p in patterns])
            if not subscription.matches_all:
                self._subscription = subscription

    def page(self, batch: pa.RecordBatch) -> ExportPage:
        ids = batch.column("type_id").to_pylist()
        types = self._types
        missing = {i for i in set(ids) if i not in types}
        if missing:
            column = batch.column("type")
            for row, type_id in enumerate(ids):
                if type_id in missing:
                    types[type_id] = tuple(column[row].as_py())
                    missing.discard(type_id)
                    if not missing:
                        break
        if self._subscription is not None:
            kept = self._kept
            for type_id in set(ids):
                if type_id not in kept:
                    kept[type_id] = self._subscription.matches(types[type_id])
            mask = [kept[i] for i in ids]
            if not all(mask):
                batch = batch.filter(pa.array(mask, pa.bool_()))
                ids = [i for i, keep in zip(ids, mask, strict=True) if keep]
        return ExportPage(batch, [types[i] for i in ids])


def read_span_arrow(
    endpoint: Endpoint,
    start_us: int,
    end_us: int,
    *,
    event_types: Sequence[Sequence[str]] | None = None,
    token: str | None = None,
    timeout: float = 30.0,
    retries: int = 3,
    tls: ClientTls | None = None,
) -> Iterator[ExportPage]:
    """Pages of the events with ``start_us <= timestamp < end_us`` from `endpoint`'s
    ``/export``, ascending natural order, filtered by `event_types` (hat-event patterns,
    the Eventer query's semantics). `token` None means ``$EVENTFLEET_TOKEN``. With `tls`
    the request is HTTPS, the replica's certificate verified against its CA."""
    if end_us <= start_us:
        return
    context = tls.context() if tls is not None else None
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    cache = _TypeCache(event_types)
    after: tuple[int, int, int, int] | None = None
    failures = 0
    busy_until = time.monotonic() + timeout
    while True:
        try:
            conn, response = _open(endpoint, start_us, end_us, after, token, timeout, context)
        except _Busy as e:
            if time.monotonic() + e.retry_after > busy_until:
                raise ExportReadError(
                    f"export {endpoint}: replica busy (429) for more than {timeout} s"
                ) from None
            time.sleep(e.retry_after)
            continue
        except ssl.SSLCertVerificationError as e:
            # Not transient: another attempt meets the same certificate.
            raise ExportReadError(f"export {endpoint}: {connect_error(e, tls)}") from e
        except (ConnectionError, TimeoutError, http.client.HTTPException, OSError) as e:
            failures += 1
            if failures > retries:
                raise ExportReadError(
                    f"export {endpoint}: cannot connect ({failures} attempts):"
                    f" {connect_error(e, tls)}"
                ) from e
            log.warning("export %s: %r; retrying (attempt %d)", endpoint, e, failures)
            time.sleep(min(0.2 * failures, 2.0))
            continue
        try:
            reader = pa.ipc.open_stream(response)
            while True:
                try:
                    batch, metadata = reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    raise ExportReadError(
                        f"export {endpoint}: stream of [{start_us}, {end_us}) ended without"
                        " its end marker (the replica failed mid-stream)"
                    ) from None
                if metadata is not None and END_METADATA_KEY in metadata:
                    return
                if batch.num_rows:
                    last = batch.slice(batch.num_rows - 1)
                    after = (
                        last.column("timestamp").cast(pa.int64())[0].as_py(),
                        last.column("server")[0].as_py(),
                        last.column("session")[0].as_py(),
                        last.column("instance")[0].as_py(),
                    )
                    page = cache.page(batch)
                    if len(page):
                        yield page
        except (ConnectionError, TimeoutError, http.client.HTTPException, OSError) as e:
            # pyarrow raises OSError for a stream cut mid-message (IncompleteRead etc.)
            failures += 1
            if failures > retries:
                raise ExportReadError(
                    f"export {endpoint}: reading [{start_us}, {end_us}) us failed"
                    f" {failures} times, last: {e!r}"
                ) from e
            log.warning(
                "export %s: %r; resuming after %s (attempt %d)", endpoint, e, after, failures
            )
        finally:
            conn.close()


class _Busy(Exception):
    def __init__(self, retry_after: float):
        self.retry_after = retry_after


def _open(
    endpoint: Endpoint,
    start_us: int,
    end_us: int,
    after: tuple[int, int, int, int] | None,
    token: str | None,
    timeout: float,
    context: ssl.SSLContext | None = None,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    query = f"from={start_us}&to={end_us}"
    if after is not None:
        query += "&after=" + ",".join(str(v) for v in after)
    headers = {"Accept": "application/vnd.apache.arrow.stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if context is not None:
        conn = http.client.HTTPSConnection(
            endpoint.host, endpoint.port, timeout=timeout, context=context
        )
    else:
        conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
    try:
        conn.request("GET", f"{PATH}?{query}", headers=headers)
        response = conn.getresponse()
    except BaseException:
        conn.close()
        raise
    if response.status == 200:
        return conn, response
    body = response.read(4096).decode("utf-8", "replace").strip()
    conn.close()
    if response.status in (404, 405, 501):
        raise ExportUnavailable(f"export {endpoint}: {response.status} {body}")
    if response.status == 429:
        try:
            retry_after = max(0.05, min(float(response.headers.get("Retry-After", "1")), 10.0))
        except ValueError:
            retry_after = 1.0
        raise _Busy(retry_after)
    raise ExportReadError(
        f"export {endpoint} refused [{start_us}, {end_us}): {response.status} {body}"
    )
