"""scripts/tools/lib/apt.bash, the apt block chromium.sh and prometheus.sh share.

A real apt-get would change this machine, so apt-get, apt-cache, sudo and id are stub
scripts on PATH that record how they were called; the scripts themselves run for real
(their already-installed path) in the suites that need the tools.
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
LIB = REPO / "scripts" / "tools" / "lib" / "apt.bash"


def _stub(bindir: pathlib.Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def run(tmp_path, script: str, *, uid=0, known=False, sudo=None, apt=True):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    _stub(bindir, "id", f"echo {uid}")
    if apt:
        _stub(bindir, "apt-get", f'echo "apt-get $* DEBIAN_FRONTEND=$DEBIAN_FRONTEND" >> {log}')
        _stub(bindir, "apt-cache", "exit 0" if known else "exit 100")
    if sudo is not None:
        _stub(
            bindir,
            "sudo",
            f'[ "$2" = true ] && exit {0 if sudo else 1}; echo -n "sudo " >> {log}; shift; "$@"',
        )
    result = subprocess.run(
        ["/bin/bash", "-c", f"set -euo pipefail; source {LIB}; {script}"],
        env={"PATH": str(bindir)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return result, calls


def test_root_on_a_fresh_image_updates_then_installs_non_interactively(tmp_path):
    result, calls = run(tmp_path, "apt_need_root tool pkg; apt_install tool pkg extra")
    assert result.returncode == 0, result.stderr
    assert calls == [
        "apt-get -o DPkg::Lock::Timeout=300 update -qq DEBIAN_FRONTEND=noninteractive",
        "apt-get install -qq -o DPkg::Lock::Timeout=300 -y --no-install-recommends pkg extra"
        " DEBIAN_FRONTEND=noninteractive",
    ]
    assert "tool: apt-get update" in result.stderr


def test_known_package_skips_the_update(tmp_path):
    result, calls = run(tmp_path, "apt_need_root tool pkg; apt_install tool pkg", known=True)
    assert result.returncode == 0, result.stderr
    assert [c.split()[1] for c in calls] == ["install"]


def test_password_less_sudo_is_used_when_not_root(tmp_path):
    result, calls = run(
        tmp_path, "apt_need_root tool pkg; apt_install tool pkg", uid=1000, known=True, sudo=True
    )
    assert result.returncode == 0, result.stderr
    assert calls[0].startswith("sudo apt-get install")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"uid": 1000, "sudo": False},
            "installing it needs root (or password-less sudo):\n"
            "  apt-get install --no-install-recommends pkg extra",
        ),
        ({"uid": 1000}, "installing it needs root"),  # no sudo at all
        ({"apt": False}, "not a Debian-like system (no apt-get)"),
    ],
)
def test_refuses_with_the_command_to_run_when_it_cannot_install(tmp_path, kwargs, message):
    result, calls = run(tmp_path, "apt_need_root tool pkg extra; echo reached", **kwargs)
    assert result.returncode == 1 and "reached" not in result.stdout
    assert "tool: " in result.stderr and message in result.stderr
    assert calls == []


@pytest.mark.parametrize("script", ["chromium.sh", "prometheus.sh"])
def test_tool_scripts_parse_and_source_the_shared_block(script):
    path = REPO / "scripts" / "tools" / script
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    assert 'source "$root/scripts/tools/lib/apt.bash"' in text
    assert "apt_need_root" in text and "apt_install" in text
    assert "apt-get install" not in text.replace("apt_install", "")  # no copy of its own
