"""The ``eventfleet`` command: one entry point for every role.

Each subcommand imports its role lazily, so an image with only the ``[server]`` extra
can run ``eventfleet server`` without the operator's dependencies installed.
"""

from __future__ import annotations

import argparse
import signal
import sys


def _stop_before_the_loop(signum: int, _frame: object) -> None:
    """SIGTERM before a role's event loop takes the signal over: exit now.

    Why: as PID 1 of a container the kernel drops a signal that has no handler, so a
    SIGTERM during start-up (imports, configuration, opening the store) was lost and the
    kubelet waited the whole grace period (60 s for a replica) before SIGKILL. Nothing
    is acknowledged yet at that point, so stopping at once loses nothing.
    """
    raise SystemExit(128 + signum)


# Installed first thing, before the imports below (the roles' imports take ~1 s).
signal.signal(signal.SIGTERM, _stop_before_the_loop)

from eventfleet_cli import (  # noqa: E402  (after the handler, on purpose)
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
