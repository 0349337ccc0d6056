"""Arguments of the aggregation job (``eventfleet aggregate`` and the spark-submit file).

Kept free of Spark imports so that ``eventfleet --help`` works without starting a JVM.
The operator's ScheduledSparkApplication passes ``--eventer``, ``--bucket``, ``--output``
and ``--window``; everything else has a default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib

from eventfleet_server.common.jsonfmt import timestamp_from_iso
from eventfleet_server.common.model import timestamp_to_us

from eventfleet_spark.endpoints import TOKEN_ENV, http_endpoints, parse_endpoints
from eventfleet_spark.tls import TLS_CA_ENV, ClientTls

DEFAULT_PREFIX = ("eventfleet", "aggregate", "{bucket}")
DEFAULT_WINDOW_SECONDS = 3600
PARTIAL_AGGREGATION = ("reader", "spark")
READ_IN = ("auto", "driver", "executors")


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """Everything one invocation needs, validated (see `add_arguments` for meanings)."""

    eventer: str
    bucket_seconds: int
    output: str
    # The replicas' HTTP endpoints: read through GET /export (Arrow) when given.
    http: str | None = None
    window_seconds: int = DEFAULT_WINDOW_SECONDS
    start_us: int | None = None
    end_us: int | None = None
    write_back: bool = True
    master: str | None = None
    prefix_depth: int | None = None
    prefix: tuple[str, ...] = DEFAULT_PREFIX
    types: tuple[tuple[str, ...], ...] | None = None
    partitions: int | None = None
    page_size: int = 10_000
    partial_aggregation: str = "reader"
    # Who reads the window: the driver process itself or Spark's executors (through the
    # source); auto picks by master (job.reads_in_driver).
    read_in: str = "auto"
    client_name: str = "eventfleet-aggregate"
    # From --token-file; without it every process (driver and executors) reads
    # $EVENTFLEET_TOKEN itself, so the token never enters the Spark plan.
    token: str | None = dataclasses.field(default=None, repr=False)
    json_summary: bool = False
    # From --tls-ca, else $EVENTFLEET_TLS_CA: the replicas serve TLS, verified against
    # this CA on every connection. The path must exist on the driver and every executor.
    tls_ca: str | None = None
    tls_server_name: str | None = None
    # Local runs: map (or, the first time, write) a class-data-sharing archive of the
    # Spark JVM's classes in this directory (`class_archive`).
    class_archive: str | None = None

    def __post_init__(self) -> None:
        parse_endpoints(self.eventer)  # raises ValueError naming the bad address
        http_endpoints(self.http)
        if self.tls_server_name is not None and self.tls_ca is None:
            raise ValueError(f"tls server name {self.tls_server_name!r} needs a CA (--tls-ca)")
        if self.tls is not None:
            self.tls.context()  # a missing or unreadable CA fails here, before any connection
        for name in ("bucket_seconds", "window_seconds", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} must be an integer >= 1")
        if self.partitions is not None and self.partitions < 1:
            raise ValueError(f"partitions {self.partitions!r} must be >= 1")
        if self.prefix_depth is not None and self.prefix_depth < 0:
            raise ValueError(f"prefix depth {self.prefix_depth!r} must be >= 0")
        if self.partial_aggregation not in PARTIAL_AGGREGATION:
            raise ValueError(
                f"partial aggregation {self.partial_aggregation!r} is not one of"
                f" {', '.join(PARTIAL_AGGREGATION)}"
            )
        if self.read_in not in READ_IN:
            raise ValueError(f"read in {self.read_in!r} is not one of {', '.join(READ_IN)}")
        if self.read_in == "driver" and self.partial_aggregation == "spark":
            raise ValueError(
                "read in driver needs partial aggregation reader: with spark, the"
                " executors must read event rows"
            )
        if not self.output:
            raise ValueError("output path is empty")
        if any(s in ("*", "?") for s in self.prefix):
            raise ValueError(f"write-back prefix {list(self.prefix)!r} may not contain '*' or '?'")
        if not self.prefix and self.write_back:
            raise ValueError("an empty write-back prefix would mix aggregates with events")
        if self.start_us is not None and self.end_us is not None and self.end_us <= self.start_us:
            raise ValueError(f"end {self.end_us} us is not after start {self.start_us} us")

    @property
    def tls(self) -> ClientTls | None:
        """The TLS setting of every connection; None: plain TCP."""
        return None if self.tls_ca is None else ClientTls(self.tls_ca, self.tls_server_name)


def _type(text: str) -> tuple[str, ...]:
    return tuple(text.split("/")) if text else ()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _instant(text: str) -> int:
    try:
        return timestamp_to_us(timestamp_from_iso(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--eventer",
        required=True,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="replica(s) to read from; several spread the read (each holds every event)",
    )
    p.add_argument(
        "--http",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the replicas' HTTP endpoints: read events as Arrow from GET /export (a"
        " fraction of the replica CPU of an Eventer read); a replica without /export is"
        " read over --eventer",
    )
    p.add_argument(
        "--bucket", type=_positive_int, required=True, metavar="SECONDS", help="bucket size"
    )
    p.add_argument(
        "--output", required=True, metavar="PATH", help="Parquet root (a path or s3a:// URL)"
    )
    p.add_argument(
        "--window",
        type=_positive_int,
        default=DEFAULT_WINDOW_SECONDS,
        metavar="SECONDS",
        help="default range: the last WINDOW seconds up to the last bucket boundary;"
        " with --start/--end: the unit of work (one summary line each)"
        f" (default {DEFAULT_WINDOW_SECONDS})",
    )
    p.add_argument("--start", type=_instant, metavar="ISO", help="range start (ISO 8601 or s)")
    p.add_argument("--end", type=_instant, metavar="ISO", help="range end, exclusive")
    p.add_argument(
        "--no-write-back",
        dest="write_back",
        action="store_false",
        help="only write Parquet; do not register aggregate events",
    )
    p.add_argument(
        "--master",
        metavar="URL",
        help="Spark master (default: spark-submit's, else local[*])",
    )
    p.add_argument(
        "--prefix-depth",
        type=int,
        metavar="N",
        help="aggregate per type prefix of N segments (default: per full type)",
    )
    p.add_argument(
        "--prefix",
        default="/".join(DEFAULT_PREFIX),
        metavar="A/B/...",
        help="write-back type prefix; {bucket} becomes the bucket seconds (default %(default)s)",
    )
    p.add_argument(
        "--types",
        nargs="+",
        type=_type,
        metavar="PATTERN",
        help="event types to read, as a/b/* patterns (default: all)",
    )
    p.add_argument("--partitions", type=_positive_int, help="read partitions per window")
    p.add_argument("--page-size", type=_positive_int, default=10_000, help="events per query")
    p.add_argument(
        "--partial-aggregation",
        choices=PARTIAL_AGGREGATION,
        default="reader",
        help="where events are first aggregated: in the reading Python workers (default,"
        " faster) or by Spark from event rows",
    )
    p.add_argument(
        "--read-in",
        choices=READ_IN,
        default="auto",
        help="who reads the window: the driver process itself (no Python workers: the"
        " fastest start on one machine), Spark's executors (spread over the cluster), or"
        " auto (default): the driver under a local[...] master, else the executors",
    )
    p.add_argument("--name", default="eventfleet-aggregate", help="Eventer client name")
    p.add_argument(
        "--token-file",
        type=pathlib.Path,
        help=f"file with the Eventer token (default ${TOKEN_ENV})",
    )
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="the replicas serve TLS: verify their certificates against this CA (PEM) on"
        f" every connection (default ${TLS_CA_ENV}; without either: plain TCP)",
    )
    p.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="verify the replicas' certificates for NAME instead of the address connected"
        " to (endpoints given as IPs, certificates carrying DNS names)",
    )
    p.add_argument(
        "--class-archive",
        metavar="DIR",
        help="local runs: keep a class-data-sharing archive of the Spark JVM's classes in"
        " DIR; the first run writes it (~190 MB, a few seconds at exit), later runs map it"
        " and start with about half the JVM CPU (no effect under spark-submit)",
    )
    p.add_argument("--json", action="store_true", help="summary lines as JSON")
    p.add_argument(
        "--result-file",
        metavar="FILE",
        type=pathlib.Path,
        help="when the run ends, write its result (Succeeded or Failed, the window, the"
        " events read, aggregates, Parquet rows and write-back counts) there as one JSON"
        " object; on Kubernetes the driver's termination message, which the operator"
        " copies into status.aggregation.lastResult",
    )


def from_args(args: argparse.Namespace) -> JobOptions:
    """Validated options; `ValueError` names the bad value."""
    token = None
    if args.token_file:
        token = args.token_file.read_text().strip() or None
    return JobOptions(
        eventer=args.eventer,
        http=args.http or None,
        bucket_seconds=args.bucket,
        output=args.output,
        window_seconds=args.window,
        start_us=args.start,
        end_us=args.end,
        write_back=args.write_back,
        master=args.master,
        prefix_depth=args.prefix_depth,
        prefix=_type(args.prefix),
        types=tuple(args.types) if args.types else None,
        partitions=args.partitions,
        page_size=args.page_size,
        partial_aggregation=args.partial_aggregation,
        read_in=args.read_in,
        client_name=args.name,
        token=token,
        json_summary=args.json,
        # Unlike the token the path is no secret: resolved here, so that the driver
        # checks the file once and hands the same path to the executors.
        tls_ca=args.tls_ca or os.environ.get(TLS_CA_ENV) or None,
        tls_server_name=args.tls_server_name or None,
        class_archive=args.class_archive or None,
    )


def effective_token(opts: JobOptions) -> str | None:
    """The token this process uses: --token-file's, else ``$EVENTFLEET_TOKEN``."""
    return opts.token or os.environ.get(TOKEN_ENV) or None


def types_option(types: tuple[tuple[str, ...], ...] | None) -> str | None:
    return None if types is None else json.dumps([list(t) for t in types])
