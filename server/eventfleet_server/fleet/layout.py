"""Where each replica of a local fleet lives: ports, directories, configuration files.

Replica ``i`` (1-based) gets server id ``i``, name ``replica-i`` and the port block
starting at ``base_port + 10 * (i - 1)``:

====== ========================================================
offset endpoint
====== ========================================================
+0     Eventer
+1     Syncer
+2..+4 reserved for the Event BUS (not implemented in this version)
+5     HTTP (metrics, health, status)
====== ========================================================

With the default base port 23012, replica 1 answers Eventer on 23012 and Syncer on
23013, the single-replica defaults. Offsets +2..+4 stay reserved so the layout does not
change when the Event BUS arrives; nothing listens there, and they are neither printed
nor checked.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import socket
import time
from dataclasses import dataclass

import yaml

BLOCK = 10
DEFAULT_BASE_PORT = 23012
MAX_REPLICAS = 100
STATE_FILE = "fleet.json"


class FleetError(Exception):
    """Bad fleet input; the message names the value."""


@dataclass(frozen=True)
class ReplicaLayout:
    index: int
    host: str
    base_port: int
    data_dir: pathlib.Path

    @property
    def name(self) -> str:
        return f"replica-{self.index}"

    @property
    def server_id(self) -> int:
        return self.index

    @property
    def eventer_port(self) -> int:
        return self.base_port

    @property
    def syncer_port(self) -> int:
        return self.base_port + 1

    @property
    def bus_port(self) -> int:
        """Reserved for the Event BUS (not implemented in this version); never listened on."""
        return self.base_port + 2

    @property
    def http_port(self) -> int:
        return self.base_port + 5

    @property
    def config_path(self) -> pathlib.Path:
        return self.data_dir / "config.yaml"

    @property
    def log_path(self) -> pathlib.Path:
        return self.data_dir / "replica.log"

    def endpoints(self) -> dict[str, str]:
        """What actually listens (the reserved Event BUS ports are left out)."""
        h = self.host
        return {
            "eventer": f"{h}:{self.eventer_port}",
            "syncer": f"{h}:{self.syncer_port}",
            "http": f"{h}:{self.http_port}",
        }

    def jetstream(self) -> dict[str, str]:
        """Jetstream's websocket and its demo page, on the HTTP port (not ports of their own)."""
        base = f"{self.host}:{self.http_port}/jetstream"
        return {"jetstream": f"ws://{base}", "jetstream_demo": f"http://{base}/demo"}

    def ports(self) -> dict[str, int]:
        return {k: int(v.rsplit(":", 1)[1]) for k, v in self.endpoints().items()}


@dataclass(frozen=True)
class FleetPlan:
    replicas: list[ReplicaLayout]
    data_dir: pathlib.Path
    host: str
    base_port: int
    new_fleet: bool  # no fleet.json yet: first boot, replicas may start empty
    token_file: pathlib.Path
    # Tables published over Replication (docs/replication.md); empty: Replication is off.
    replication_tables: tuple[str, ...] = ()
    jetstream: bool = True  # Jetstream (and its demo page) on every replica's HTTP port


def plan(
    replicas: int,
    data_dir: pathlib.Path,
    *,
    base_port: int | None = None,
    host: str = "127.0.0.1",
    replication_tables: tuple[str, ...] = (),
    jetstream: bool = True,
) -> FleetPlan:
    """Lay out `replicas` replicas under `data_dir` (re-using a previous run's ports)."""
    if not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
        raise FleetError(f"--replicas {replicas!r} must be between 1 and {MAX_REPLICAS}")
    data_dir = pathlib.Path(data_dir).resolve()
    state = _read_state(data_dir)
    if base_port is None:
        base_port = int(state.get("base_port", DEFAULT_BASE_PORT)) if state else DEFAULT_BASE_PORT
    if not 1024 <= base_port or base_port + BLOCK * replicas - 1 > 65535:
        raise FleetError(
            f"--base-port {base_port}: {replicas} replicas need ports {base_port}.."
            f"{base_port + BLOCK * replicas - 1}, which must lie within 1024..65535"
        )
    layouts = [
        ReplicaLayout(i, host, base_port + BLOCK * (i - 1), data_dir / f"replica-{i}")
        for i in range(1, replicas + 1)
    ]
    for table in replication_tables:
        if not table or any(c in table for c in "?*"):
            raise FleetError(f"--replication table name {table!r} must be non-empty, without ?/*")
    return FleetPlan(
        layouts,
        data_dir,
        host,
        base_port,
        not state,
        data_dir / "token",
        tuple(replication_tables),
        jetstream=jetstream,
    )


def _read_state(data_dir: pathlib.Path) -> dict:
    path = data_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise FleetError(f"{path} is unreadable ({e}); remove it to start a new fleet") from e
    if not isinstance(state, dict):
        raise FleetError(f"{path} is not a JSON object; remove it to start a new fleet")
    return state


def prepare(fleet: FleetPlan, log_level: str = "INFO") -> None:
    """Create directories, the shared token and every replica's configuration file."""
    try:
        fleet.data_dir.mkdir(parents=True, exist_ok=True)
        if not fleet.token_file.exists():
            fd = os.open(fleet.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
        for r in fleet.replicas:
            r.data_dir.mkdir(parents=True, exist_ok=True)
            write_config(fleet, r, log_level)
        state = {
            "base_port": fleet.base_port,
            "host": fleet.host,
            "replicas": len(fleet.replicas),
            "updated": time.time(),
        }
        (fleet.data_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    except OSError as e:
        raise FleetError(f"cannot prepare the fleet directory {fleet.data_dir}: {e}") from e


def peers_of(fleet: FleetPlan, replicas: list[ReplicaLayout] | None = None) -> list[dict]:
    """The peer list every replica gets (itself included: it skips its own entry)."""
    return [
        {"name": r.name, "host": r.host, "port": r.syncer_port, "server_id": r.server_id}
        for r in (fleet.replicas if replicas is None else replicas)
    ]


def replica_config(fleet: FleetPlan, r: ReplicaLayout, log_level: str = "INFO") -> dict:
    conf = {
        "server_id": r.server_id,
        "host": r.host,
        "data_dir": str(r.data_dir),
        "token_file": str(fleet.token_file),
        # Only a brand-new fleet may create identities without asking a peer first.
        "allow_empty_start": fleet.new_fleet,
        "eventer": {"port": r.eventer_port},
        "syncer": {"port": r.syncer_port},
        "bus": {"port": r.bus_port, "enabled": False},  # reserved, not implemented
        "http": {"port": r.http_port},
        # On the HTTP port; the demo page (a shared list) is <http>/jetstream/demo.
        "jetstream": {"enabled": fleet.jetstream},
        "peers": peers_of(fleet),
        "log": {"level": log_level, "format": "text"},
    }
    if fleet.replication_tables:
        # The websocket lives on the HTTP port; the password is the fleet token.
        conf["replication"] = {
            "enabled": True,
            "tables": [{"name": t} for t in fleet.replication_tables],
        }
    return conf


def write_config(fleet: FleetPlan, r: ReplicaLayout, log_level: str = "INFO") -> None:
    """Write atomically (rename): a replica polling the file never reads half of it."""
    text = "# Written by `eventfleet fleet`; rewritten on every run.\n" + yaml.safe_dump(
        replica_config(fleet, r, log_level), sort_keys=False
    )
    tmp = r.config_path.with_suffix(".yaml.tmp")
    tmp.write_text(text)
    tmp.replace(r.config_path)


def busy_ports(fleet: FleetPlan) -> list[str]:
    """Ports of the plan that something else already listens on (named)."""
    busy = []
    for r in fleet.replicas:
        for what, port in r.ports().items():
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((r.host, port))
                except OSError:
                    busy.append(f"{r.host}:{port} ({r.name} {what})")
    return busy
