"""Operator settings: command-line options, with environment variables as defaults.

Every option has an ``EVENTFLEET_OPERATOR_*`` variable so that ``kopf run -m
eventfleet_operator.kopf_module`` (which has no options of ours) is configurable too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from eventfleet_operator.replicas import DEFAULT_URL_TEMPLATE

ENV_PREFIX = "EVENTFLEET_OPERATOR_"


class ConfigError(ValueError):
    """A bad operator setting; the message names the option and its variable."""


def _labels(text: str | None) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` (EVENTFLEET_OPERATOR_SELF_LABELS) as sorted pairs."""
    pairs = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            raise ConfigError(f"{ENV_PREFIX}SELF_LABELS: {item!r} is not key=value")
        pairs.append((key, value))
    return tuple(sorted(pairs))


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    resync_seconds: float = 30.0  # the level-based timer: drift is repaired within this
    replica_url_template: str = DEFAULT_URL_TEMPLATE
    replica_urls_file: str | None = None
    status_timeout: float = 3.0
    flush_timeout: float = 15.0
    api_timeout: float = 30.0
    liveness_endpoint: str | None = None
    peering_name: str | None = None  # None: standalone (one operator replica)
    metrics_endpoint: str | None = None  # e.g. http://0.0.0.0:9090/metrics
    # Who the operator is, for the fleets' NetworkPolicy (HTTP admin only from it):
    # its namespace (the chart's POD_NAMESPACE; None: any namespace) and pod labels.
    self_namespace: str | None = None
    self_labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/name", "eventfleet-operator"),)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: object
    ) -> OperatorConfig:
        env = os.environ if environ is None else environ

        def get(key: str) -> str | None:
            value = env.get(ENV_PREFIX + key)
            return value if value not in (None, "") else None

        def number(key: str, default: float) -> float:
            raw = get(key)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"{ENV_PREFIX}{key}={raw!r} is not a number") from None
            if value <= 0:
                raise ConfigError(f"{ENV_PREFIX}{key}={raw!r} must be positive")
            return value

        namespaces = tuple(n for n in (get("NAMESPACES") or "").replace(",", " ").split() if n)
        values: dict[str, object] = {
            "namespaces": namespaces,
            "all_namespaces": (get("ALL_NAMESPACES") or "").lower() in ("1", "true", "yes"),
            "resync_seconds": number("RESYNC_SECONDS", cls.resync_seconds),
            "replica_url_template": get("REPLICA_URL_TEMPLATE") or DEFAULT_URL_TEMPLATE,
            "replica_urls_file": get("REPLICA_URLS_FILE"),
            "status_timeout": number("STATUS_TIMEOUT", cls.status_timeout),
            "flush_timeout": number("FLUSH_TIMEOUT", cls.flush_timeout),
            "api_timeout": number("API_TIMEOUT", cls.api_timeout),
            "liveness_endpoint": get("LIVENESS"),
            "peering_name": get("PEERING"),
            "metrics_endpoint": get("METRICS"),
            "self_namespace": get("SELF_NAMESPACE") or env.get("POD_NAMESPACE") or None,
            "self_labels": _labels(get("SELF_LABELS")) or cls.self_labels,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        config = cls(**values)  # type: ignore[arg-type]
        config.check()
        return config

    def check(self) -> None:
        if self.namespaces and self.all_namespaces:
            raise ConfigError("--namespace and --all-namespaces exclude each other")
        if not any(
            "{" + k + "}" in self.replica_url_template for k in ("pod", "ordinal", "server_id")
        ):
            raise ConfigError(
                f"--replica-url-template {self.replica_url_template!r} must name the replica: "
                "use {pod}, {ordinal} or {server_id}"
            )
        if self.metrics_endpoint and not self.metrics_endpoint.startswith("http://"):
            raise ConfigError(
                f"--metrics {self.metrics_endpoint!r}: expected http://HOST:PORT/PATH"
            )
        if self.resync_seconds <= 0:
            raise ConfigError("--resync-seconds must be positive")
