"""Write-back: aggregates registered into the fleet as events, idempotently.

An aggregate of ``type`` for the bucket starting at ``B`` is the event

* type ``prefix + type`` (default prefix ``['eventfleet', 'aggregate', '<bucket seconds>']``),
* source timestamp ``B``,
* JSON payload `Aggregate.payload_json` (canonical text).

The rule that makes re-runs idempotent: before registering, the job queries the
fleet for every event under the prefix whose *source timestamp* lies in the window
and keeps, per (type, source timestamp), the latest one (the greatest in natural
order, which is what a reader taking "the latest" sees). It registers an aggregate
only if there is no such event or its payload text differs. Re-running a window over
unchanged events registers nothing; a late event changes its bucket's payload and so
adds exactly one newer event for that bucket. Readers take, per (type, source
timestamp), the latest event; earlier ones are the history.

Nothing is ever deleted: a bucket that had an aggregate and now has no events (only
possible when retention removed them) keeps its last aggregate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from eventfleet_server.common.model import (
    EventPayloadJson,
    Order,
    OrderBy,
    QueryTimeseriesParams,
    RegisterEvent,
    timestamp_from_us,
    timestamp_to_us,
)

from eventfleet_spark.endpoints import Endpoint
from eventfleet_spark.record import Aggregate
from eventfleet_spark.timeplan import Span
from eventfleet_spark.tls import ClientTls, connect_error

REGISTER_BATCH = 1000


class WriteBackError(Exception):
    """The fleet refused or failed a write-back (the message says which events)."""


@dataclasses.dataclass(frozen=True)
class WriteBackResult:
    registered: int  # new or changed aggregates registered now
    unchanged: int  # aggregates already registered with the same payload
    existing: int  # aggregate events found under the prefix in the window


def plan(
    aggregates: Iterable[Aggregate],
    prefix: Sequence[str],
    existing: dict[tuple[tuple[str, ...], int], str],
) -> tuple[list[RegisterEvent], int]:
    """The events to register (missing or changed) and how many were unchanged.

    `existing` maps (full event type, source timestamp us) to the payload text of the
    latest event already stored for it.
    """
    prefix = tuple(prefix)
    todo, unchanged = [], 0
    for agg in sorted(aggregates, key=lambda a: (a.bucket_start_us, a.type)):
        event_type = prefix + agg.type
        text = agg.payload_json()
        if existing.get((event_type, agg.bucket_start_us)) == text:
            unchanged += 1
            continue
        todo.append(
            RegisterEvent(
                event_type, timestamp_from_us(agg.bucket_start_us), EventPayloadJson(text)
            )
        )
    return todo, unchanged


async def fetch_existing(
    client, prefix: Sequence[str], span: Span, page_size: int = 10_000
) -> dict[tuple[tuple[str, ...], int], str]:
    """Latest payload text per (type, source timestamp) under `prefix` in `span`."""
    params = QueryTimeseriesParams(
        event_types=[(*prefix, "*")],
        source_t_from=timestamp_from_us(span.start),
        source_t_to=timestamp_from_us(span.end - 1),
        order=Order.ASCENDING,
        order_by=OrderBy.SOURCE_TIMESTAMP,
        max_results=page_size,
    )
    found: dict[tuple[tuple[str, ...], int], str] = {}
    while True:
        result = await client.query(params)
        # Ascending by (source timestamp, timestamp, server, session, instance): of
        # several events with one key the last one seen is the latest.
        for e in result.events:
            payload = e.payload
            text = payload.data if isinstance(payload, EventPayloadJson) else None
            found[(tuple(e.type), timestamp_to_us(e.source_timestamp))] = text
        if not (result.more_follows and result.events):
            return found
        params = params._replace(last_event_id=result.events[-1].id)


async def write_back(
    endpoint: Endpoint,
    aggregates: Sequence[Aggregate],
    prefix: Sequence[str],
    span: Span,
    *,
    client_name: str = "eventfleet-aggregate",
    token: str | None = None,
    timeout: float = 30.0,
    tls: ClientTls | None = None,
) -> WriteBackResult:
    """Register the missing or changed `aggregates` of `span` (see the module doc); with
    `tls` over TLS, the replica's certificate verified against its CA."""
    from eventfleet_server.client.eventer import connect

    context = tls.context() if tls is not None else None
    try:
        client = await connect(
            endpoint.host,
            endpoint.port,
            client_name,
            client_token=token,
            timeout=timeout,
            ssl=context,
        )
    except (OSError, TimeoutError) as e:
        raise WriteBackError(
            f"eventer {endpoint}: cannot connect for the write-back: {connect_error(e, tls)}"
        ) from e
    try:
        existing = await fetch_existing(client, prefix, span)
        todo, unchanged = plan(aggregates, prefix, existing)
        for i in range(0, len(todo), REGISTER_BATCH):
            batch = todo[i : i + REGISTER_BATCH]
            created = await client.register(batch, with_response=True)
            if created is None:
                raise WriteBackError(
                    f"eventer {endpoint} refused {len(batch)} aggregate events"
                    f" (first: {list(batch[0].type)} at {batch[0].source_timestamp})"
                )
    finally:
        await client.close()
    return WriteBackResult(len(todo), unchanged, len(existing))
