"""Typed configuration of the ``echo`` section (schema and defaults: schema.json)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EchoConfig:
    enabled: bool
    port: int
