"""Configuration of the replication section (defaults live only in ``schema.json``)."""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

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


def _columns(value: Mapping | None) -> dict[str, bool] | None:
    if value is None:
        return None
    return {name: bool(spec.get("update", False)) for name, spec in value.items()}


@dataclass(frozen=True)
class TableConfig:
    name: str
    key: str
    columns: dict[str, bool] | None  # column -> updatable; None = any column, all updatable
    add: bool
    delete: bool


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    url: str
    failover_urls: tuple[str, ...]
    table: str
    local_table: str
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


@dataclass(frozen=True)
class ReplicationConfig:
    enabled: bool
    path: str
    type_prefix: tuple[str, ...]
    tables: tuple[TableConfig, ...]
    users_file: str | None
    password_file: str | None
    challenge_ttl: float
    login_timeout: float
    failed_login_limit: int
    failed_login_window: float
    max_message_size: int
    max_send_queue: int
    max_connections: int
    max_connections_per_address: int
    upstreams: tuple[UpstreamConfig, ...]

    @classmethod
    def from_mapping(cls, m: Mapping) -> ReplicationConfig:
        """Build from the (schema-validated) section; missing keys take schema defaults."""
        validator = jsonschema.Draft202012Validator(SCHEMA)
        errors = sorted(validator.iter_errors(dict(m)), key=lambda e: list(e.absolute_path))
        if errors:
            where = ".".join(str(p) for p in errors[0].absolute_path)
            raise ValueError(
                f"replication.{where}: {errors[0].message}".replace("replication.:", "replication:")
            )
        m = fill_defaults(SCHEMA, dict(m))
        tables = tuple(
            TableConfig(t["name"], t["key"], _columns(t["columns"]), t["add"], t["del"])
            for t in m["tables"]
        )
        names = [t.name for t in tables]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"replication.tables: table {name!r} is listed twice")
        upstreams = tuple(
            UpstreamConfig(
                name=u["name"],
                url=u["url"],
                failover_urls=tuple(u["failover_urls"]),
                table=u["table"],
                local_table=u["local_table"] or u["table"],
                key=u["key"],
                columns=_columns(u["columns"]) or {},
                add=u["add"],
                delete=u["del"],
                app=u["app"],
                domain=u["domain"],
                sip=u["sip"],
                dn=u["dn"],
                guid=u["guid"],
                info=u["info"],
                password_file=u["password_file"],
                window=u["window"],
                reconnect_min_delay=u["reconnect_min_delay"],
                reconnect_max_delay=u["reconnect_max_delay"],
            )
            for u in m["upstreams"]
        )
        up_names = [u.name for u in upstreams]
        for u in upstreams:
            if up_names.count(u.name) > 1:
                raise ValueError(f"replication.upstreams: name {u.name!r} is used twice")
            if u.local_table not in names:
                raise ValueError(
                    f"replication.upstreams[{u.name}]: local table {u.local_table!r} is not "
                    f"in replication.tables {names}"
                )
        return cls(
            enabled=m["enabled"],
            path=m["path"],
            type_prefix=tuple(m["type_prefix"]),
            tables=tables,
            users_file=m["users_file"],
            password_file=m["password_file"],
            challenge_ttl=float(m["challenge_ttl"]),
            login_timeout=float(m["login_timeout"]),
            failed_login_limit=m["failed_login_limit"],
            failed_login_window=float(m["failed_login_window"]),
            max_message_size=m["max_message_size"],
            max_send_queue=m["max_send_queue"],
            max_connections=m["max_connections"],
            max_connections_per_address=m["max_connections_per_address"],
            upstreams=upstreams,
        )
