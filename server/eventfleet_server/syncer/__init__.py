"""Syncer: replication between replicas (HatSyncer over Hat Chatter), full mesh.

Rooms: `protocol` (messages), `server` (serve our store), `client` (one stream of one
server id from one peer), `merger` (one commit queue for all streams), `mesh` (which
streams to run per peer), `bootstrap` (identity safety), `peers` (peer list and live
reload), `state` (observable sync state), `service` (the `Syncer` a replica runs).
See docs/syncer.md.
"""

from eventfleet_server.syncer.client import Peer, SyncStream
from eventfleet_server.syncer.server import SyncerServer, SyncerServerLimits
from eventfleet_server.syncer.service import Syncer

__all__ = ["Peer", "SyncStream", "Syncer", "SyncerServer", "SyncerServerLimits"]
