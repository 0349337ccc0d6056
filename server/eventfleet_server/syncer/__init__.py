"""Syncer: replication between replicas (HatSyncer over Hat Chatter), full mesh.

Rooms: `wire` (messages), `server` (serve our store), `session` (one served client
connection), `client` (one stream of one server id from one peer), `merger` (one commit
queue for all streams), `mesh` (which streams to run per peer), `bootstrap` (identity
safety), `peers` (peer list and live reload), `state` (observable sync state), `plugin`
(the `Syncer` a replica runs, and its factory).
See docs/syncer.md.
"""

from eventfleet_server.syncer.client import Peer, SyncStream
from eventfleet_server.syncer.plugin import Syncer
from eventfleet_server.syncer.server import SyncerServer, SyncerServerLimits

__all__ = ["Peer", "SyncStream", "Syncer", "SyncerServer", "SyncerServerLimits"]
