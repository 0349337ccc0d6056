"""The ``jetstream`` configuration section as a frozen dataclass.

No defaults here: they live only in ``schema.json``, which the config loader splices in
and fills before `JetstreamConfig.from_mapping` sees the section.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventfleet_server.jetstream.models import ModelSchema, SchemaError


@dataclass(frozen=True)
class JetstreamConfig:
    enabled: bool
    path: str
    type_prefix: tuple[str, ...]
    root_class: str
    classes: Mapping[str, Mapping[str, Any]]
    scope_pattern: str
    max_message_size: int
    max_fragments: int
    ping_interval: float
    session_expiry: float
    resend_buffer: int
    max_queued_messages: int
    client_bundle: str | None
    max_connections: int
    max_connections_per_address: int
    pre_init_max_msg_size: int
    init_timeout: float

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> JetstreamConfig:
        """Build from a validated, default-filled section; checks what the schema cannot."""
        adm = m["admission"]
        conf = cls(
            enabled=bool(m["enabled"]),
            path=m["path"].rstrip("/") or "/jetstream",
            type_prefix=tuple(m["type_prefix"]),
            root_class=m["root_class"],
            classes={k: dict(v) for k, v in m["classes"].items()},
            scope_pattern=m["scope_pattern"],
            max_message_size=int(m["max_message_size"]),
            max_fragments=int(m["max_fragments"]),
            ping_interval=float(m["ping_interval"]),
            session_expiry=float(m["session_expiry"]),
            resend_buffer=int(m["resend_buffer"]),
            max_queued_messages=int(m["max_queued_messages"]),
            client_bundle=m["client_bundle"],
            max_connections=int(adm["max_connections"]),
            max_connections_per_address=int(adm["max_connections_per_address"]),
            pre_init_max_msg_size=int(adm["pre_init_max_msg_size"]),
            init_timeout=float(adm["init_timeout"]),
        )
        try:
            re.compile(conf.scope_pattern)
        except re.error as e:
            raise ValueError(f"jetstream.scope_pattern {conf.scope_pattern!r}: {e}") from e
        try:
            conf.model_schema()
        except SchemaError as e:
            raise ValueError(f"jetstream.classes: {e}") from e
        return conf

    def model_schema(self) -> ModelSchema:
        return ModelSchema.parse(self.classes, self.root_class)
