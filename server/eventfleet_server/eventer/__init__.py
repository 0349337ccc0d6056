"""Eventer: the Hat client protocol, server side.

Rooms: `wire` (requests and replies from and to bytes, bounded and chunked), `session`
(one client connection: notifies with flow control, register, query), `server` (the
chatter listener and the fan-out), `config`, `plugin` (the factory for the replica's
protocol table).

The project's Eventer client is `eventfleet_server.client.eventer` (outside this package,
so that importing it does not import the server, the engine and storage).
"""

from eventfleet_server.eventer.server import EventerLimits, EventerServer

__all__ = ["EventerLimits", "EventerServer"]
