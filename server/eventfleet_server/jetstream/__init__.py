"""Jetstream: Uber's model/scope synchronisation protocol over websockets, on events.

A scope is the event subtree ``<type_prefix> + ['jetstream', <scope>]``; a model is the
latest event of ``[..., <clsName>, <uuid>]`` with its properties as JSON payload. The
wire protocol (`session`, `wire`, `scope`, `models`) is engine-free; `adapter` is the
thin link to the engine, `server` the websocket endpoint and `plugin` the factory for
the replica's protocol table. See docs/jetstream.md.
"""
