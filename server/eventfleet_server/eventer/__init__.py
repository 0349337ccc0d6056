"""Eventer: the Hat client protocol, server side.

The project's Eventer client is `eventfleet_server.client.eventer` (outside this package,
so that importing it does not import the server, the engine and storage).
"""

from eventfleet_server.eventer.server import EventerLimits, EventerServer

__all__ = ["EventerLimits", "EventerServer"]
