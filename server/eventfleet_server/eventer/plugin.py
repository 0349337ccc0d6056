"""The Eventer protocol's factory for the replica's protocol table."""

from __future__ import annotations

from eventfleet_server.eventer.config import EventerConfig
from eventfleet_server.eventer.server import EventerLimits, EventerServer
from eventfleet_server.eventer.wire import RegisterLimits
from eventfleet_server.listener import Credentials, TokenPolicy, parse_networks
from eventfleet_server.plugin import ProtocolContext

CONFIG = EventerConfig


def create(config: EventerConfig, ctx: ProtocolContext) -> EventerServer:
    """An Eventer server for `ctx.engine` on `ctx.host`:`config.port`."""
    credentials = ctx.credentials if ctx.credentials is not None else Credentials.of(ctx.token)
    # Validated here so that a bad entry stops the start naming it.
    networks = parse_networks(config.tokenless_client_networks)

    def tokens() -> TokenPolicy:
        # Built per init from the current credentials: a rotation applies at once.
        return TokenPolicy(
            credentials.client,
            allow_missing=config.allow_tokenless_clients,
            refuse_unexpected=True,
            missing_from=networks,
        )

    return EventerServer(
        ctx.engine,
        ctx.host,
        config.port,
        tokens=tokens,
        limits=EventerLimits(
            max_queued_events=config.max_queued_events,
            ack_every=config.ack_every,
            ack_window=config.ack_window,
            max_write_buffer=config.max_write_buffer,
            send_timeout=config.send_timeout,
            register=RegisterLimits(
                max_events=config.max_events_per_request,
                max_payload_bytes=config.max_payload_bytes,
                max_type_segments=config.max_type_segments,
                max_segment_length=config.max_segment_length,
            ),
            max_latest_results=config.max_latest_results,
        ),
        admission=config.admission.limits(config.max_msg_size),
        tasks=ctx.tasks.group("eventer"),
        ssl=ctx.tls.server_context() if ctx.tls else None,
    )
