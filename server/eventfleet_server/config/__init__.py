"""Replica configuration: one YAML file validated against ``schema.json``.

Precedence: defaults < file < environment (what Kubernetes injects) < command-line flags.
"""

from eventfleet_server.config.loader import (
    DEFAULTS,
    ConfigError,
    load,
    load_file,
    merge,
    read_token,
    server_id_from_pod_name,
)

__all__ = [
    "DEFAULTS",
    "ConfigError",
    "load",
    "load_file",
    "merge",
    "read_token",
    "server_id_from_pod_name",
]
