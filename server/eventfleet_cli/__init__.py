"""The ``eventfleet`` command: one entry point for every role.

Each subcommand imports its role lazily, so an image with only the ``[server]`` extra
can run ``eventfleet server`` without the operator's dependencies installed.
"""

from __future__ import annotations

import argparse
import sys

from eventfleet_cli import (
    aggregate_command,
    client_commands,
    fleet_command,
    operator_command,
    server_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eventfleet", description="Redundant Hat event-server replicas and their operator."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    server_command.add_parser(sub)
    fleet_command.add_parser(sub)
    client_commands.add_parsers(sub)
    aggregate_command.add_parser(sub)
    operator_command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
