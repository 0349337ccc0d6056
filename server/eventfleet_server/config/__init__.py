"""Replica configuration: one YAML file validated against ``schema.json`` plus the
schema fragment of each protocol package; defaults live in the schemas only.

Precedence: defaults < file < environment (what Kubernetes injects) < command-line flags.
"""

from eventfleet_server.config.loader import (
    SCHEMA,
    ConfigError,
    defaults,
    fill_defaults,
    load,
    load_file,
    merge,
    read_credentials,
    read_token,
    server_id_from_pod_name,
)
from eventfleet_server.config.model import (
    AdmissionConfig,
    HttpConfig,
    LogConfig,
    ReplicaConfig,
    RetentionConfig,
    StorageConfig,
)
from eventfleet_server.config.typed import build

__all__ = [
    "SCHEMA",
    "AdmissionConfig",
    "ConfigError",
    "HttpConfig",
    "LogConfig",
    "ReplicaConfig",
    "RetentionConfig",
    "StorageConfig",
    "build",
    "defaults",
    "fill_defaults",
    "load",
    "load_file",
    "merge",
    "read_credentials",
    "read_token",
    "server_id_from_pod_name",
]
