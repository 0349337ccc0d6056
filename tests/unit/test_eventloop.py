"""The replica's event loop choice (uvloop by default where installed)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from eventfleet_server import config, eventloop

from tests import parts


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__


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
