"""The real parts the suite depends on, and what a test does when one is missing: it fails.

CI (``./scripts/test``, ``.ci/run``) must never go green because Go, podman, the control
plane, a browser or a reference implementation was absent and the tests that need it
quietly skipped. So a missing part fails the test, naming what to run.

A developer without, say, a container runtime may opt in to skipping instead:
``EVENTFLEET_ALLOW_MISSING=podman,go`` (comma-separated part names, or ``all``).
CI never sets it. Every test skipped (or run degraded) that way is recorded here and the
run ends with a loud summary of what was allowed to be missing (``terminal_summary``,
called from the conftests), so such a run cannot be mistaken for a full one.
"""

from __future__ import annotations

import os

import pytest

ALLOW_ENV = "EVENTFLEET_ALLOW_MISSING"

# Part name -> what provides it (for the messages and docs).
PARTS = {
    "go": "a Go toolchain (builds the control plane: scripts/tools/k8s-control-plane.sh)",
    "kubectl": "kubectl (scripts/tools/k8s-binaries.sh)",
    "helm": "helm (scripts/tools/k8s-binaries.sh)",
    "podman": "podman and the project's images (scripts/tools/images.sh, as root)",
    "chromium": "Debian's chromium (scripts/tools/chromium.sh)",
    "prometheus": "prometheus and promtool (scripts/tools/prometheus.sh)",
    "openssl": "the openssl command (apt-get install openssl)",
    "hat-event": "the hat-event reference (the `test` extra: ./scripts/bootstrap ...,test)",
    "spark": "pyspark and pyarrow (the `spark` extra: ./scripts/bootstrap ...,spark)",
    "uvloop": "uvloop (the `server` extra, on CPython/Linux)",
    "cc": "a C compiler (gcc): the install builds the Event BUS's C frame loops "
    "(server/eventfleet_server/bus/_zmqio.c), the Syncer's C walk of received events "
    "(server/eventfleet_server/syncer/_rows.c) and the Eventer's C decode of register "
    "requests (server/eventfleet_server/eventer/_register.c); without it the BUS falls "
    "back to pyzmq, the Syncer to its Python walk and the Eventer to its Python decode",
    "mounts": "root, mount/losetup (util-linux), mkfs.ext4/e2fsck (e2fsprogs): the real "
    "storage-fault tests mount tmpfs and loop ext4 file systems",
}

# (part, nodeid or "", reason) for every test that ran without a part, in order.
allowed: list[tuple[str, str, str]] = []


def allowed_missing(environ: dict[str, str] | None = None) -> frozenset[str]:
    """The part names EVENTFLEET_ALLOW_MISSING lets be missing (``all``: every part)."""
    raw = (os.environ if environ is None else environ).get(ALLOW_ENV, "")
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = names - set(PARTS) - {"all"}
    if unknown:
        raise pytest.UsageError(
            f"{ALLOW_ENV}={raw!r}: unknown part(s) {sorted(unknown)}; known: {sorted(PARTS)}"
        )
    return frozenset(PARTS) if "all" in names else names


def missing(part: str, problem: str, fix: str) -> None:
    """A part is missing: fail the test, unless a developer allowed it (then record it).

    Returns only when the part is allowed to be missing; the caller then skips or
    degrades, and the summary at the end of the run lists it.
    """
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; known: {sorted(PARTS)}")
    if part not in allowed_missing():
        pytest.fail(
            f"missing {part}: {problem}. Fix: {fix}. (A developer may set {ALLOW_ENV}={part} "
            "to skip instead; CI never does.)",
            pytrace=False,
        )
    nodeid = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    allowed.append((part, nodeid, problem))


def skip_missing(part: str, problem: str, fix: str) -> None:
    """``missing``, then skip: fails unless the developer allowed the part to be missing."""
    missing(part, problem, fix)
    pytest.skip(f"{ALLOW_ENV} allows {part} to be missing: {problem}", allow_module_level=True)


def require_module(part: str, module: str):
    """Import ``module`` (an installed extra), failing as ``missing`` when it is absent."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as e:
        skip_missing(part, f"cannot import {module} ({e})", f"install {PARTS[part]}")


def terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """Print, loudly and once per run, what was allowed to be missing."""
    if getattr(config, "_eventfleet_parts_summary", False):
        return
    config._eventfleet_parts_summary = True  # both conftests call this
    names = sorted(allowed_missing())
    if not names and not allowed:
        return
    terminalreporter.write_sep("!", "INCOMPLETE RUN: real parts allowed to be missing", red=True)
    terminalreporter.write_line(f"{ALLOW_ENV}={os.environ.get(ALLOW_ENV, '')}")
    used = sorted({p for p, _, _ in allowed})
    terminalreporter.write_line(f"missing and skipped or degraded: {', '.join(used) or 'none'}")
    for part, nodeid, problem in allowed:
        terminalreporter.write_line(f"  {part}: {nodeid or '(fixture)'}: {problem}")
    terminalreporter.write_line("This is not a CI result: CI never sets " + ALLOW_ENV + ".")
