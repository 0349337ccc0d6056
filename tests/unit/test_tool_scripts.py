"""scripts/tools/lib/apt.bash, the apt block chromium.sh and prometheus.sh share, and
what every tool script does when it cannot provide its part (lib/missing.bash): fail, or,
when a developer allowed the part to be missing, say so loudly and exit 0.

A real apt-get would change this machine, so apt-get, apt-cache, sudo and id are stub
scripts on PATH that record how they were called; the scripts themselves run for real
(their already-installed path) in the suites that need the tools. A missing Go or podman
is a PATH without them, and a copy of the script in a fresh checkout-like directory (no
.tools), so nothing already built lets the script succeed.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

from tests import parts

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
            "installing it needs root (or password-less sudo)\n"
            "tool: fix: as root: apt-get install --no-install-recommends pkg extra",
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


def test_a_developer_may_allow_a_part_to_be_missing_and_is_told_loudly(tmp_path):
    result, calls = run(
        tmp_path,
        "export EVENTFLEET_ALLOW_MISSING=go,chromium; apt_need_root chromium pkg; echo reached",
        uid=1000,
        sudo=False,
    )
    assert result.returncode == 0, result.stderr
    assert "reached" not in result.stdout  # the script ends: it provides nothing
    assert "chromium MISSING, allowed by EVENTFLEET_ALLOW_MISSING" in result.stderr
    assert calls == []


def _path_without(tmp_path: pathlib.Path, *names: str) -> str:
    """A PATH of one directory linking every command of this PATH but ``names``."""
    bindir = tmp_path / "path"
    bindir.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            link = bindir / entry.name
            if entry.name in names or link.exists() or not os.access(entry.path, os.X_OK):
                continue
            link.symlink_to(entry.path)
    for name in names:
        assert shutil.which(name, path=str(bindir)) is None
    return str(bindir)


def _checkout(tmp_path: pathlib.Path, script: str, *extra: str) -> pathlib.Path:
    """A checkout-like copy holding the script, its lib/ and ``extra`` paths, no .tools."""
    root = tmp_path / "repo"
    for rel in (f"scripts/tools/{script}", "scripts/tools/lib", *extra):
        src, dest = REPO / rel, root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest)
        else:
            shutil.copy2(src, dest)
    return root


def _run_script(root, script, path, **env):
    return subprocess.run(
        ["bash", str(root / "scripts" / "tools" / script)],
        env={"PATH": path, "HOME": str(root), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_control_plane_without_go_fails_naming_what_to_install(tmp_path):
    root = _checkout(tmp_path, "k8s-control-plane.sh", "e2e/controlplane")
    path = _path_without(tmp_path, "go")
    result = _run_script(root, "k8s-control-plane.sh", path)
    assert result.returncode == 1, result.stderr
    assert "FAILED: no 'go' on PATH" in result.stderr
    assert "install a Go toolchain" in result.stderr
    assert "EVENTFLEET_ALLOW_MISSING=go" in result.stderr
    assert not (root / ".tools" / "k8s" / "bin" / "kube-apiserver").exists()

    allowed = _run_script(root, "k8s-control-plane.sh", path, EVENTFLEET_ALLOW_MISSING="go")
    assert allowed.returncode == 0, allowed.stderr
    assert "go MISSING, allowed by EVENTFLEET_ALLOW_MISSING" in allowed.stderr


def test_images_without_podman_and_no_root_fail_naming_what_to_install(tmp_path):
    root = _checkout(tmp_path, "images.sh")
    path = _path_without(tmp_path, "podman", "buildah", "runc", "debootstrap", "id")
    _stub(pathlib.Path(path), "id", "echo 1000")
    result = _run_script(root, "images.sh", path)
    assert result.returncode == 1, result.stderr
    assert "FAILED: missing podman buildah runc debootstrap" in result.stderr
    assert "apt-get install podman buildah runc debootstrap uidmap" in result.stderr

    allowed = _run_script(root, "images.sh", path, EVENTFLEET_ALLOW_MISSING="podman")
    assert allowed.returncode == 0, allowed.stderr
    assert "podman MISSING, allowed" in allowed.stderr


# --- the tests' side (tests/parts.py) ------------------------------------------------


def test_a_missing_part_fails_the_test_with_what_to_run(monkeypatch):
    monkeypatch.delenv(parts.ALLOW_ENV, raising=False)
    with pytest.raises(
        pytest.fail.Exception, match=re.escape("missing podman: no podman. Fix: run it")
    ):
        parts.missing("podman", "no podman", "run it")


def test_an_allowed_part_skips_and_is_recorded_for_the_summary(monkeypatch):
    monkeypatch.setenv(parts.ALLOW_ENV, "go, podman")
    monkeypatch.setattr(parts, "allowed", [])
    with pytest.raises(pytest.skip.Exception, match="allows podman to be missing"):
        parts.skip_missing("podman", "no podman", "run it")
    assert [p for p, _, _ in parts.allowed] == ["podman"]
    assert parts.allowed_missing({parts.ALLOW_ENV: "all"}) == frozenset(parts.PARTS)


def test_an_unknown_part_name_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match=r"unknown part.*'podmna'"):
        parts.allowed_missing({parts.ALLOW_ENV: "podmna"})


SKIP_CALL = re.compile(r"pytest\.(skip\(|importorskip\(|mark\.skip(if)?\b)|unittest\.skip|SkipTest")


def test_no_test_skips_on_its_own():
    """Every skip goes through tests/parts.py, so a missing part fails CI: a bare
    pytest.skip / skipif / importorskip would quietly turn green."""
    offenders = []
    for top in ("tests", "e2e"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path == REPO / "tests" / "parts.py" or path == pathlib.Path(__file__):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if SKIP_CALL.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert offenders == []
