"""Eventer: the Hat client protocol (server side and the project's own client)."""

from eventfleet_server.eventer.client import Client, EventerInitError, connect
from eventfleet_server.eventer.server import EventerLimits, EventerServer

__all__ = ["Client", "EventerInitError", "EventerLimits", "EventerServer", "connect"]
