"""Typed configuration of the ``bus`` section (schema and defaults: schema.json)."""

from __future__ import annotations

from dataclasses import dataclass

from eventfleet_server.bus.wire import IntegerEncoding


@dataclass(frozen=True)
class BusConfig:
    enabled: bool
    port: int
    integer_encoding: IntegerEncoding
    max_message_size: int
    pub_hwm: int
    snapshot_hwm: int
    snapshot_stall_timeout: float
    max_concurrent_snapshots: int
    max_pending_snapshots: int
    max_batch: int
    dedup_memory: int

    def __post_init__(self) -> None:
        # Built by `config.typed.build` from the raw (validated) section: a string here.
        object.__setattr__(self, "integer_encoding", IntegerEncoding(self.integer_encoding))
