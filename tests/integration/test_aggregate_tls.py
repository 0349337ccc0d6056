"""The aggregation job against replicas that serve TLS (``tls.enabled``, issue 14).

Two in-process replicas (the `Fleet` of test_aggregate_job.py: their own event loop
thread, events merged with `Engine.merge`) serve Eventer and HTTP with a certificate
from a test CA (made with the openssl command-line tool, as test_tls.py does; SANs
``127.0.0.1`` and ``localhost``). The job's read paths (`eventer_io`, `export_io`) and
the write-back are run on their own and through the whole job with real Spark: with
the fleet's CA they succeed, with another CA or none they fail with an error that says
why, and an unusable CA file is named before any connection.
"""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest

from tests import parts

parts.require_module("spark", "pyspark")


@pytest.fixture(autouse=True)
def _openssl() -> None:
    if shutil.which("openssl") is None:
        parts.skip_missing("openssl", "no openssl on PATH", "apt-get install openssl")


from eventfleet_spark import eventer_io, export_io, job, writeback  # noqa: E402
from eventfleet_spark.endpoints import Endpoint  # noqa: E402
from eventfleet_spark.timeplan import Span  # noqa: E402
from eventfleet_spark.tls import TLS_CA_ENV, ClientTls, TlsConfigError  # noqa: E402

from tests.integration.test_aggregate_job import (  # noqa: E402
    Fleet,
    expected,
    file_digests,
    make_events,
    options,
    run_job,
    spark,  # noqa: F401 (the module's SparkSession fixture)
    us,
)
from tests.integration.test_aggregate_rules import parse  # noqa: E402
from tests.integration.test_tls import make_ca, make_cert  # noqa: E402

START, END = us("2024-04-01T10:00:00Z"), us("2024-04-01T10:03:00Z")
TOKEN = "t0ken"
JOB_WINDOWS = {
    "executors": (us("2024-04-02T10:00:00Z"), us("2024-04-02T10:03:00Z"), (43, 44)),
    "driver": (us("2024-04-03T10:00:00Z"), us("2024-04-03T10:03:00Z"), (45, 46)),
}
BASE_ARGV = ["--eventer", "h:1", "--bucket", "60", "--output", "o"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "rogue-ca")
    (d / "not-a-ca.pem").write_text("not a certificate\n")
    return {
        "r1": make_cert(d, "ca", "r1"),
        "ca": str(d / "ca.pem"),
        "rogue": str(d / "rogue-ca.pem"),
        "garbage": str(d / "not-a-ca.pem"),
        "missing": str(d / "missing.pem"),
    }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pki):
    f = Fleet(tmp_path_factory.mktemp("tls-fleet"), size=2, token=TOKEN, tls=pki["r1"])
    try:
        events = make_events(START, END, per_server=30, seed=14, servers=(41, 42))
        f.merge(events)
        yield f, events
    finally:
        f.close()


def eventer(fleet) -> Endpoint:
    return Endpoint("127.0.0.1", fleet.replicas[0].eventer.port)


def http(fleet) -> Endpoint:
    return Endpoint("127.0.0.1", fleet.replicas[1].http.port)


def read_eventer(fleet, tls):
    pages = eventer_io.read_span(eventer(fleet), START, END, token=TOKEN, tls=tls, timeout=5)
    return sum(len(p) for p in pages)


def read_export(fleet, tls):
    pages = export_io.read_span_arrow(http(fleet), START, END, token=TOKEN, tls=tls, timeout=5)
    return sum(len(p) for p in pages)


# -- options ------------------------------------------------------------------------------


def test_tls_ca_from_option_or_environment(monkeypatch, pki):
    monkeypatch.delenv(TLS_CA_ENV, raising=False)
    assert parse(BASE_ARGV).tls is None  # plain TCP unless asked
    opts = parse([*BASE_ARGV, "--tls-ca", pki["ca"], "--tls-server-name", "localhost"])
    assert opts.tls == ClientTls(pki["ca"], "localhost")
    monkeypatch.setenv(TLS_CA_ENV, pki["ca"])
    assert parse(BASE_ARGV).tls == ClientTls(pki["ca"])
    # The option wins over the environment.
    assert parse([*BASE_ARGV, "--tls-ca", pki["rogue"]]).tls_ca == pki["rogue"]


@pytest.mark.parametrize(
    ("which", "message"),
    [("missing", "No such file"), ("garbage", "")],
)
def test_unusable_ca_file_is_named_before_any_connection(pki, capsys, which, message):
    path = pki[which]
    named = re.escape(f"tls CA file '{path}' cannot be used: ") + message
    with pytest.raises(TlsConfigError, match=named):
        parse([*BASE_ARGV, "--tls-ca", path])
    # The entry point says so and exits 2 without starting Spark or connecting
    # (nothing listens on h:1).
    assert job.main([*BASE_ARGV, "--tls-ca", path]) == 2
    assert f"tls CA file '{path}'" in capsys.readouterr().err
    # The data source checks its option the same way, on the driver.
    from eventfleet_spark.source import ReadOptions

    base = {"eventer": "h:1", "start": "0", "end": "10"}
    with pytest.raises(TlsConfigError, match=named):
        ReadOptions.from_options({**base, "tls_ca": path})


def test_server_name_needs_a_ca(monkeypatch):
    monkeypatch.delenv(TLS_CA_ENV, raising=False)
    with pytest.raises(ValueError, match="tls server name 'localhost' needs a CA"):
        parse([*BASE_ARGV, "--tls-server-name", "localhost"])


# -- the read paths and the write-back on their own ----------------------------------------


@pytest.mark.parametrize(
    ("read", "error"),
    [(read_eventer, eventer_io.EventerReadError), (read_export, export_io.ExportReadError)],
    ids=["eventer", "export"],
)
def test_reads_verify_the_replica_certificate(fleet, pki, read, error):
    f, events = fleet
    want = len(events)  # every seeded event lies in [START, END)
    assert read(f, ClientTls(pki["ca"])) == want
    # Endpoints by IP, certificates for a DNS name: the name is what is verified.
    assert read(f, ClientTls(pki["ca"], "localhost")) == want
    with pytest.raises(error, match=r"not accepted .*server name elsewhere\.invalid.*[Mm]ismatch"):
        read(f, ClientTls(pki["ca"], "elsewhere.invalid"))
    with pytest.raises(error, match=re.escape(f"not accepted (CA file {pki['rogue']})")):
        read(f, ClientTls(pki["rogue"]))
    with pytest.raises(error, match="if the replica serves TLS, give its CA: job --tls-ca"):
        read(f, None)


def test_write_back_verifies_the_replica_certificate(fleet, pki):
    f, events = fleet
    aggregates = list(expected(events, START, END).values())
    prefix = ("tls-test", "write-back")  # apart from the job's own prefix
    endpoint = eventer(f)

    def write(tls):
        return f.call(
            writeback.write_back(
                endpoint, aggregates, prefix, Span(START, END), token=TOKEN, tls=tls
            )
        )

    with pytest.raises(writeback.WriteBackError, match=re.escape(f"CA file {pki['rogue']}")):
        write(ClientTls(pki["rogue"]))
    with pytest.raises(writeback.WriteBackError, match="give its CA: job --tls-ca"):
        write(None)
    result = write(ClientTls(pki["ca"]))
    assert result.registered == len(aggregates) > 0
    # Read back over TLS: the rule sees its own events, so a re-run registers nothing.
    assert write(ClientTls(pki["ca"])).unchanged == len(aggregates)


# -- the job with real Spark --------------------------------------------------------------


@pytest.mark.parametrize("read_in", ["executors", "driver"])
def test_job_reads_and_writes_back_over_tls(spark, fleet, pki, tmp_path, read_in):  # noqa: F811
    """--tls-ca reaches the readers (Eventer and /export reads, on the executors or in
    the driver) and the write-back."""
    from eventfleet_spark.eventer_io import EventerReadError
    from pyspark.errors import PySparkException

    # On the executors the reader's error reaches the driver wrapped by Spark.
    error = PySparkException if read_in == "executors" else EventerReadError
    f, _ = fleet
    # Each reader its own window and server ids: its first run registers every aggregate.
    start, end, servers = JOB_WINDOWS[read_in]
    events = make_events(start, end, per_server=30, seed=15, servers=servers)
    f.merge(events)
    opts = options(
        f, tmp_path / "eventer", start_us=start, end_us=end, token=TOKEN, read_in=read_in
    )
    with pytest.raises(error, match="give its CA: job --tls-ca"):
        run_job(spark, opts)
    with pytest.raises(error, match=re.escape(f"not accepted (CA file {pki['rogue']})")):
        run_job(spark, dataclasses.replace(opts, tls_ca=pki["rogue"]))
    want = expected(events, start, end)
    (summary,), _ = run_job(spark, dataclasses.replace(opts, tls_ca=pki["ca"]))
    assert summary.events == sum(a.count for a in want.values())
    assert summary.write_back.registered == summary.aggregates == len(want)
    # Over https from /export (a failure there would not fall back to Eventer): the
    # same Parquet bytes; the aggregates are already registered.
    (again,), _ = run_job(
        spark,
        dataclasses.replace(opts, tls_ca=pki["ca"], http=f.http, output=str(tmp_path / "export")),
    )
    assert again.events == summary.events
    assert again.write_back.registered == 0
    assert file_digests(tmp_path / "export") == file_digests(tmp_path / "eventer")
