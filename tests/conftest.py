"""Shared fixtures: in-process replicas on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import contextlib

import pytest
from eventfleet_server import config
from eventfleet_server.main import Replica
from hypothesis import settings

from tests import parts

# Hypothesis' default 200 ms deadline per example is a timed assertion: on the shared
# 2-core CI machine a slow example failed a property that held (test_bus_sbs, once).
# Properties here check results; a test that wants a hang detector sets its own deadline
# (tests/fuzz/test_decoders.py does).
settings.register_profile("eventfleet", deadline=None)
settings.load_profile("eventfleet")


@contextlib.asynccontextmanager
async def running_replica(data_dir, *, server_id=1, token=None, **overrides):
    """Start a replica in this process (Eventer on an ephemeral port) and stop it after."""
    conf = config.load(
        None,
        environ={},
        overrides=config.merge(
            {
                "server_id": server_id,
                "data_dir": str(data_dir),
                "eventer": {"port": 0},
                "syncer": {"port": 0},
                "http": {"port": 0},
                "bus": {"port": 0, "enabled": False},
            },
            overrides,
        ),
    )
    replica = Replica(conf, token)
    try:
        await replica.start()
        yield replica
    finally:
        # Also after a failed start: whatever did start is stopped (the engine's writer
        # among it), as `eventfleet_server.main.run` does.
        await replica.stop()


@pytest.fixture
async def replica(tmp_path):
    async with running_replica(tmp_path / "r1") as r:
        yield r


def pytest_configure(config):
    parts.allowed_missing()  # a misspelt part name stops the run before it starts


def pytest_terminal_summary(terminalreporter, config):
    parts.terminal_summary(terminalreporter, config)
