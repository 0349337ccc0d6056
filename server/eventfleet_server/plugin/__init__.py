"""The plug-in interface between the replica and its protocols.

A protocol is one package ``eventfleet_server/<name>/`` that ships ``schema.json`` (its
configuration section, defaults included), a typed ``CONFIG`` dataclass and a factory
``create(config, ctx) -> ProtocolServer``. `eventfleet_server.main` lists the packages in
one table; everything else (metrics, ``/status``, ``/readyz``, shutdown) iterates the
started protocols through this interface. See docs/architecture.md, "Adding a protocol".
"""

from __future__ import annotations

import pathlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from eventfleet_server.config import ReplicaConfig
from eventfleet_server.engine import Engine
from eventfleet_server.listener import Credentials, Tasks, TlsSettings

# An aiohttp request handler; typed loosely so this layer does not import aiohttp.
Handler = Callable[[Any], Awaitable[Any]]
Mount = Callable[..., Callable[[], None]]


@runtime_checkable
class ProtocolServer(Protocol):
    """What the replica needs from a started protocol."""

    name: str

    async def start(self) -> None:
        """Bind and start serving; raise (naming the address) if that fails."""

    async def stop(self) -> None:
        """Close listeners and sessions and await every task the protocol started."""

    @property
    def connection_count(self) -> int:
        """Open client or peer connections (``eventfleet_connections{protocol}``)."""

    @property
    def rejected(self) -> Mapping[str, int]:
        """Refusals by `RejectReason` value (``eventfleet_rejected_total``)."""

    def health(self) -> str | None:
        """None when this protocol does not hold readiness back, else the reason."""

    def describe(self) -> dict:
        """A JSON-able summary for ``/status`` (endpoints, sessions, ...)."""


@dataclass(frozen=True)
class ProtocolContext:
    """What a protocol factory gets besides its own configuration section.

    `mount(path, handler, method="GET") -> unmount` serves an HTTP route (websocket
    protocols) on the replica's HTTP server, so protocols never import ``http``.
    `peers()` is the current raw peer list. `core` is the replica's core configuration;
    `config_path` the file peers are reloaded from (None: no reload). `credentials` holds
    the current client and peer tokens (replaced on a token rotation; read them at each
    check rather than copying `token`, which is the first client token at start). `tls`:
    serve TLS on the protocol's listener when set (`tls.server_context()`).

    A protocol may also implement ``async prepare(engine) -> EventId | None``: it runs
    before the engine creates any id and may return the highest own id learned
    elsewhere (the Syncer's identity bootstrap).
    """

    engine: Engine
    host: str
    server_id: int
    data_dir: pathlib.Path
    token: str | None
    tasks: Tasks
    mount: Mount
    peers: Callable[[], list[dict]]
    core: ReplicaConfig
    config_path: pathlib.Path | None = None
    credentials: Credentials | None = None
    tls: TlsSettings | None = None  # listeners serve TLS with it when set
