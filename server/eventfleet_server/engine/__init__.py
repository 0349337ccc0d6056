"""The engine: the hub every protocol talks to.

It assigns event ids and timestamps, batches registrations into group commits, serves
queries from storage and fans events out to protocol listeners. Protocols never talk
to each other; they register listeners here.
"""

from eventfleet_server.engine.engine import (
    Engine,
    EngineError,
    Listener,
    NotOperationalError,
    RegisterError,
)

__all__ = ["Engine", "EngineError", "Listener", "NotOperationalError", "RegisterError"]
