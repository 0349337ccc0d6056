"""Typed configuration of the ``bus`` section (schema and defaults: schema.json)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

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

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> BusConfig:
        """From a validated section with defaults filled in (every key present)."""
        missing = [f.name for f in fields(cls) if f.name not in section]
        if missing:
            raise ValueError(f"bus section lacks {', '.join(missing)} (defaults not filled?)")
        return cls(**{f.name: section[f.name] for f in fields(cls)})
