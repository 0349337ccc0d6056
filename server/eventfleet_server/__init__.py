"""eventfleet replica: one asyncio process storing events and serving them.

Rooms: ``common`` (model, subscriptions, SBS), ``storage`` (SQLite), ``engine``
(ids, batching, fan-out; the hub), one package per protocol, ``config`` and ``main``.
Protocols depend on the engine and never on each other.
"""
