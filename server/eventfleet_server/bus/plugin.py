"""The Event BUS's factory for the replica's protocol table."""

from __future__ import annotations

from eventfleet_server.bus.config import BusConfig
from eventfleet_server.bus.protocol import BusProtocol
from eventfleet_server.plugin import ProtocolContext

CONFIG = BusConfig


def create(config: BusConfig, ctx: ProtocolContext) -> BusProtocol:
    """The Event BUS of `ctx.engine` on `ctx.host`, ports `config.port` .. +2.

    With a fleet token (`ctx.token`) every socket requires ZAP PLAIN credentials whose
    password is a current client token, read at every handshake so that a token
    rotation needs no restart (docs/bus.md, "Authentication").
    """
    credentials = ctx.credentials
    tokens = (lambda: credentials.client) if credentials is not None else None
    token = ctx.token
    if token is None and credentials is not None and credentials.client:
        token = credentials.client[0]
    return BusProtocol(config, ctx.engine, ctx.host, token, ctx.tasks.child("bus"), tokens=tokens)
