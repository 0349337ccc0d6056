"""Guard for the two fixture sets of the operator e2e tests.

``e2e.k8s.cluster_fixtures`` (the real control plane) is a global plugin; the API
emulator's fixtures (``e2e.k8s.fixtures``) are imported into the emulator modules only.
They share names (``kubectl``, ``operator``, ``kubelet``...), and a fixture registered
by a second global plugin would silently replace the first one for every test of the
run: a "real control plane" test would then pass against the emulator. This check
fails the collection instead, naming the test and where its fixtures come from.
"""

from __future__ import annotations

import os

import pytest

from tests import parts

_SHARED = ("kubectl", "operator", "kubelet", "namespace", "emulator")


def pytest_configure(config: pytest.Config) -> None:
    parts.allowed_missing()  # a misspelt part name stops the run before it starts
    config.addinivalue_line(
        "markers",
        "kind: developer-only test on a real kind cluster (Docker); deselected unless "
        "EVENTFLEET_KIND_E2E=1",
    )


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    parts.terminal_summary(terminalreporter, config)


def _deselect_kind(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The kind test needs Docker, which CI machines do not have: it is opt-in.

    Deselected (not skipped) without EVENTFLEET_KIND_E2E=1, so a CI run's skip count stays
    an honest count of missing parts (zero).
    """
    if os.environ.get("EVENTFLEET_KIND_E2E") == "1":
        return
    kind = [i for i in items if i.get_closest_marker("kind")]
    if kind:
        items[:] = [i for i in items if not i.get_closest_marker("kind")]
        config.hook.pytest_deselected(items=kind)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    _deselect_kind(config, items)
    wrong = []
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        plugins = getattr(module, "pytest_plugins", ())
        expected = "e2e.k8s.cluster_fixtures" if "e2e.k8s.cluster_fixtures" in plugins else None
        if expected is None and getattr(module, "emulator", None) is not None:
            expected = "e2e.k8s.fixtures"
        if expected is None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        for name in _SHARED:
            defs = info.name2fixturedefs.get(name) if info else None
            if not defs:
                continue
            actual = getattr(defs[-1].func, "__module__", "?")
            if actual != expected:
                wrong.append(f"{item.nodeid}: {name} from {actual}, expected {expected}")
    if wrong:
        raise pytest.UsageError("e2e fixtures resolve to the wrong platform:\n" + "\n".join(wrong))
