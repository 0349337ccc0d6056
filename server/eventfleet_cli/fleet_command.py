"""``eventfleet fleet``: N replicas as local processes, wired to each other."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fleet",
        help="run a local fleet of replicas (the README's run command)",
        description="Start N replicas as processes on loopback, each with its own SQLite "
        "store under DATA_DIR/replica-<i>, Syncer-connected to every other one. Replica i "
        "has server id i and the ports BASE+10*(i-1)+{0: Eventer, 1: Syncer, 2-4: Event BUS "
        "SNAPSHOT/PUBLISHER/COLLECTOR, 5: HTTP}. Replicas that "
        "die are restarted; Ctrl-C or SIGTERM stops them all gracefully. Running it again "
        "on the same DATA_DIR resumes the same fleet.",
    )
    p.add_argument("--replicas", type=int, default=3, help="number of replicas (default 3)")
    p.add_argument(
        "--base-port",
        type=int,
        help="first port of replica 1's block (default: the previous run's, else 23012)",
    )
    p.add_argument("--data-dir", type=pathlib.Path, default=pathlib.Path(".data"))
    p.add_argument("--host", default="127.0.0.1", help="address every replica binds")
    p.add_argument(
        "--tls",
        action="store_true",
        help="TLS on every listener and mutual TLS between the replicas, with a CA and "
        "certificates generated under DATA_DIR/tls (needs openssl); clients verify "
        "against DATA_DIR/tls/ca.pem (eventfleet register --tls-ca ...)",
    )
    p.add_argument(
        "--require-client-token",
        action="store_true",
        help="every Eventer client must present the client token (DATA_DIR/token); by "
        "default clients on loopback may omit it, as Hat components cannot send one "
        "(see docs/security.md)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per line per replica (name, server_id, pid, endpoints)",
    )
    p.add_argument(
        "--replication",
        metavar="TABLE[,TABLE...]",
        default="",
        help="publish these tables over Replication (AppWebsocket) at "
        "ws://HOST:HTTP/replication on every replica; the login password is the fleet token",
    )
    p.add_argument(
        "--no-jetstream",
        dest="jetstream",
        action="store_false",
        help="do not serve Jetstream (ws://<http>/jetstream, demo page /jetstream/demo)",
    )
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eventfleet_server import logs
    from eventfleet_server.fleet import FleetError, Supervisor, layout

    logs.private_umask()  # before any file is created: store, configs, logs, tokens
    try:
        tables = tuple(t.strip() for t in args.replication.split(",") if t.strip())
        fleet = layout.plan(
            args.replicas,
            args.data_dir,
            base_port=args.base_port,
            host=args.host,
            tokenless_loopback=not args.require_client_token,
            tls=args.tls,
            replication_tables=tables,
            jetstream=args.jetstream,
        )
        busy = layout.busy_ports(fleet)
        if busy:
            raise FleetError("ports already in use: " + ", ".join(busy))
        layout.prepare(fleet, args.log_level)
    except FleetError as e:
        print(f"eventfleet fleet: {e}", file=sys.stderr)
        return 2
    logs.setup(args.log_level, "text", {"fleet": fleet.data_dir.name})
    return asyncio.run(Supervisor(fleet, json_lines=args.json).run())
