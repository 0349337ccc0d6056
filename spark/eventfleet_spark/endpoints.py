"""Replica endpoints as the job's arguments name them (no dependencies: the CLI parser
imports this)."""

from __future__ import annotations

from typing import NamedTuple

TOKEN_ENV = "EVENTFLEET_TOKEN"
"""Environment variable with the Eventer token (the operator sets it from the Secret on
the driver and on every executor)."""


class Endpoint(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(text: str, what: str = "eventer") -> list[Endpoint]:
    """``HOST:PORT[,HOST:PORT...]`` → endpoints; `ValueError` naming the bad entry."""
    out = []
    for item in text.split(","):
        item = item.strip()
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{what} address {item!r} is not HOST:PORT")
        out.append(Endpoint(host or "127.0.0.1", int(port)))
    return out


def http_endpoints(text: str | None) -> tuple[Endpoint, ...]:
    """The ``http`` option (job ``--http``, data source ``http``): the replicas' HTTP
    endpoints for ``GET /export``; None means none (read over Eventer only)."""
    return () if text is None else tuple(parse_endpoints(text, "http"))
