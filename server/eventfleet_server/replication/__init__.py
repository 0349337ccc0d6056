"""Replication: innovaphone's AppWebsocket table replication, as publisher and replicator.

Modules: `codec` (framing), `login` (challenge/digest, credentials, failed-login
limit), `table` (row index and the table <-> event mapping), `publisher` (one
connection's protocol logic, engine-free), `replicator` (the client role), `adapter`
(the engine side), `server` (the websocket endpoint and the `ProtocolServer`).
See docs/replication.md.
"""

from __future__ import annotations

from typing import Any

from eventfleet_server.replication.config import SCHEMA, ReplicationConfig
from eventfleet_server.replication.server import ReplicationServer

CONFIG = ReplicationConfig

__all__ = ["CONFIG", "SCHEMA", "ReplicationConfig", "ReplicationServer", "create"]


def create(config: ReplicationConfig, ctx: Any) -> ReplicationServer:
    """The replication `ProtocolServer` for one replica (`ctx`: a ProtocolContext)."""
    return ReplicationServer(config, ctx)
