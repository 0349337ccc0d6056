"""Where each replica of a local fleet lives: ports, directories, configuration files.

Replica ``i`` (1-based) gets server id ``i``, name ``replica-i`` and the port block
starting at ``base_port + 10 * (i - 1)``:

====== ========================================================
offset endpoint
====== ========================================================
+0     Eventer
+1     Syncer
+2     Event BUS SNAPSHOT (ROUTER)
+3     Event BUS PUBLISHER (PUB)
+4     Event BUS COLLECTOR (ROUTER)
+5     HTTP (metrics, health, status)
====== ========================================================

With the default base port 23012, replica 1 answers Eventer on 23012 and Syncer on
23013, the single-replica defaults. The Event BUS takes the three consecutive ports its
protocol needs (P, P+1, P+2); BUS clients authenticate with ZAP PLAIN, password = the
fleet token (docs/bus.md).
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import socket
import subprocess
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
        """The Event BUS SNAPSHOT port P (PUBLISHER P+1, COLLECTOR P+2)."""
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
        """Every listening endpoint by name."""
        h = self.host
        return {
            "eventer": f"{h}:{self.eventer_port}",
            "syncer": f"{h}:{self.syncer_port}",
            "bus_snapshot": f"{h}:{self.bus_port}",
            "bus_publisher": f"{h}:{self.bus_port + 1}",
            "bus_collector": f"{h}:{self.bus_port + 2}",
            "http": f"{h}:{self.http_port}",
        }

    def jetstream(self, tls: bool = False) -> dict[str, str]:
        """Jetstream's websocket and its demo page, on the HTTP port (not ports of their
        own); `tls`: the fleet serves HTTP over TLS (``--tls``), so wss:// and https://."""
        base = f"{self.host}:{self.http_port}/jetstream"
        ws, http = ("wss", "https") if tls else ("ws", "http")
        return {"jetstream": f"{ws}://{base}", "jetstream_demo": f"{http}://{base}/demo"}

    def replication(self, tls: bool = False) -> str:
        """The Replication (AppWebsocket) endpoint on the HTTP port."""
        return f"{'wss' if tls else 'ws'}://{self.host}:{self.http_port}/replication"

    def ports(self) -> dict[str, int]:
        return {k: int(v.rsplit(":", 1)[1]) for k, v in self.endpoints().items()}


@dataclass(frozen=True)
class FleetPlan:
    replicas: list[ReplicaLayout]
    data_dir: pathlib.Path
    host: str
    base_port: int
    new_fleet: bool  # no fleet.json yet: first boot, replicas may start empty
    token_file: pathlib.Path  # client token (Eventer)
    peer_token_file: pathlib.Path  # Syncer peers and HTTP's POST /flush
    # Eventer clients on loopback may omit the client token (Hat components have no
    # token setting); False: every client must present it.
    tokenless_loopback: bool = True
    # TLS on every listener and mutual TLS between the replicas, with a CA and
    # certificates generated under DIR/tls (openssl command-line tool).
    tls: bool = False

    @property
    def tls_dir(self) -> pathlib.Path:
        return self.data_dir / "tls"

    # Tables published over Replication (docs/replication.md); empty: Replication is off.
    replication_tables: tuple[str, ...] = ()
    jetstream: bool = True  # Jetstream (and its demo page) on every replica's HTTP port


def plan(
    replicas: int,
    data_dir: pathlib.Path,
    *,
    base_port: int | None = None,
    host: str = "127.0.0.1",
    tokenless_loopback: bool = True,
    tls: bool = False,
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
        data_dir / "peer-token",
        tokenless_loopback,
        tls,
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
    """Create directories (0700), the client and peer tokens (0600, kept across runs)
    and every replica's configuration file."""
    try:
        _private_dir(fleet.data_dir)
        for path in (fleet.token_file, fleet.peer_token_file):
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_urlsafe(32) + "\n")
        if fleet.tls:
            _make_certificates(fleet)
        for r in fleet.replicas:
            _private_dir(r.data_dir)
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


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise FleetError("--tls needs the openssl command-line tool") from e
    except subprocess.CalledProcessError as e:
        raise FleetError(f"openssl {args[0]} failed: {e.stderr.strip()[-300:]}") from e


def _make_certificates(fleet: FleetPlan) -> None:
    """A fleet CA (kept across runs) and one certificate per replica, valid for the
    fleet's host and loopback, usable as server and as client (mutual TLS)."""
    d = fleet.tls_dir
    _private_dir(d)
    key_opts = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    if not (d / "ca.pem").exists():
        _openssl(
            "req", "-x509", *key_opts, "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "3650", "-subj", "/CN=eventfleet local fleet CA", cwd=d,
        )  # fmt: skip
    san = f"IP:{fleet.host},IP:127.0.0.1,DNS:localhost"
    if fleet.host in ("127.0.0.1", "localhost"):
        san = "IP:127.0.0.1,DNS:localhost"
    for r in fleet.replicas:
        if (d / f"{r.name}.pem").exists():
            continue
        (d / f"{r.name}.ext").write_text(
            f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"
        )
        _openssl(
            "req", *key_opts, "-keyout", f"{r.name}.key", "-out", f"{r.name}.csr",
            "-subj", f"/CN={r.name}", cwd=d,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{r.name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{r.name}.pem", "-days", "825",
            "-extfile", f"{r.name}.ext", cwd=d,
        )  # fmt: skip
    for key in d.glob("*.key"):
        key.chmod(0o600)


def _private_dir(path: pathlib.Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)  # also a directory an older version created world-readable


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
        "peer_token_file": str(fleet.peer_token_file),
        # Only a brand-new fleet may create identities without asking a peer first. A
        # single replica has no peer to ask: waiting could never end (a resumed
        # one-replica fleet that had registered nothing stayed unready for good).
        "allow_empty_start": fleet.new_fleet or len(fleet.replicas) == 1,
        "eventer": {
            "port": r.eventer_port,
            "allow_tokenless_clients": fleet.tokenless_loopback,
            "tokenless_client_networks": ["127.0.0.0/8", "::1"],
        },
        "syncer": {"port": r.syncer_port},
        "bus": {"port": r.bus_port, "enabled": True},
        "http": {"port": r.http_port},
        **(
            {
                "tls": {
                    "enabled": True,
                    "cert_file": str(fleet.tls_dir / f"{r.name}.pem"),
                    "key_file": str(fleet.tls_dir / f"{r.name}.key"),
                    "ca_file": str(fleet.tls_dir / "ca.pem"),
                }
            }
            if fleet.tls
            else {}
        ),
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
