"""The Event BUS's factory for the replica's protocol table."""

from __future__ import annotations

from eventfleet_server.bus.config import BusConfig
from eventfleet_server.bus.protocol import BusProtocol
from eventfleet_server.plugin import ProtocolContext

CONFIG = BusConfig


def create(config: BusConfig, ctx: ProtocolContext) -> BusProtocol:
    """The Event BUS of `ctx.engine` on `ctx.host`, ports `config.port` .. +2.

    With a fleet token (`ctx.token`) every socket requires ZAP PLAIN credentials whose
    password is the token (docs/bus.md, "Authentication").
    """
    return BusProtocol(config, ctx.engine, ctx.host, ctx.token, ctx.tasks.child("bus"))
