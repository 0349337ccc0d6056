"""Command line of the operator: ``eventfleet operator ...`` and ``python -m eventfleet_operator``.

Public entry points for the ``eventfleet`` console script (``eventfleet_cli``):

* :func:`add_arguments` - add the operator's options to an argparse (sub)parser;
* :func:`main_from_args` - run from the parsed namespace, returns an exit code;
* :func:`run` - run with plain Python arguments (blocks until SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from eventfleet_operator.config import ConfigError, OperatorConfig
from eventfleet_operator.replicas import DEFAULT_URL_TEMPLATE

LOG_FORMATS = ("plain", "full", "json")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the operator options (defaults from ``EVENTFLEET_OPERATOR_*`` variables)."""
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        metavar="NS",
        help="watch this namespace (repeatable; globs like 'team-*' work) "
        "[EVENTFLEET_OPERATOR_NAMESPACES]",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=None,
        help="watch every namespace (needs the ClusterRole) [EVENTFLEET_OPERATOR_ALL_NAMESPACES]",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        help="level-based resync interval: drift is repaired within this (default 30) "
        "[EVENTFLEET_OPERATOR_RESYNC_SECONDS]",
    )
    parser.add_argument(
        "--replica-url-template",
        help=f"where replica HTTP endpoints answer (default {DEFAULT_URL_TEMPLATE!r}; "
        "fields: pod, service, "
        "namespace, name, ordinal, server_id, port) [EVENTFLEET_OPERATOR_REPLICA_URL_TEMPLATE]",
    )
    parser.add_argument(
        "--replica-urls-file",
        help="JSON/YAML file mapping '<namespace>/<pod>' to a URL; wins over the template and is "
        "re-read on change [EVENTFLEET_OPERATOR_REPLICA_URLS_FILE]",
    )
    parser.add_argument(
        "--status-timeout", type=float, help="seconds for a replica /status call (default 3)"
    )
    parser.add_argument(
        "--flush-timeout", type=float, help="seconds for a replica /flush call (default 15)"
    )
    parser.add_argument(
        "--liveness",
        dest="liveness_endpoint",
        metavar="URL",
        help="serve Kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz "
        "[EVENTFLEET_OPERATOR_LIVENESS]",
    )
    parser.add_argument(
        "--peering",
        dest="peering_name",
        metavar="NAME",
        help="Kopf peering object for several operator replicas (default: standalone) "
        "[EVENTFLEET_OPERATOR_PEERING]",
    )
    parser.add_argument(
        "--metrics",
        dest="metrics_endpoint",
        metavar="URL",
        help="serve the operator's Prometheus metrics, e.g. http://0.0.0.0:9090/metrics "
        "[EVENTFLEET_OPERATOR_METRICS]",
    )
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default="full", help="log line format (default full)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def run(
    namespaces: Sequence[str] | None,
    all_namespaces: bool,
    *,
    resync_seconds: float | None = None,
    replica_url_template: str | None = None,
    replica_urls_file: str | None = None,
    status_timeout: float | None = None,
    flush_timeout: float | None = None,
    liveness_endpoint: str | None = None,
    peering_name: str | None = None,
    metrics_endpoint: str | None = None,
    log_format: str = "full",
    verbose: bool = False,
) -> None:
    """Run the operator until it is stopped. Arguments override the environment."""
    import kopf  # heavy import, only when really running

    from eventfleet_operator import handlers, probe_logs

    config = OperatorConfig.from_env(
        namespaces=tuple(namespaces) if namespaces else None,
        all_namespaces=all_namespaces or None,
        resync_seconds=resync_seconds,
        replica_url_template=replica_url_template,
        replica_urls_file=replica_urls_file,
        status_timeout=status_timeout,
        flush_timeout=flush_timeout,
        liveness_endpoint=liveness_endpoint,
        peering_name=peering_name,
        metrics_endpoint=metrics_endpoint,
    )
    if not config.namespaces and not config.all_namespaces:
        raise ConfigError(
            "say which namespaces to watch: --namespace NS (repeatable) or --all-namespaces"
        )
    kopf.configure(
        verbose=verbose,
        log_format={
            "plain": kopf.LogFormat.PLAIN,
            "full": kopf.LogFormat.FULL,
            "json": kopf.LogFormat.JSON,
        }[log_format],
        log_refkey="k8s",  # JSON logs carry {"k8s": {"namespace", "name", ...}} per resource
        log_prefix=log_format != "json",  # plain/full lines start with [namespace/name]
    )
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    probe_logs.install(config.liveness_endpoint)  # after kopf.configure set up logging
    kopf.run(
        registry=registry,
        standalone=config.peering_name is None,
        peering_name=config.peering_name,
        liveness_endpoint=config.liveness_endpoint,
        **handlers.namespaces_of(config),
    )


def main_from_args(args: argparse.Namespace) -> int:
    """Run from options added by :func:`add_arguments`; returns the exit code."""
    try:
        run(
            args.namespaces,
            bool(args.all_namespaces),
            resync_seconds=args.resync_seconds,
            replica_url_template=args.replica_url_template,
            replica_urls_file=args.replica_urls_file,
            status_timeout=args.status_timeout,
            flush_timeout=args.flush_timeout,
            liveness_endpoint=args.liveness_endpoint,
            peering_name=args.peering_name,
            metrics_endpoint=getattr(args, "metrics_endpoint", None),
            log_format=args.log_format,
            verbose=args.verbose,
        )
    except ConfigError as e:
        print(f"eventfleet operator: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eventfleet_operator [options]``."""
    parser = argparse.ArgumentParser(
        prog="eventfleet operator", description="Run the eventfleet Kubernetes operator (Kopf)."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.captureWarnings(True)
    return main_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
