"""e2e session hooks: the part names checked before the run starts, the missing-parts
summary at its end, and the developer-only kind test deselected."""

from __future__ import annotations

import os

import pytest

from tests import parts


def pytest_configure(config: pytest.Config) -> None:
    parts.allowed_missing()  # a misspelt part name stops the run before it starts
    config.addinivalue_line(
        "markers",
        "kind: developer-only test on a real kind cluster (Docker); deselected unless "
        "EVENTFLEET_KIND_E2E=1",
    )


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    parts.terminal_summary(terminalreporter, config)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
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
