"""The Eventer protocol's factory for the replica's protocol table."""

from __future__ import annotations

from eventfleet_server.eventer.config import EventerConfig
from eventfleet_server.eventer.server import EventerLimits, EventerServer
from eventfleet_server.listener import TokenPolicy
from eventfleet_server.plugin import ProtocolContext

CONFIG = EventerConfig


def create(config: EventerConfig, ctx: ProtocolContext) -> EventerServer:
    """An Eventer server for `ctx.engine` on `ctx.host`:`config.port`."""
    return EventerServer(
        ctx.engine,
        ctx.host,
        config.port,
        tokens=TokenPolicy.of(ctx.token, allow_missing=True, refuse_unexpected=True),
        limits=EventerLimits(
            max_queued_events=config.max_queued_events,
            ack_every=config.ack_every,
            ack_window=config.ack_window,
        ),
        admission=config.admission.limits(config.max_msg_size),
    )
