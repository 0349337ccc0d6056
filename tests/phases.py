"""The two phases of the README test command (``scripts/test``), as a pytest plugin.

The real cluster's binaries (the control plane and the node: etcd, kube-apiserver,
kubelet, CoreDNS, kube-router ...) take most of the set-up time to compile, and only the
tests on the cluster need them; and those tests mostly wait for Kubernetes, leaving the
CPU to others. So ``scripts/test`` compiles the binaries in the background during the
set-up, runs every test off the cluster (phase ``local``), and as soon as the binaries
are built starts the tests on the cluster (phase ``cluster``) in a second pytest session
beside it, niced so that the first keeps the CPU it asks for.

``EVENTFLEET_TEST_PHASE=local`` keeps the tests that do not use the ``real_cluster``
fixture, ``cluster`` keeps the ones that do; unset (a developer running pytest by hand),
both run in one session as before. Loaded with ``-p tests.phases``.
"""

from __future__ import annotations

import os

import pytest

PHASE_ENV = "EVENTFLEET_TEST_PHASE"
PHASES = ("local", "cluster")


def on_cluster(item: pytest.Item) -> bool:
    """Whether the test runs on the real cluster (it uses the session's cluster fixture)."""
    return "real_cluster" in getattr(item, "fixturenames", ())


def phase(environ: dict[str, str] | None = None) -> str | None:
    """The phase this session runs (None: every test)."""
    raw = (os.environ if environ is None else environ).get(PHASE_ENV, "")
    if not raw:
        return None
    if raw not in PHASES:
        raise pytest.UsageError(f"{PHASE_ENV}={raw!r}: not a phase; known: {', '.join(PHASES)}")
    return raw


def pytest_configure(config: pytest.Config) -> None:
    phase()  # a misspelt phase stops the run before it starts


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = phase()
    if chosen is None:
        return
    keep = [i for i in items if on_cluster(i) == (chosen == "cluster")]
    dropped = [i for i in items if on_cluster(i) != (chosen == "cluster")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str | None:
    chosen = phase()
    if chosen is None:
        return None
    what = "the tests on the real cluster" if chosen == "cluster" else "every test off the cluster"
    return f"eventfleet test phase: {chosen} ({what})"
