"""Jetstream: Uber's model/scope synchronisation protocol over websockets, on events.

A scope is the event subtree ``<type_prefix> + ['jetstream', <scope>]``; a model is the
latest event of ``[..., <clsName>, <uuid>]`` with its properties as JSON payload. The
wire protocol (`protocol`, `wire`, `scope`, `models`) is engine-free; `adapter` is the
thin link to the engine and `server` the websocket endpoint. See docs/jetstream.md.
"""

from __future__ import annotations

import importlib.resources
import json

from eventfleet_server.jetstream.config import JetstreamConfig

SCHEMA = json.loads((importlib.resources.files(__package__) / "schema.json").read_text())
CONFIG = JetstreamConfig


def create(config: JetstreamConfig, ctx):
    """The `ProtocolServer` for a replica (see SCAFFOLD_CONTRACT.md)."""
    from eventfleet_server.jetstream.server import JetstreamServer

    return JetstreamServer(config, ctx)


__all__ = ["CONFIG", "SCHEMA", "JetstreamConfig", "create"]
