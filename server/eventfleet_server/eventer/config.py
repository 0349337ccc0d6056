"""Typed configuration of the Eventer section (schema and defaults: schema.json)."""

from __future__ import annotations

from dataclasses import dataclass

from eventfleet_server.config.model import AdmissionConfig


@dataclass(frozen=True)
class EventerConfig:
    port: int
    allow_tokenless_clients: bool
    tokenless_client_networks: tuple[str, ...]
    max_msg_size: int
    max_events_per_request: int
    max_payload_bytes: int
    max_type_segments: int
    max_segment_length: int
    max_latest_results: int
    max_write_buffer: int
    send_timeout: float
    max_queued_events: int
    max_results_cap: int
    ack_every: int
    ack_window: int
    admission: AdmissionConfig
