"""Typed configuration of the Syncer section (schema and defaults: schema.json)."""

from __future__ import annotations

from dataclasses import dataclass

from eventfleet_server.config.model import AdmissionConfig


@dataclass(frozen=True)
class SyncerConfig:
    port: int
    subscriptions: tuple[tuple[str, ...], ...]
    client_name: str | None
    bootstrap_timeout: float
    bootstrap_grace: float
    reconnect_min_delay: float
    reconnect_max_delay: float
    reload_interval: float
    max_msg_size: int
    max_queued_events: int
    max_buffered_events: int
    shutdown_flush_timeout: float
    max_known_server_ids: int
    admission: AdmissionConfig
