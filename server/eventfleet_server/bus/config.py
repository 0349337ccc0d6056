"""Typed configuration of the ``bus`` section (schema and defaults: schema.json)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from eventfleet_server.bus.wire import IntegerEncoding
from eventfleet_server.config.loader import ConfigError


class CurveError(ConfigError):
    """CURVE settings or a key file that cannot be used; the message names the key, the
    file and why."""


@dataclass(frozen=True)
class CurveConfig:
    """The ``bus.curve`` section (schema and defaults: bus/schema.json)."""

    enabled: bool
    secret_key_file: str | None
    allowed_keys: str | None
    tokens: bool
    plain_port: int | None
    plain_networks: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if not self.secret_key_file:
            raise CurveError("bus.curve.secret_key_file: required when bus.curve.enabled")
        if not self.allowed_keys and not self.tokens:
            raise CurveError(
                "bus.curve: no client could connect (allowed_keys unset and tokens false)"
            )
        for net in self.plain_networks:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError as e:
                raise CurveError(f"bus.curve.plain_networks: {net!r} is not a network: {e}") from e


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
    curve: CurveConfig

    def __post_init__(self) -> None:
        # Built by `config.typed.build` from the raw (validated) section: a string here.
        object.__setattr__(self, "integer_encoding", IntegerEncoding(self.integer_encoding))
        plain = self.curve.plain_port if self.curve.enabled else None
        if plain and self.port and abs(plain - self.port) < 3:
            raise CurveError(
                f"bus.curve.plain_port: {plain} overlaps the CURVE ports "
                f"{self.port}..{self.port + 2}"
            )
