"""The wheel: exactly the project's top-level packages, SPDX licence, no build warnings.

The wheel is built from a copy of the source roots (a build writes ``build/`` and
``*.egg-info`` next to the sources), offline and without build isolation, with the
setuptools of the test environment (the ``test`` extra pins one new enough for the
SPDX ``license`` string).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = {
    "eventfleet_server",
    "eventfleet_cli",
    "eventfleet_operator",
    "eventfleet_spark",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[pathlib.Path, str]:
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.pyc")
    for name in ("server", "operator", "spark"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-v",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    (built,) = out.glob("eventfleet-*.whl")
    return built, log


def test_wheel_installs_only_the_project_packages(wheel):
    path, _ = wheel
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        tops = {n.split("/", 1)[0] for n in names}
        dist_info = {t for t in tops if t.endswith(".dist-info")}
        assert tops - dist_info == PROJECT_PACKAGES
        # No stray modules at the top (a `deploy` namespace package, a script...).
        assert all("/" in n for n in names)
        # Package data that the code loads at run time is in.
        assert any(n.startswith("eventfleet_server/") and n.endswith(".sbs") for n in names)
        assert "eventfleet_server/config/schema.json" in names
        # The operator reads its spec defaults from its copy of the EventServer CRD.
        assert "eventfleet_operator/eventfleet.io_eventservers.yaml" in names


def test_wheel_metadata_has_the_spdx_licence(wheel):
    path, _ = wheel
    with zipfile.ZipFile(path) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    assert "\nLicense: " not in text  # the deprecated free-text field


def test_build_prints_no_deprecation_banner(wheel):
    _, log = wheel
    noisy = [
        line
        for line in log.splitlines()
        if "Deprecat" in line or "deprecated" in line or "SetuptoolsWarning" in line
    ]
    assert noisy == []
