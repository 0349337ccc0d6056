"""The plug-in interface is declared, not duck-typed: every protocol of the registry
creates a `ProtocolServer` subclass, a subclass missing a method fails at creation
naming it, and the optional hooks have their documented defaults."""

from __future__ import annotations

import importlib
import typing

import pytest
from eventfleet_server import registry
from eventfleet_server.plugin import ProtocolServer


@pytest.mark.parametrize("entry", [pytest.param(e, id=e.name) for e in registry.PROTOCOLS])
def test_every_registered_plugin_implements_the_interface(entry):
    module = importlib.import_module(entry.plugin)
    cls = typing.get_type_hints(module.create)["return"]
    assert issubclass(cls, ProtocolServer), entry.plugin
    assert not cls.__abstractmethods__, (entry.plugin, cls.__abstractmethods__)
    assert cls.name == entry.name


class Incomplete(ProtocolServer):
    name = "incomplete"

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def connection_count(self) -> int:
        return 0

    @property
    def rejected(self) -> dict[str, int]:
        return {}

    def health(self) -> str | None:
        return None


def test_a_missing_method_fails_at_creation_naming_it():
    with pytest.raises(TypeError, match="describe"):
        Incomplete()


async def test_the_optional_hooks_default_to_nothing():
    class Minimal(Incomplete):
        def describe(self) -> dict:
            return {}

    proto = Minimal()
    assert await proto.prepare(engine=None) is None
    proto.reload("SIGHUP")  # nothing to re-read, nothing raised
    assert proto.initial_sync_done is True
    assert proto.peer_states() == []
