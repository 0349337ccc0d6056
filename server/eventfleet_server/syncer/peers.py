"""The peer list: parsing, validation and live reload from the configuration file.

A fleet can hand every replica the same list (the operator's ConfigMap, the local
fleet's files): the entry with this replica's own server id is skipped, and its name
becomes the ``clientName`` this replica uses towards its peers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import pathlib
from collections.abc import Callable, Mapping, Sequence

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.config import ConfigError, load_file
from eventfleet_server.syncer.client import Peer

log = logging.getLogger(__name__)


def parse_peers(raw: Sequence[Mapping], own_server_id: int) -> tuple[list[Peer], str | None]:
    """Peers other than ourselves, and our own name if the list holds our entry.

    Raises `ConfigError` naming a duplicate name or server id.
    """
    peers: list[Peer] = []
    own_name: str | None = None
    names: set[str] = set()
    ids: set[int] = set()
    for i, entry in enumerate(raw):
        peer = Peer(
            entry["name"],
            entry["host"],
            int(entry["port"]),
            int(entry["server_id"]),
            entry.get("tls_server_name"),
        )
        if peer.name in names:
            raise ConfigError(f"peers[{i}]: name {peer.name!r} appears twice")
        if peer.server_id in ids:
            raise ConfigError(f"peers[{i}] ({peer.name}): server_id {peer.server_id} appears twice")
        names.add(peer.name)
        ids.add(peer.server_id)
        if peer.server_id == own_server_id:
            own_name = peer.name
            continue
        peers.append(peer)
    return peers, own_name


class PeerFileWatcher:
    """Polls the configuration file and calls `on_change(raw peers)` when it changes.

    Content is compared (not the mtime alone): kubelet swaps a ConfigMap volume through
    a symlink, which need not change the mtime the way an editor does.
    """

    def __init__(
        self, path: pathlib.Path, interval: float, on_change: Callable[[list[dict]], None]
    ):
        self._path = pathlib.Path(path)
        self._interval = interval
        self._on_change = on_change
        self._digest = self._read_digest()
        self._task: asyncio.Task | None = None

    def _read_digest(self) -> str | None:
        try:
            return hashlib.sha256(self._path.read_bytes()).hexdigest()
        except OSError:
            return None

    def start(self, tasks: Tasks) -> None:
        self._tasks = tasks.child("peer-watcher")
        self._task = self._tasks.spawn("poll", self._loop())

    async def stop(self) -> None:
        if self._task:
            await self._tasks.close()
            self._task = None

    def read_peers(self) -> list[dict] | None:
        """The file's raw ``peers`` now (None if it cannot be read or parsed)."""
        try:
            return list(load_file(self._path).get("peers", []))
        except ConfigError as e:
            log.error("peer list in %s not readable: %s", self._path, e)
            return None

    def reload(self, reason: str) -> None:
        """Read the file now (SIGHUP, or a change seen by polling)."""
        self._digest = self._read_digest()
        try:
            conf = load_file(self._path)
        except ConfigError as e:
            log.error("peer reload (%s) ignored, keeping the current peers: %s", reason, e)
            return
        log.info("peer reload (%s) from %s", reason, self._path)
        self._on_change(list(conf.get("peers", [])))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            digest = self._read_digest()
            if digest is not None and digest != self._digest:
                self.reload("file changed")
