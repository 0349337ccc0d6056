"""Typed configuration of the replication section (schema and defaults: schema.json)."""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from eventfleet_server.config.model import AdmissionConfig
from eventfleet_server.config.typed import build

SCHEMA: dict = json.loads((importlib.resources.files(__package__) / "schema.json").read_text())


def fill_defaults(schema: Mapping, value: Any) -> Any:
    """`value` with every missing key that has a schema ``default`` filled in (deep)."""
    if isinstance(value, Mapping) and schema.get("type") == "object":
        out = dict(value)
        for key, sub in schema.get("properties", {}).items():
            if key not in out and "default" in sub:
                out[key] = json.loads(json.dumps(sub["default"]))
            if key in out:
                out[key] = fill_defaults(sub, out[key])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [fill_defaults(schema["items"], v) for v in value]
    return value


def _flags(value: Any) -> dict[str, bool] | None:
    """``{name: {update: bool}}`` (as configured) -> ``{name: updatable}``."""
    if value is None:
        return None
    return {
        name: (spec if isinstance(spec, bool) else bool(spec.get("update", False)))
        for name, spec in dict(value).items()
    }


@dataclass(frozen=True)
class TableConfig:
    name: str
    key: str
    columns: dict[str, bool] | None  # column -> updatable; None = any column, all updatable
    add: bool
    delete: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", _flags(self.columns))


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    url: str
    failover_urls: tuple[str, ...]
    table: str
    local_table: str | None  # None: the same name as `table`
    key: str
    columns: dict[str, bool]
    add: bool
    delete: bool
    app: str
    domain: str
    sip: str
    dn: str
    guid: str
    info: str | None
    password_file: str | None
    window: int
    reconnect_min_delay: float
    reconnect_max_delay: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", _flags(self.columns) or {})
        if not self.local_table:
            object.__setattr__(self, "local_table", self.table)


@dataclass(frozen=True)
class ReplicationConfig:
    enabled: bool
    path: str
    type_prefix: tuple[str, ...]
    tables: tuple[TableConfig, ...]
    users_file: str | None
    password_file: str | None
    challenge_ttl: float
    failed_login_limit: int
    failed_login_window: float
    max_message_size: int
    max_send_queue: int
    admission: AdmissionConfig
    upstreams: tuple[UpstreamConfig, ...]

    def __post_init__(self) -> None:
        """Checks the schema cannot express; errors name the entry."""
        names = [t.name for t in self.tables]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"replication.tables: table {name!r} is listed twice")
        up_names = [u.name for u in self.upstreams]
        for u in self.upstreams:
            if up_names.count(u.name) > 1:
                raise ValueError(f"replication.upstreams: name {u.name!r} is used twice")
            if u.local_table not in names:
                raise ValueError(
                    f"replication.upstreams[{u.name}]: local table {u.local_table!r} is not "
                    f"in replication.tables {names}"
                )

    @classmethod
    def from_mapping(cls, m: Mapping) -> ReplicationConfig:
        """Validate the section against the fragment, fill its defaults, build it."""
        validator = jsonschema.Draft202012Validator(SCHEMA)
        errors = sorted(validator.iter_errors(dict(m)), key=lambda e: list(e.absolute_path))
        if errors:
            where = ".".join(["replication", *(str(p) for p in errors[0].absolute_path)])
            raise ValueError(f"{where}: {errors[0].message}")
        return build(cls, fill_defaults(SCHEMA, dict(m)))
