"""``eventfleet server``: run one replica."""

from __future__ import annotations

import argparse
import pathlib
import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "server",
        help="run one replica",
        description="Run one replica. Settings: defaults < --config file < environment "
        "(EVENTFLEET_POD_NAME, EVENTFLEET_SERVER_ID, EVENTFLEET_TOKEN, EVENTFLEET_TOKEN_FILE, "
        "EVENTFLEET_PEER_TOKEN, EVENTFLEET_PEER_TOKEN_FILE) "
        "< flags. The token is never a flag.",
    )
    p.add_argument("--config", type=pathlib.Path, help="YAML configuration file")
    p.add_argument("--data-dir", help="directory of the SQLite store")
    p.add_argument("--server-id", type=int, help="this replica's server id (>= 1)")
    p.add_argument("--host", help="address the listeners bind")
    p.add_argument("--eventer-port", type=int, help="Eventer TCP port")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--log-format", choices=["text", "json"])
    p.set_defaults(func=run)


def overrides_from_args(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.data_dir is not None:
        out["data_dir"] = args.data_dir
    if args.server_id is not None:
        out["server_id"] = args.server_id
    if args.host is not None:
        out["host"] = args.host
    if args.eventer_port is not None:
        out.setdefault("eventer", {})["port"] = args.eventer_port
    if args.log_level or args.log_format:
        out["log"] = {
            k: v for k, v in (("level", args.log_level), ("format", args.log_format)) if v
        }
    return out


def run(args: argparse.Namespace) -> int:
    from eventfleet_server import config, eventloop, logs, main

    logs.private_umask()  # before any file is created: store, configs, logs, tokens
    try:
        conf = config.load(args.config, overrides=overrides_from_args(args))
        client, peer = config.read_credentials(conf)
    except config.ConfigError as e:
        print(f"eventfleet server: {e}", file=sys.stderr)
        return 2
    from eventfleet_server.listener import Credentials

    logs.setup(conf["log"]["level"], conf["log"]["format"], {"server_id": conf["server_id"]})
    try:
        return eventloop.run(
            main.run(conf, Credentials(client, peer), args.config), conf["event_loop"]
        )
    except eventloop.EventLoopError as e:
        print(f"eventfleet server: {e}", file=sys.stderr)
        return 2
