"""Typed configuration of the replica's core sections (protocol sections live in their
own packages, next to their schema fragment)."""

from __future__ import annotations

from dataclasses import dataclass

from eventfleet_server.listener import AdmissionLimits, TlsError, TlsSettings


@dataclass(frozen=True)
class AdmissionConfig:
    """The ``admission`` sub-section every listening protocol has (see the listener)."""

    max_connections: int
    max_connections_per_address: int
    max_pending: int
    max_pending_per_address: int
    pre_init_max_msg_size: int
    init_timeout: float

    def limits(self, max_msg_size: int) -> AdmissionLimits:
        """The listener's limits: these plus the section's size limit after init."""
        return AdmissionLimits(
            max_connections=self.max_connections,
            max_connections_per_address=self.max_connections_per_address,
            max_pending=self.max_pending,
            max_pending_per_address=self.max_pending_per_address,
            pre_init_max_msg_size=min(self.pre_init_max_msg_size, max_msg_size),
            max_msg_size=max_msg_size,
            init_timeout=self.init_timeout,
        )


@dataclass(frozen=True)
class RetentionConfig:
    max_age_seconds: float | None
    max_events: int | None
    check_interval_seconds: float

    @property
    def enabled(self) -> bool:
        return bool(self.max_age_seconds or self.max_events)


@dataclass(frozen=True)
class StorageConfig:
    synchronous: str
    max_uncommitted: int
    quick_check_timeout: float
    max_db_bytes: int | None
    retention: RetentionConfig


@dataclass(frozen=True)
class HttpConfig:
    host: str | None
    port: int


@dataclass(frozen=True)
class TlsConfig:
    enabled: bool
    cert_file: str | None
    key_file: str | None
    ca_file: str | None
    http: bool

    def settings(self) -> TlsSettings | None:
        """The listener layer's `TlsSettings`, None when TLS is off."""
        if not self.enabled:
            return None
        missing = [k for k in ("cert_file", "key_file", "ca_file") if not getattr(self, k)]
        if missing:
            raise TlsError(f"tls.enabled is true but tls.{', tls.'.join(missing)} not set")
        return TlsSettings(self.cert_file, self.key_file, self.ca_file)


@dataclass(frozen=True)
class LogConfig:
    level: str
    format: str


@dataclass(frozen=True)
class ReplicaConfig:
    """The core of a replica's configuration; protocol sections stay in `sections`."""

    server_id: int
    host: str
    data_dir: str
    token_file: str | None
    peer_token_file: str | None
    token_reload_interval: float
    stop_deadline: float
    allow_empty_start: bool
    event_loop: str
    storage: StorageConfig
    http: HttpConfig
    log: LogConfig
    tls: TlsConfig
