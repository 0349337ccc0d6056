"""The replica's event loop choice (uvloop by default where installed)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from eventfleet_server import config, eventloop

from tests import parts


@pytest.fixture(autouse=True)
def _keep_switch_interval():
    # `eventloop.run` sets the process's switch interval; the test process keeps its own.
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__


async def _switch_interval() -> float:
    return sys.getswitchinterval()


def test_the_replica_runs_with_a_short_gil_switch_interval():
    """The writer thread gets the GIL back within SWITCH_INTERVAL of each SQLite step,
    not Python's default 5 ms (the Syncer catch-up convoy, see `eventloop`)."""
    sys.setswitchinterval(0.005)
    assert eventloop.run(_switch_interval(), "asyncio") == pytest.approx(eventloop.SWITCH_INTERVAL)
    assert eventloop.SWITCH_INTERVAL < 0.005


def test_auto_runs_on_uvloop_when_installed():
    parts.require_module("uvloop", "uvloop")
    assert eventloop.run(_loop_type(), "auto").startswith("uvloop")
    assert eventloop.run(_loop_type(), "uvloop").startswith("uvloop")


def test_asyncio_runs_on_the_stock_loop():
    assert eventloop.run(_loop_type(), "asyncio").startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch):
    # None in sys.modules makes `import uvloop` raise ImportError, as if not installed.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert eventloop.loop_factory("auto") == ("asyncio", None)
    with pytest.raises(eventloop.EventLoopError, match="install it"):
        eventloop.loop_factory("uvloop")


def test_a_bad_choice_is_refused_by_the_schema_naming_the_key():
    with pytest.raises(config.ConfigError, match="event_loop"):
        config.load(None, environ={}, overrides={"event_loop": "trio"})
    assert config.load(None, environ={})["event_loop"] == "auto"
