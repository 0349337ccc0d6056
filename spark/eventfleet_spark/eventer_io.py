"""Paged ``timeseries`` reads over Eventer, for Spark's Python workers.

Why not `eventfleet_server.client.eventer.Client`: the job reads millions of events, and
turning every SBS record into model objects (``Event``, ``EventId``, ``Timestamp``)
costs about as much client CPU as decoding the SBS itself. This module speaks the same
protocol over the project's chatter transport and hands out the decoded SBS records
as they are; `schema.page_to_batch` turns them straight into Arrow columns. The
write-back, which handles few events, uses the project's client.

Executors are plain Python workers without a running event loop, and Spark pulls rows
from a *synchronous* iterator, so `read_span` owns a private event loop and drives it
one page at a time. While Spark converts one page, the query for the next one is
already sent (chatter `send` writes to the transport at once), so the replica prepares
page k+1 while the worker converts page k.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Iterator, Sequence

from eventfleet_server import chatter
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    EventId,
    EventType,
    Order,
    OrderBy,
    QueryTimeseriesParams,
    timestamp_from_us,
)

from eventfleet_spark.endpoints import TOKEN_ENV, Endpoint
from eventfleet_spark.tls import ClientTls, connect_error

log = logging.getLogger(__name__)

_P = "HatEventer."


class EventerReadError(Exception):
    """Reading from a replica failed (the message names the endpoint and the cause)."""


class RawSession:
    """One initialized Eventer connection answering queries with raw SBS records."""

    def __init__(self, conn: chatter.Connection, endpoint: Endpoint):
        self._conn = conn
        self.endpoint = endpoint

    @classmethod
    async def open(
        cls,
        endpoint: Endpoint,
        client_name: str,
        token: str | None,
        timeout: float,
        tls: ClientTls | None = None,
        context: ssl.SSLContext | None = None,
    ) -> RawSession:
        """Connect (over TLS with `context`, built from `tls`) and initialize."""
        if tls is not None and context is None:
            context = tls.context()
        try:
            conn = await asyncio.wait_for(
                chatter.connect(endpoint.host, endpoint.port, ssl=context), timeout
            )
        except (OSError, TimeoutError) as e:
            raise EventerReadError(
                f"eventer {endpoint}: cannot connect: {connect_error(e, tls)}"
            ) from e
        try:
            req = {
                "clientName": client_name,
                "clientToken": codec.opt(token),
                "subscriptions": [],
                "serverId": codec.NONE,
                "persisted": False,
            }
            conv = conn.send(
                _P + "MsgInitReq", codec.repo.encode(_P + "MsgInitReq", req), last=False
            )
            msg = await asyncio.wait_for(conn.receive(), timeout)
            if msg.type != _P + "MsgInitRes" or msg.conv != conv:
                raise EventerReadError(f"eventer {endpoint}: unexpected init answer {msg.type}")
            kind, value = codec.repo.decode(msg.type, msg.data)
            if kind == "error":
                raise EventerReadError(f"eventer {endpoint} refused the connection: {value}")
        except BaseException:
            conn.close()
            raise
        return cls(conn, endpoint)

    def send_query(self, params: QueryTimeseriesParams) -> chatter.Conversation:
        data = codec.repo.encode(_P + "MsgQueryReq", codec.query_params_to_sbs(params))
        return self._conn.send(_P + "MsgQueryReq", data, last=False)

    async def receive_result(self, conv: chatter.Conversation) -> tuple[list[dict], bool]:
        """Events (raw SBS ``HatEventer.Event`` records) and ``moreFollows`` of `conv`."""
        while True:
            msg = await self._conn.receive()
            if msg.type == _P + "MsgQueryRes" and msg.conv == conv:
                data = codec.repo.decode(msg.type, msg.data)
                return data["events"], data["moreFollows"]
            # Status notifies (and anything else) are not for a reader.

    async def close(self) -> None:
        self._conn.close()
        with contextlib.suppress(Exception):
            await self._conn.wait_closed()


def event_id_of(raw: dict) -> EventId:
    i = raw["id"]
    return EventId(i["server"], i["session"], i["instance"])


def read_span(
    endpoint: Endpoint,
    start_us: int,
    end_us: int,
    *,
    event_types: Sequence[EventType] | None = None,
    page_size: int = 10_000,
    client_name: str = "eventfleet-spark",
    token: str | None = None,
    timeout: float = 30.0,
    retries: int = 3,
    tls: ClientTls | None = None,
) -> Iterator[list[dict]]:
    """Pages of raw events with ``start_us <= timestamp < end_us``, ascending natural order.

    A dropped connection (a replica restarting, a ping timeout while Spark was busy
    elsewhere) is retried up to `retries` times, resuming after the last event already
    handed out. `token` None means ``$EVENTFLEET_TOKEN`` (how the operator passes the
    Secret to executors). With `tls` the connection is TLS, the replica's certificate
    verified against its CA.
    """
    if end_us <= start_us:
        return
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    params = QueryTimeseriesParams(
        event_types=list(event_types) if event_types is not None else None,
        t_from=timestamp_from_us(start_us),
        t_to=timestamp_from_us(end_us - 1),  # the query's bounds are inclusive
        order=Order.ASCENDING,
        order_by=OrderBy.TIMESTAMP,
        max_results=page_size,
    )
    context = tls.context() if tls is not None else None  # once per span, not per retry
    loop = asyncio.new_event_loop()
    session: RawSession | None = None
    failures = 0
    try:
        while True:
            try:
                if session is None:
                    session = loop.run_until_complete(
                        RawSession.open(endpoint, client_name, token, timeout, tls, context)
                    )
                    conv = session.send_query(params)
                events, more = loop.run_until_complete(
                    asyncio.wait_for(session.receive_result(conv), timeout)
                )
            except (ConnectionError, TimeoutError) as e:
                failures += 1
                if session is not None:
                    loop.run_until_complete(session.close())
                    session = None
                if failures > retries:
                    raise EventerReadError(
                        f"eventer {endpoint}: reading [{start_us}, {end_us}) us failed"
                        f" {failures} times, last: {connect_error(e, tls)}"
                    ) from e
                log.warning("eventer %s: %r; reconnecting (attempt %d)", endpoint, e, failures)
                continue
            if more:
                if not events:
                    raise EventerReadError(
                        f"eventer {endpoint}: empty page with moreFollows after"
                        f" {params.last_event_id}"
                    )
                params = params._replace(last_event_id=event_id_of(events[-1]))
                conv = session.send_query(params)  # the replica works on it meanwhile
            elif not events and params.last_event_id is not None:
                # The sentinel semantics answer "nothing" when the sentinel is gone, so a
                # vanished sentinel would silently truncate the read; more=True promised
                # at least one event.
                raise EventerReadError(
                    f"eventer {endpoint}: paging sentinel {tuple(params.last_event_id)} is no"
                    " longer stored (retention during the read?); re-run the window"
                )
            if events:
                yield events
            if not more:
                return
    finally:
        if session is not None:
            loop.run_until_complete(session.close())
        _close_loop(loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    # Let cancelled tasks (the chatter ping loop) finish before closing, or asyncio
    # warns "Task was destroyed but it is pending" into the executor's log.
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()
