"""What the local fleet prints once it is up: how to connect, as commands that run.

Pure functions of the fleet plan and of how the ``eventfleet`` command was started, so
the text is tested as it is printed (e2e/test_fleet_banner.py runs its examples).
"""

from __future__ import annotations

import os
import pathlib
import shlex
import sys

from eventfleet_server.fleet.layout import FleetPlan

# The first line of the Hat client example; the indented lines after it are Python.
HAT_HEADER = "  Hat Eventer client (hat-event 0.9, pip install hat-event==0.9.44), in async code:"


def cli_command(
    argv0: str | None = None, executable: str | None = None, cwd: pathlib.Path | None = None
) -> str:
    """How to run this same ``eventfleet`` from a shell in `cwd`.

    ``./scripts/run`` puts it in ``.venv/bin``, which is not on PATH: a bare
    ``eventfleet`` would not be found. The console script that is running (argv[0])
    is preferred, then the one next to the interpreter, then ``python -m eventfleet_cli``.
    Paths under `cwd` are printed relative to it (``.venv/bin/eventfleet``).
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    cwd = pathlib.Path.cwd() if cwd is None else cwd
    for candidate in (pathlib.Path(argv0), pathlib.Path(executable).parent / "eventfleet"):
        if candidate.name == "eventfleet" and os.access(candidate, os.X_OK):
            return _shown(candidate, cwd)
    return f"{shlex.quote(_shown(pathlib.Path(executable), cwd))} -m eventfleet_cli"


def _shown(path: pathlib.Path, cwd: pathlib.Path) -> str:
    # No resolve(): a venv's bin/python is a symlink and must stay the venv's.
    path = path if path.is_absolute() else cwd / path
    try:
        relative = path.relative_to(cwd)
    except ValueError:
        return str(path)
    # `.venv/bin/eventfleet` runs as is; a plain relative name needs `./` in a shell.
    dotted = relative.parts and relative.parts[0].startswith(".")
    return str(relative) if dotted else f"./{relative}"


def hat_example(fleet: FleetPlan) -> list[str]:
    """The Hat client lines: ``net.TcpAddress`` (hat-event 0.9 refuses a tuple), the
    client token when loopback clients must present one; none with TLS (no setting)."""
    first = fleet.replicas[0]
    if fleet.tls:
        return [
            "  Hat components (hat-event clients) cannot connect: they have no TLS setting "
            "(start the fleet without --tls for them)"
        ]
    token = (
        ""
        if fleet.tokenless_loopback
        else f", client_token=open({str(fleet.token_file)!r}).read().strip()"
    )
    return [
        HAT_HEADER,
        "    from hat.drivers import net",
        "    from hat.event.eventer import client",
        f"    conn = await client.connect(net.TcpAddress({first.host!r}, {first.eventer_port}), "
        f"'me'{token})",
    ]


def connect_banner(fleet: FleetPlan, cli: str) -> str:
    """The lines printed when every replica is up (not in ``--json`` mode)."""
    first = fleet.replicas[0]
    eventer = first.endpoints()["eventer"]
    tls = f" --tls-ca {shlex.quote(str(fleet.tls_dir / 'ca.pem'))}" if fleet.tls else ""
    token_file = shlex.quote(str(fleet.token_file))
    token = "" if fleet.tokenless_loopback else f" --token-file {token_file}"
    lines = [
        f"fleet of {len(fleet.replicas)} replicas up (data: {fleet.data_dir}, "
        f"token: {fleet.token_file})",
        f"  {cli} watch --eventer {eventer}{tls}{token} '*'",
        f"  {cli} register --eventer {eventer}{tls}{token} a/b --json '{{\"value\": 1}}'",
        *hat_example(fleet),
    ]
    if fleet.jetstream:
        lines.append(
            f"  Jetstream demo (a shared list): {first.jetstream(fleet.tls)['jetstream_demo']}"
            "?token=<contents of the token file>"
        )
    lines.append(
        f"  Event BUS (ZeroMQ): SNAPSHOT tcp://{first.host}:{first.bus_port}, "
        f"PUBLISHER :{first.bus_port + 1}, COLLECTOR :{first.bus_port + 2}; "
        "ZAP PLAIN, password = the token"
    )
    lines.append("Ctrl-C stops the fleet; running the same command again resumes it.")
    return "\n".join(lines)
