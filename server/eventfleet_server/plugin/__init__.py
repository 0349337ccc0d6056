"""The plug-in interface between the replica and its protocols.

A protocol is one package ``eventfleet_server/<name>/`` that ships ``schema.json`` (its
configuration section, defaults included), a typed ``CONFIG`` dataclass and a factory
``create(config, ctx) -> ProtocolServer``. `eventfleet_server.main` lists the packages in
one table; everything else (metrics, ``/status``, ``/readyz``, shutdown) iterates the
started protocols through this interface. See docs/architecture.md, "Adding a protocol".
"""

from __future__ import annotations

import abc
import pathlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import EventId
from eventfleet_server.config import ReplicaConfig
from eventfleet_server.engine import Engine
from eventfleet_server.listener import Credentials, TlsSettings

# An aiohttp request handler; typed loosely so this layer does not import aiohttp.
Handler = Callable[[Any], Awaitable[Any]]
Mount = Callable[..., Callable[[], None]]


@dataclass(frozen=True)
class JsonRequest:
    """What a JSON route (`ProtocolContext.mount_json`) sees of an HTTP request:
    the query parameters and whether the caller presented the peer/admin token."""

    query: Mapping[str, str]
    admin: bool


# (status, JSON-able document) for one request.
JsonHandler = Callable[[JsonRequest], Awaitable[tuple[int, Any]]]
MountJson = Callable[..., Callable[[], None]]
# Scrape-time metric families (prometheus_client ``Metric`` objects) of one protocol.
MetricsSource = Callable[[], Iterable[Any]]
AddMetrics = Callable[[MetricsSource], Callable[[], None]]


class ProtocolServer(abc.ABC):
    """What the replica needs from a protocol: the one declared plug-in interface.

    Every protocol's plug-in subclasses it (a missing method fails at creation, naming
    it). `prepare` and `reload` have defaults (nothing to do); the rest is abstract.
    Routes and metrics are not methods here: a protocol contributes them through the
    `ProtocolContext` (`mount`, `mount_json`, `add_metrics`) when it is created.
    """

    name: str

    async def prepare(self, engine: Engine) -> EventId | None:
        """Runs before the engine creates any id; may return the highest own id learned
        elsewhere (the Syncer's identity bootstrap). Default: nothing learned."""
        return None

    @abc.abstractmethod
    async def start(self) -> None:
        """Bind and start serving; raise (naming the address) if that fails."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Close listeners and sessions and await every task the protocol started."""

    def reload(self, reason: str) -> None:  # noqa: B027 - optional hook, no-op by default
        """Re-read what can change without a restart (SIGHUP, a changed token file);
        `reason` is for the log. Default: nothing to re-read."""

    @property
    @abc.abstractmethod
    def connection_count(self) -> int:
        """Open client or peer connections (``eventfleet_connections{protocol}``)."""

    @property
    @abc.abstractmethod
    def rejected(self) -> Mapping[str, int]:
        """Refusals by `RejectReason` value (``eventfleet_rejected_total``)."""

    @abc.abstractmethod
    def health(self) -> str | None:
        """None when this protocol does not hold readiness back, else the reason."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """A JSON-able summary for ``/status`` (endpoints, sessions, ...)."""

    # Whether the catch-up with the replica's peers at start-up is done (the
    # ``eventfleet_initial_sync_done`` gauge is 1 when every protocol says so). An
    # attribute, so a protocol with peers sets it when done; default: nothing to catch up.
    initial_sync_done: bool = True

    def peer_states(self) -> list[dict]:
        """One dict per replication peer (keys: ``peers[]`` in ``/status``,
        docs/observability.md), read by ``/status``, the backup's sync check and the
        metrics. Default: no peers."""
        return []


@dataclass(frozen=True)
class ProtocolContext:
    """What a protocol factory gets besides its own configuration section.

    Routes and metrics: `mount(path, handler, method="GET") -> unmount` serves an aiohttp
    handler (websocket protocols, which import aiohttp themselves);
    `mount_json(path, handler, method="POST") -> unmount` serves a `JsonHandler`, for
    protocols that must not import aiohttp (the Syncer's ``POST /flush``);
    `add_metrics(source) -> remove` adds scrape-time metric families to ``/metrics``.
    All three go to the replica's HTTP server, so protocols never import ``http``.
    `peers()` is the current raw peer list. `core` is the replica's core configuration;
    `config_path` the file peers are reloaded from (None: no reload). `credentials` holds
    the current client and peer tokens (replaced on a token rotation; read them at each
    check rather than copying `token`, which is the first client token at start). `tls`:
    serve TLS on the protocol's listener when set (`tls.server_context()`).
    """

    engine: Engine
    host: str
    server_id: int
    data_dir: pathlib.Path
    token: str | None
    tasks: Tasks
    mount: Mount
    mount_json: MountJson
    add_metrics: AddMetrics
    peers: Callable[[], list[dict]]
    core: ReplicaConfig
    config_path: pathlib.Path | None = None
    credentials: Credentials | None = None
    tls: TlsSettings | None = None  # listeners serve TLS with it when set
