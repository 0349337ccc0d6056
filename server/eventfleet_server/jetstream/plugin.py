"""The Jetstream protocol's factory for the replica's protocol table."""

from __future__ import annotations

from eventfleet_server.jetstream.config import JetstreamConfig
from eventfleet_server.jetstream.server import JetstreamServer
from eventfleet_server.plugin import ProtocolContext

CONFIG = JetstreamConfig


def create(config: JetstreamConfig, ctx: ProtocolContext) -> JetstreamServer:
    """A Jetstream endpoint at `config.path` on the replica's HTTP server."""
    return JetstreamServer(config, ctx)
