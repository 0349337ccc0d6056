"""Load, merge and validate replica configuration."""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import jsonschema
import yaml

from eventfleet_server import registry
from eventfleet_server.listener import parse_tokens


def _compose_schema() -> dict:
    """The core schema plus one section per package that ships a ``schema.json``.

    Each protocol package owns the schema of its section (`eventfleet_server/<name>/
    schema.json`, section name = package name; for a registered protocol outside
    `eventfleet_server`, its package's ``schema.json``), defaults included: adding a
    protocol adds its section without touching this module. The fragments are read as package
    data, without importing the protocol packages (this layer sits below them).
    """
    root = importlib.resources.files("eventfleet_server")
    schema = json.loads((root / "config" / "schema.json").read_text())
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        fragment = entry / "schema.json"
        if entry.name == "config" or not entry.is_dir() or not fragment.is_file():
            continue
        if entry.name in schema["properties"]:
            raise RuntimeError(f"config section {entry.name!r} is defined twice")
        section = json.loads(fragment.read_text())
        section.pop("$schema", None)
        schema["properties"][entry.name] = section
    # A registered protocol whose package lives elsewhere (an example or a third party):
    # its section comes from its own package's schema.json, the same way.
    for protocol in registry.PROTOCOLS:
        if protocol.name in schema["properties"]:
            continue
        fragment = importlib.resources.files(protocol.package) / "schema.json"
        section = json.loads(fragment.read_text())
        section.pop("$schema", None)
        schema["properties"][protocol.name] = section
    return schema


SCHEMA = _compose_schema()


def fill_defaults(schema: Mapping, data: Any) -> Any:
    """`data` with every missing key that has a schema ``default`` filled in, recursively.

    The schema's ``default`` values are the only copy of the defaults: the typed
    configuration dataclasses have none.
    """
    if not isinstance(data, dict) or schema.get("type") != "object":
        if isinstance(data, list) and isinstance(schema.get("items"), Mapping):
            return [fill_defaults(schema["items"], item) for item in data]
        return data
    out = dict(data)
    for key, sub in schema.get("properties", {}).items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = fill_defaults(sub, out[key])
    return out


def defaults() -> dict:
    """The complete default configuration."""
    return fill_defaults(SCHEMA, {})


class ConfigError(Exception):
    """Invalid configuration; the message names the key and the bad value."""


def merge(base: Mapping, override: Mapping) -> dict:
    """Deep-merge mappings; lists and scalars in `override` replace those in `base`."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# Protocol sections the schema accepts but this version does not implement.
UNIMPLEMENTED_PROTOCOLS: dict[str, str] = {}


def check_implemented(conf: Mapping) -> None:
    """Refuse a configuration that enables a protocol this version does not implement."""
    for key, name in UNIMPLEMENTED_PROTOCOLS.items():
        section = conf.get(key)
        if isinstance(section, Mapping) and section.get("enabled"):
            raise ConfigError(
                f"{key}.enabled: true is not supported: {name} is not implemented in this "
                f"version; set {key}.enabled to false or remove it"
            )


def validate(conf: Mapping, source: str = "configuration") -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = sorted(validator.iter_errors(conf), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
            lines.append(f"{where}: {err.message}")
        raise ConfigError(f"{source} is invalid:\n  " + "\n  ".join(lines))


def load_file(path: pathlib.Path) -> dict:
    """Read and validate one YAML file (not merged with defaults)."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read configuration file {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text: {e}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    validate(data, str(path))
    return data


def server_id_from_pod_name(pod_name: str) -> int:
    """StatefulSet pod ``name-N`` → server id N + 1."""
    match = re.search(r"-(\d+)$", pod_name)
    if not match:
        raise ConfigError(f"EVENTFLEET_POD_NAME={pod_name!r} does not end in -<ordinal>")
    return int(match.group(1)) + 1


def env_overrides(environ: Mapping[str, str]) -> dict:
    out: dict[str, Any] = {}
    if environ.get("EVENTFLEET_POD_NAME"):
        out["server_id"] = server_id_from_pod_name(environ["EVENTFLEET_POD_NAME"])
    if environ.get("EVENTFLEET_SERVER_ID"):
        try:
            out["server_id"] = int(environ["EVENTFLEET_SERVER_ID"])
        except ValueError as e:
            raise ConfigError(
                f"EVENTFLEET_SERVER_ID={environ['EVENTFLEET_SERVER_ID']!r} is not an integer"
            ) from e
    if environ.get("EVENTFLEET_TOKEN_FILE"):
        out["token_file"] = environ["EVENTFLEET_TOKEN_FILE"]
    if environ.get("EVENTFLEET_PEER_TOKEN_FILE"):
        out["peer_token_file"] = environ["EVENTFLEET_PEER_TOKEN_FILE"]
    return out


def load(
    path: pathlib.Path | None = None,
    *,
    overrides: Mapping | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict:
    """Defaults < file < environment < `overrides` (flags), validated as a whole."""
    conf: dict = {}
    if path is not None:
        conf = load_file(path)
    conf = merge(conf, env_overrides(os.environ if environ is None else environ))
    if overrides:
        conf = merge(conf, overrides)
    validate(conf)
    conf = fill_defaults(SCHEMA, conf)
    validate(conf)
    check_implemented(conf)
    check_peers(conf.get("peers", []))
    return conf


def check_peers(peers: list) -> None:
    """Peer names and server ids must be unique (the schema cannot say so)."""
    names: set = set()
    ids: set = set()
    for i, peer in enumerate(peers):
        if peer["name"] in names:
            raise ConfigError(f"peers[{i}]: name {peer['name']!r} appears twice")
        if peer["server_id"] in ids:
            raise ConfigError(
                f"peers[{i}] ({peer['name']}): server_id {peer['server_id']} appears twice"
            )
        names.add(peer["name"])
        ids.add(peer["server_id"])


def read_token(conf: Mapping, environ: Mapping[str, str] | None = None) -> str | None:
    """The (first) client token from ``EVENTFLEET_TOKEN`` or ``token_file``; never from
    a flag."""
    client, _ = read_credentials(conf, environ)
    return client[0] if client else None


def read_credentials(
    conf: Mapping, environ: Mapping[str, str] | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(client tokens, peer tokens)`` from the environment or the token files.

    ``EVENTFLEET_TOKEN`` / ``EVENTFLEET_PEER_TOKEN`` (one token each) win over
    ``token_file`` / ``peer_token_file`` (one token per line, see `parse_tokens`). Peer
    tokens default to the client tokens. Raises `ConfigError` naming an unreadable or
    empty file.
    """
    environ = os.environ if environ is None else environ
    client = _tokens_from(environ.get("EVENTFLEET_TOKEN"), conf.get("token_file"), "token_file")
    peer = _tokens_from(
        environ.get("EVENTFLEET_PEER_TOKEN"), conf.get("peer_token_file"), "peer_token_file"
    )
    return client, peer or client


def _tokens_from(value: str | None, path: str | None, key: str) -> tuple[str, ...]:
    if value:
        return parse_tokens(value)
    if not path:
        return ()
    try:
        text = pathlib.Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{key} {path}: {e.strerror}") from e
    except UnicodeDecodeError:
        raise ConfigError(f"{key} {path} is not UTF-8 text") from None
    tokens = parse_tokens(text)
    if not tokens:
        raise ConfigError(f"{key} {path} is empty (no token in it)")
    return tokens
