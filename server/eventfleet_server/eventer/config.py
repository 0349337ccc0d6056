"""Typed configuration of the Eventer section (schema and defaults: schema.json)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventfleet_server.config.model import AdmissionConfig
from eventfleet_server.config.typed import build


@dataclass(frozen=True)
class EventerConfig:
    port: int
    max_msg_size: int
    max_queued_events: int
    max_results_cap: int
    ack_every: int
    ack_window: int
    admission: AdmissionConfig

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> EventerConfig:
        return build(cls, section)
