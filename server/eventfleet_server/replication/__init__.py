"""Replication: innovaphone's AppWebsocket table replication, as publisher and replicator.

Modules: `wire` (framing), `login` (challenge/digest, credentials, failed-login
limit), `table` (row index and the table <-> event mapping), `session` (one publisher
connection's protocol logic, engine-free), `replicator` (the client role), `adapter`
(the engine side), `server` (the websocket endpoint and the `ProtocolServer`), `plugin`
(the factory for the replica's protocol table). See docs/replication.md.
"""

from __future__ import annotations

from eventfleet_server.replication.config import SCHEMA, ReplicationConfig
from eventfleet_server.replication.plugin import CONFIG, create
from eventfleet_server.replication.server import ReplicationServer

__all__ = ["CONFIG", "SCHEMA", "ReplicationConfig", "ReplicationServer", "create"]
