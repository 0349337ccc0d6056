"""`eventfleet fleet` refuses bad input before starting anything, naming the value."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from e2e.fleet_helpers import HOST, free_block


def fleet(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eventfleet_cli", "fleet", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "--replicas 0 must be between 1 and 100"),
        (["--replicas", "101"], "--replicas 101 must be between 1 and 100"),
        (["--replicas", "3", "--base-port", "65530"], "--base-port 65530: 3 replicas need ports"),
        (["--base-port", "80"], "--base-port 80"),
    ],
)
def test_bad_numbers_are_refused(tmp_path, args, message):
    result = fleet(*args, "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "d").exists()  # nothing was created


def test_a_busy_port_is_named(tmp_path):
    base = free_block(2)
    with socket.socket() as s:
        s.bind((HOST, base + 11))  # replica-2's Syncer port
        s.listen()
        result = fleet("--replicas", "2", "--base-port", str(base), "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert f"{HOST}:{base + 11} (replica-2 syncer)" in result.stderr


def test_an_unreadable_fleet_state_is_refused(tmp_path):
    (tmp_path / "fleet.json").write_text("{not json")
    result = fleet("--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "fleet.json is unreadable" in result.stderr and "remove it" in result.stderr
