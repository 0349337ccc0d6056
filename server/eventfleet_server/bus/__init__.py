"""The Event BUS (micro-toolkit RFC, a ZeroMQ clone pattern): SNAPSHOT, PUBLISHER and
COLLECTOR sockets on ports P, P+1, P+2. See docs/bus.md.

`wire` (frames) and `mapping` (events <-> BUS records) are engine-free and ZeroMQ-free;
`server` owns the sockets and talks to a `BusHandler`; `curve` is CURVE's keys, ZAP
decisions and reload, `listeners` the listening sockets a key rotation renews; `adapter`
is the handler over the engine; `plugin` is the factory the replica's protocol table
uses. ZeroMQ is imported only in this package.
"""

from __future__ import annotations

import json
import pathlib

from eventfleet_server.bus.config import BusConfig
from eventfleet_server.bus.plugin import create

CONFIG = BusConfig
SCHEMA = json.loads((pathlib.Path(__file__).parent / "schema.json").read_text())

__all__ = ["CONFIG", "SCHEMA", "BusConfig", "create"]
