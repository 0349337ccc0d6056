"""docs/hat.md ("Connect a Hat component") runs as written against a real local fleet.

The fleet is ``eventfleet fleet --replicas 3`` (what ``./scripts/run`` starts) on a free
block of ports; the page's ports (the default layout from 23012) are shifted to it. The
page's blocks run in a checkout-like directory (``.venv/bin`` is this interpreter's,
``.data`` the fleet's data directory), through bash, as a reader would paste them:

* the ``python`` block is saved as ``hat_client.py`` (the real hat-event 0.9.44 client)
  and the ``sh`` block that runs it runs whole: every run must print the ``text`` block
  after the program (registered, read back, notified), tokenless and with ``.data/token``;
* a wrong token is refused with the reason the page names;
* the hat-gateway 0.6.48 configuration is saved as ``gateway.yaml`` and the ``sh`` block
  that starts it runs whole: it must print the metrics line the page shows.

The Kubernetes blocks are checked against the operator in
tests/unit/operator/test_op_docs_hat.py.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys

import pytest

from e2e.fleet_helpers import FleetProc, free_block, kill_group
from e2e.test_docs_examples import blocks, shift_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "hat.md"


def following_text(found: list[tuple[str, str]], index: int) -> list[str]:
    """The lines of the ``text`` block right after block ``index`` (its expected output)."""
    info, body = found[index + 1]
    assert info == "text", f"block {index + 2} of hat.md should be the expected output"
    return body.splitlines()


def the_block(found: list[tuple[str, str]], info: str, needle: str) -> int:
    (index,) = [i for i, (kind, body) in enumerate(found) if kind == info and needle in body]
    return index


@pytest.fixture(scope="module")
def fleet_checkout(tmp_path_factory):
    """``(base port, checkout-like directory)`` with a running three-replica fleet."""
    base = free_block(3)
    root = tmp_path_factory.mktemp("hat")
    data = root / "data"
    fleet = FleetProc(data, 3, base_port=base).start()
    try:
        asyncio.run(fleet.wait_up())
        checkout = root / "checkout"
        checkout.mkdir()
        # The whole venv (not resolved: python finds its pyvenv.cfg next to bin/).
        (checkout / ".venv").symlink_to(pathlib.Path(sys.executable).parent.parent)
        (checkout / ".data").symlink_to(data)
        yield base, checkout
    finally:
        fleet.stop()


def bash(script: str, cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    """``script`` through bash in its own process group, which is killed afterwards: a
    background job of the page (hat-gateway) never outlives the test."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("EVENTFLEET_", "EVENTER_"))}
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        kill_group(proc)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_client_program_runs_tokenless_with_the_token_and_on_replica_two(fleet_checkout):
    base, checkout = fleet_checkout
    found = blocks(PAGE)
    program = the_block(found, "python", "hat.event.eventer")
    (checkout / "hat_client.py").write_text(shift_ports(found[program][1], base))
    expected = following_text(found, program)
    local = found[the_block(found, "sh", "EVENTER_PORT=23022")][1]
    assert "kubectl" not in local
    runs = [line for line in local.splitlines() if "hat_client.py" in line]
    assert len(runs) == 3 and "$(cat .data/token)" in runs[1] and "23022" in runs[2], runs
    result = bash(shift_ports(local, base), checkout)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    for line in expected:
        assert lines.count(line) == len(runs), f"{line!r} not printed by each run:\n{result.stdout}"


def test_a_wrong_token_is_refused_with_the_reason_the_page_names(fleet_checkout):
    base, checkout = fleet_checkout
    assert "`invalid client token`" in PAGE.read_text()
    if not (checkout / "hat_client.py").exists():
        found = blocks(PAGE)
        body = found[the_block(found, "python", "hat.event.eventer")][1]
        (checkout / "hat_client.py").write_text(shift_ports(body, base))
    result = bash(".venv/bin/python hat_client.py", checkout, EVENTFLEET_TOKEN="not-the-token")
    assert result.returncode != 0
    assert "EventerInitError" in result.stderr and "invalid client token" in result.stderr, (
        result.stderr[-2000:]
    )


def test_the_hat_gateway_configuration_connects(fleet_checkout):
    base, checkout = fleet_checkout
    found = blocks(PAGE)
    conf = found[the_block(found, "yaml", "eventer_server")][1]
    (checkout / "gateway.yaml").write_text(shift_ports(conf, base))
    index = the_block(found, "sh", "hat-gateway --conf gateway.yaml")
    result = bash(shift_ports(found[index][1], base), checkout)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-4000:]}"
    for line in following_text(found, index):
        assert line in result.stdout.splitlines(), result.stdout
