"""The protocol registry: the one table of the protocols a replica can serve.

Read by the replica (`eventfleet_server.main` creates the plug-ins in this order, the
configuration loader finds each protocol's ``schema.json`` in its package) and by the
operator (`eventfleet_operator.constants.PROTOCOL_PORTS`: container ports, Services,
``spec.ports`` defaults, which protocols ``spec.protocols.<name>.enabled`` switches). The
CRD is checked against it by tests/unit/operator/test_op_registry.py, so none of those
places keeps a copy of its own.

Pure data and no imports on purpose: the operator reads it without importing the
replica's server side (the import contract allows exactly this module).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProtocolEntry:
    """One protocol.

    `name` is its package (``eventfleet_server/<name>/`` for the built-in ones), its
    configuration section and its key under the CRD's ``spec.ports`` (when it has a port)
    and ``spec.protocols`` (when it is `optional`). `plugin` is the module with
    ``CONFIG`` and ``create(config, ctx)``; `package` the one with ``schema.json``.
    `port` is the default first port of its own listener, None for a protocol served on
    the HTTP port (websockets); a block of `width` ports is named `port_names` on
    Kubernetes. `services` are the Kubernetes Services that expose its ports (``client``,
    ``peers``). `optional` protocols can be switched off (``enabled`` in the section),
    `enabled_by_default` says whether they are on when nothing is said.
    """

    name: str
    plugin: str
    port: int | None = None
    width: int = 1
    port_names: tuple[str, ...] = ()
    services: tuple[str, ...] = ("client",)
    optional: bool = False
    enabled_by_default: bool = True

    @property
    def package(self) -> str:
        """The package that ships ``schema.json`` (the plug-in module's package)."""
        return self.plugin.rpartition(".")[0]


# In start order (Eventer first: clients connect while the Syncer catches up; the BUS
# last). Adding a protocol: docs/architecture.md, "Adding a protocol".
PROTOCOLS: tuple[ProtocolEntry, ...] = (
    ProtocolEntry("eventer", "eventfleet_server.eventer.plugin", port=23012),
    ProtocolEntry("syncer", "eventfleet_server.syncer.plugin", port=23013, services=("peers",)),
    ProtocolEntry(
        "replication",
        "eventfleet_server.replication.plugin",
        optional=True,
        enabled_by_default=False,
    ),
    ProtocolEntry("jetstream", "eventfleet_server.jetstream.plugin", optional=True),
    # SNAPSHOT, PUBLISHER, COLLECTOR at port, port+1, port+2 (ZeroMQ clone pattern).
    ProtocolEntry(
        "bus",
        "eventfleet_server.bus.plugin",
        port=23030,
        width=3,
        port_names=("bus-snapshot", "bus-publisher", "bus-collector"),
        optional=True,
    ),
)


def entry(name: str) -> ProtocolEntry:
    """The registry entry of protocol `name`; ``KeyError`` naming it if there is none."""
    for e in PROTOCOLS:
        if e.name == name:
            return e
    raise KeyError(f"no protocol {name!r} in the registry")
