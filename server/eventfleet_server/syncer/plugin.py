"""The Syncer protocol's factory for the replica's protocol table."""

from __future__ import annotations

from eventfleet_server.plugin import ProtocolContext
from eventfleet_server.syncer.config import SyncerConfig
from eventfleet_server.syncer.service import Syncer

CONFIG = SyncerConfig


def create(config: SyncerConfig, ctx: ProtocolContext) -> Syncer:
    """The Syncer server, its client mesh and identity bootstrap for this replica."""
    return Syncer(
        config,
        server_id=ctx.server_id,
        host=ctx.host,
        token=ctx.token,
        peers=ctx.peers(),
        allow_empty_start=ctx.core.allow_empty_start,
        config_path=ctx.config_path,
        tasks=ctx.tasks,
        credentials=ctx.credentials,
        tls=ctx.tls,
    )
