"""The Replication protocol's factory for the replica's protocol table."""

from __future__ import annotations

from eventfleet_server.plugin import ProtocolContext
from eventfleet_server.replication.config import ReplicationConfig
from eventfleet_server.replication.server import ReplicationServer

CONFIG = ReplicationConfig


def create(config: ReplicationConfig, ctx: ProtocolContext) -> ReplicationServer:
    """The replication `ProtocolServer` for one replica: the publisher endpoint mounted on
    the replica's HTTP server and one replicator per configured upstream."""
    return ReplicationServer(config, ctx)
