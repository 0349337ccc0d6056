"""The Syncer plug-in: `Syncer`, what a replica runs for redundancy, and its factory.

Start order (driven by `eventfleet_server.main.Replica`): `start_server` (serve what
we hold, so peers that boot at the same time can bootstrap from us), `bootstrap`
(identity safety, before the engine creates any event), then `start_mesh` once the
engine runs. Read `state()`, `initial_sync_done` and `identity` at any time.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections.abc import Callable

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import EventId
from eventfleet_server.config import ConfigError
from eventfleet_server.engine import Engine
from eventfleet_server.listener import Credentials, TlsSettings, TokenPolicy
from eventfleet_server.plugin import ProtocolContext, ProtocolServer
from eventfleet_server.syncer.bootstrap import IdentityDecision, bootstrap_identity
from eventfleet_server.syncer.client import Peer, SyncerClientLimits
from eventfleet_server.syncer.config import SyncerConfig
from eventfleet_server.syncer.merger import Merger
from eventfleet_server.syncer.mesh import Mesh
from eventfleet_server.syncer.peers import PeerFileWatcher, parse_peers
from eventfleet_server.syncer.routes import FLUSH_PATH, FlushRoute, peer_metrics
from eventfleet_server.syncer.server import SyncerServer, SyncerServerLimits
from eventfleet_server.syncer.state import SyncStateRecorder, peer_state

log = logging.getLogger(__name__)


class Syncer(ProtocolServer):
    """The replica's Syncer server, its client mesh, identity bootstrap and sync state.

    Public API for status/health pages and the operator:

    - `state()` → one dict per configured peer (see `eventfleet_server.syncer.state`);
    - `initial_sync_done` → readiness: identity decided and every peer reachable at
      start-up caught up with once;
    - `identity` → the bootstrap decision as a dict (None until decided);
    - `await flush_peer(name, timeout)` → True once peer `name` confirmed it committed
      every event this replica has sent it (scale-down safety).
    """

    name = "syncer"

    def __init__(
        self,
        config: SyncerConfig,
        *,
        server_id: int,
        host: str,
        token: str | None,
        peers: list[dict],
        allow_empty_start: bool,
        config_path: pathlib.Path | None = None,
        tasks: Tasks,
        credentials: Credentials | None = None,
        tls: TlsSettings | None = None,
    ):
        # Mutual TLS: the listener requires a CA-signed client certificate, the links
        # verify the peer's certificate and host name and present ours.
        self._tls = tls
        self._config = config
        self._host = host
        # Peers present and accept the peer tokens (the client token when no separate
        # peer token is configured), read at each connection: rotation needs no restart.
        self._credentials = credentials if credentials is not None else Credentials.of(token)
        self._allow_empty_start = allow_empty_start
        self._config_path = config_path
        self._tasks = tasks.child("syncer")
        self.server_id: int = server_id
        parsed, own_name = parse_peers(peers, self.server_id)
        self._peers: list[Peer] = parsed
        self.client_name: str = config.client_name or own_name or f"server-{self.server_id}"
        self.initial_sync_done = False
        self.identity: dict | None = None
        self.engine: Engine | None = None
        self.server: SyncerServer | None = None
        self.mesh: Mesh | None = None
        self.merger: Merger | None = None
        self._watcher: PeerFileWatcher | None = None
        self._initial_task: asyncio.Task | None = None
        self._withdraw: list[Callable[[], None]] = []

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def peers(self) -> list[Peer]:
        return list(self._peers)

    @property
    def connection_count(self) -> int:
        """Peer connections served (incoming Syncer clients), for metrics."""
        return len(self.server.sessions()) if self.server else 0

    @property
    def rejected(self) -> dict[str, int]:
        """Refused connections/messages of the Syncer server by reason, for metrics."""
        return dict(self.server.rejected) if self.server else {}

    def health(self) -> str | None:
        """Readiness: a replica that starts empty must catch up before serving."""
        return None if self.initial_sync_done else "initial sync with the peers is not done"

    def describe(self) -> dict:
        return {
            "port": self.server.port if self.server else None,
            "connections": self.connection_count,
            "client_name": self.client_name,
        }

    # -- the plug-in lifecycle ------------------------------------------------------------

    def contribute(self, ctx: ProtocolContext) -> None:
        """Mount ``POST /flush`` and add the per-peer metrics on the replica's HTTP server
        (`eventfleet_server.syncer.routes`); `withdraw` takes them back."""
        self._withdraw = [
            ctx.mount_json(
                FLUSH_PATH, FlushRoute(self, lambda: ctx.engine.storage.last_ids), method="POST"
            ),
            ctx.add_metrics(lambda: peer_metrics(self)),
        ]

    def withdraw(self) -> None:
        """Unmount what `contribute` mounted."""
        for undo in self._withdraw:
            undo()
        self._withdraw = []

    async def prepare(self, engine: Engine) -> EventId | None:
        """Before the engine creates ids: serve our store, then learn our own last id."""
        await self.start_server(engine)
        return await self.bootstrap()

    async def start(self) -> None:
        """Once the engine is operational: the client mesh and the peer-list watcher."""
        self.start_mesh(self._config_path)

    # -- start-up -----------------------------------------------------------------------

    async def start_server(self, engine: Engine) -> None:
        """Serve this replica's store to peers (before the engine starts)."""
        s = self._config
        self.engine = engine
        self.merger = Merger(
            engine,
            max_queued_events=s.max_queued_events,
            committed_cb=lambda events: self.mesh.on_committed(events),
        )
        self.mesh = Mesh(
            engine,
            self.merger,
            client_name=self.client_name,
            token=lambda: self._credentials.peer_token,
            subscriptions=[tuple(p) for p in s.subscriptions],
            limits=SyncerClientLimits(max_msg_size=s.max_msg_size),
            reconnect_min_delay=s.reconnect_min_delay,
            reconnect_max_delay=s.reconnect_max_delay,
            state_cb=SyncStateRecorder(engine),
            tasks=self._tasks,
            max_server_ids=s.max_known_server_ids,
            ssl=self._tls.peer_client_context() if self._tls else None,
        )
        self.mesh.peers = list(self._peers)
        await self.mesh.load_named_ids()
        self.merger.start(self._tasks)
        self.server = SyncerServer(
            engine,
            self._host,
            s.port,
            token=lambda: TokenPolicy(self._credentials.peer, refuse_unexpected=True),
            known_server_ids=self.mesh.known_server_ids,
            limits=SyncerServerLimits(max_buffered_events=s.max_buffered_events),
            admission=s.admission.limits(s.max_msg_size),
            ssl=self._tls.server_context(client_certificates=True) if self._tls else None,
            tasks=self._tasks,
        )
        await self.server.start()

    async def bootstrap(self) -> EventId | None:
        """Identity safety (see `eventfleet_server.syncer.bootstrap`).

        Returns the highest own id to continue after (None: a new identity).
        """
        assert self.engine is not None and self.mesh is not None
        mesh = self.mesh
        decision: IdentityDecision = await bootstrap_identity(
            server_id=self.server_id,
            storage=self.engine.storage,
            peers=lambda: list(self._peers),
            make_stream=lambda peer, sid: mesh.make_stream(peer, sid, None),
            timeout=self._config.bootstrap_timeout,
            grace=self._config.bootstrap_grace,
            allow_empty_start=self._allow_empty_start,
        )
        self.identity = decision.as_dict()
        return decision.learned_last

    def start_mesh(self, config_path: pathlib.Path | None = None) -> None:
        """Start a client per peer; watch `config_path` for peer list changes."""
        assert self.mesh is not None
        self.mesh.start()
        self._initial_task = self._tasks.spawn("initial-sync", self._initial_sync(), critical=False)
        if config_path is not None:
            self._watcher = PeerFileWatcher(
                config_path, self._config.reload_interval, self.set_peers
            )
            self._watcher.start(self._tasks)
            # The watcher's baseline is the file as it is now, but this process read its
            # peers at start: a ConfigMap rewritten in between (and a SIGHUP that came
            # before the watcher existed) would otherwise never be applied.
            raw = self._watcher.read_peers()
            if raw is not None and self._differs(raw):
                log.info("peer list changed while starting; applying %s", config_path)
                self.set_peers(raw)

    def _differs(self, raw: list[dict]) -> bool:
        try:
            peers, _ = parse_peers(raw, self.server_id)
        except ConfigError:
            return True  # set_peers logs the error and keeps the current peers
        return peers != self._peers

    async def _initial_sync(self) -> None:
        mesh = self.mesh
        started = time.monotonic()
        links = list(mesh.links.values())

        def done() -> bool:
            return all(
                link.ever_synced or link.last_error is not None or link not in mesh.links.values()
                for link in links
            )

        await mesh.wait_for(done)
        self.initial_sync_done = True
        log.info(
            "initial sync done in %.2f s: synced with %s%s",
            time.monotonic() - started,
            [link.peer.name for link in links if link.ever_synced],
            "; unreachable: "
            + str({link.peer.name: link.last_error for link in links if not link.ever_synced})
            if any(not link.ever_synced for link in links)
            else "",
        )

    # -- peers --------------------------------------------------------------------------

    def set_peers(self, raw: list[dict]) -> None:
        """Apply a new raw ``peers`` list (already schema-validated)."""
        try:
            peers, own_name = parse_peers(raw, self.server_id)
        except ConfigError as e:
            log.error("peer list ignored, keeping the current peers: %s", e)
            return
        if own_name and own_name != self.client_name and not self._config.client_name:
            log.warning(
                "own peer entry is now named %r; this process keeps the name %r until restart",
                own_name,
                self.client_name,
            )
        old = {p.name for p in self._peers}
        new = {p.name for p in peers}
        log.info(
            "peers: %s (added %s, removed %s)",
            sorted(new),
            sorted(new - old),
            sorted(old - new),
        )
        self._peers = peers
        if self.mesh is not None:
            self.mesh.set_peers(peers)

    def reload(self, reason: str = "SIGHUP") -> None:
        """Re-read the peer list from the configuration file now."""
        if self._watcher is None:
            log.warning("peer reload (%s): no configuration file to read", reason)
            return
        self._watcher.reload(reason)

    # -- the API ------------------------------------------------------------------------

    def peer_states(self) -> list[dict]:
        """The plug-in interface's view of `state()` (``/status`` peers, backups)."""
        return self.state()

    def state(self) -> list[dict]:
        """Per configured peer: name, server_id, state, last_event_id, lag_events,
        lag_seconds (and address, since, events_received, connects, last_error)."""
        if self.mesh is None or self.engine is None or not self.mesh.links:
            return [
                {
                    "name": p.name,
                    "server_id": p.server_id,
                    "address": p.address,
                    "state": "disconnected",
                    "since": None,
                    "last_event_id": None,
                    "lag_events": None,
                    "lag_seconds": None,
                    "events_received": 0,
                    "connects": 0,
                    "last_error": None,
                }
                for p in self._peers
            ]
        held = self.engine.storage.last_ids
        return [
            peer_state(link, held.get(link.peer.server_id)) for link in self.mesh.links.values()
        ]

    async def flush_peer(self, name: str, timeout: float) -> bool:
        """Prove that peer `name` holds every event this replica has sent it.

        Commits this replica's pending registrations, then sends ``MsgFlushReq`` on
        every connection the peer has open to this replica (once it is past
        ``MsgSynced``) and waits for ``MsgFlushRes``, which the peer sends only after
        committing. True when all answered within `timeout`, False otherwise.
        Raises `KeyError` for a name that is not a configured peer and
        `ConnectionError` when the peer has no connection to this replica.
        """
        peer = next((p for p in self._peers if p.name == name), None)
        if peer is None:
            raise KeyError(name)
        if self.server is None or self.engine is None:
            raise ConnectionError("the Syncer is not running")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout(timeout):
                await self.engine.flush()
        except TimeoutError:
            return False
        names = {name, f"server-{peer.server_id}"}
        result = await self.server.flush_client(names, max(deadline - loop.time(), 0.0))
        if result is None:
            raise ConnectionError(f"peer {name!r} has no stream of this replica's events open")
        log.info("flush of peer=%s: %s", name, "confirmed" if result else "not confirmed")
        return result

    # -- shutdown -----------------------------------------------------------------------

    async def stop(self, flush_timeout: float | None = None) -> None:
        """Ask connected peers to confirm they hold what we sent, then close everything."""
        timeout = self._config.shutdown_flush_timeout if flush_timeout is None else flush_timeout
        if self._watcher:
            await self._watcher.stop()
        if self._initial_task:
            self._initial_task.cancel()
        if self.server is not None and timeout > 0:
            results = await self.server.flush_all(timeout)
            if results:
                log.info(
                    "shutdown flush: confirmed by %d of %d peer connections%s",
                    sum(results.values()),
                    len(results),
                    f"; unconfirmed: {[k for k, v in results.items() if not v]}"
                    if not all(results.values())
                    else "",
                )
        if self.server is not None:
            await self.server.stop()
        if self.mesh is not None:
            await self.mesh.stop()
        if self.merger is not None:
            await self.merger.stop()
        await self._tasks.close()


CONFIG = SyncerConfig


def create(config: SyncerConfig, ctx: ProtocolContext) -> Syncer:
    """The Syncer server, its client mesh and identity bootstrap for this replica."""
    syncer = Syncer(
        config,
        server_id=ctx.server_id,
        host=ctx.host,
        token=ctx.token,
        peers=ctx.peers(),
        allow_empty_start=ctx.core.allow_empty_start,
        config_path=ctx.config_path,
        tasks=ctx.tasks,
        credentials=ctx.credentials,
        tls=ctx.tls,
    )
    syncer.contribute(ctx)
    return syncer
