"""The Event BUS's factory for the replica's protocol table."""

from __future__ import annotations

from eventfleet_server.bus.config import BusConfig, CurveError
from eventfleet_server.bus.curve import BusCurve
from eventfleet_server.bus.protocol import BusProtocol
from eventfleet_server.plugin import ProtocolContext

CONFIG = BusConfig


def create(config: BusConfig, ctx: ProtocolContext) -> BusProtocol:
    """The Event BUS of `ctx.engine` on `ctx.host`, ports `config.port` .. +2.

    With a fleet token (`ctx.token`) every socket requires ZAP PLAIN credentials whose
    password is a current client token, read at every handshake so that a token
    rotation needs no restart (docs/bus.md, "Authentication"). With ``bus.curve`` on,
    the sockets are CURVE servers instead (`eventfleet_server.bus.curve`); their key
    files are re-read on SIGHUP and every ``token_reload_interval``.
    """
    credentials = ctx.credentials
    tokens = (lambda: credentials.client) if credentials is not None else None
    token = ctx.token
    if token is None and credentials is not None and credentials.client:
        token = credentials.client[0]
    curve = None
    if config.curve.enabled:
        if config.curve.plain_port is not None and token is None:
            raise CurveError(
                f"bus.curve.plain_port: {config.curve.plain_port} needs a client token "
                "(PLAIN's password); none is configured"
            )
        curve = BusCurve(config.curve, tokens)
    return BusProtocol(
        config,
        ctx.engine,
        ctx.host,
        token,
        ctx.tasks.child("bus"),
        tokens=tokens,
        curve=curve,
        reload_interval=ctx.core.token_reload_interval,
    )
