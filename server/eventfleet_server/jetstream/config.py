"""Typed configuration of the ``jetstream`` section (schema and defaults: schema.json).

No defaults here: they live only in ``schema.json``, which the config loader splices in
and fills before the section is built. What the schema cannot check (the regular
expression, the classes referring to each other) is checked on construction.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventfleet_server.config.model import AdmissionConfig
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
    compress: bool
    client_bundle: str | None
    admission: AdmissionConfig

    def __post_init__(self) -> None:
        try:
            re.compile(self.scope_pattern)
        except re.error as e:
            raise ValueError(f"jetstream.scope_pattern {self.scope_pattern!r}: {e}") from e
        if self.path != "/" and self.path.endswith("/"):
            raise ValueError(f"jetstream.path {self.path!r} must not end with '/'")
        try:
            self.model_schema()
        except SchemaError as e:
            raise ValueError(f"jetstream.classes: {e}") from e

    def model_schema(self) -> ModelSchema:
        return ModelSchema.parse(self.classes, self.root_class)
