"""Image build step: the training run that writes the job image's CDS archive.

Run by images/spark.Dockerfile in its build stage, with a throwaway venv that also has
the server extra (the final image never carries it)::

    python spark/train_class_archive.py --job-python /opt/eventfleet/venv/bin/python

It writes `image_archive.CLASSPATH_JAR`, starts one real replica on loopback, registers
a few thousand events like a fleet's (JSON objects with numbers, bare numbers, strings,
binary, empty), then runs the real job against it exactly as a driver pod starts it —
``spark-submit`` of ``/opt/eventfleet/aggregate.py`` with the operator's arguments
(Eventer and ``--http``, write-back on), ``spark.driver.extraClassPath`` the classpath
jar — with ``-XX:ArchiveClassesAtExit``: the JVM writes every class it loaded into
`image_archive.ARCHIVE` while it exits. The build fails when the job or the dump does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from eventfleet_spark import image_archive

SPARK_SUBMIT = "/opt/spark/bin/spark-submit"
MAIN = "/opt/eventfleet/aggregate.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _payload(rng: random.Random, i: int):
    from eventfleet_server.common.model import EventPayloadBinary, EventPayloadJson

    r = i % 50
    if r < 40:
        value = {"value": round(rng.uniform(-20, 120), 3), "count": i % 17, "state": "ok"}
        return EventPayloadJson(json.dumps(value))
    if r < 46:
        return EventPayloadJson(json.dumps(rng.random()))
    if r < 48:
        return EventPayloadJson('"no numbers here"')
    if r < 49:
        return EventPayloadBinary("raw", b"\x00\x01")
    return None


async def _seed(port: int, events: int) -> None:
    from eventfleet_server.client.eventer import connect
    from eventfleet_server.common.model import RegisterEvent

    rng = random.Random(1)
    types = [("train", f"site{i % 3}", f"dev{i}", "value") for i in range(20)]
    client = await connect("127.0.0.1", port, "class-archive-training")
    try:
        for start in range(0, events, 500):
            batch = [
                RegisterEvent(types[i % len(types)], None, _payload(rng, i))
                for i in range(start, min(start + 500, events))
            ]
            if await client.register(batch, with_response=True) is None:
                raise RuntimeError("the training replica refused a batch")
    finally:
        await client.close()


def _wait_ready(http_port: int, server: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{http_port}/readyz"
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the training replica exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the training replica was not ready at {url} in {timeout} s")
        time.sleep(0.2)


def train(job_python: str, events: int, work: pathlib.Path) -> None:
    """Write the classpath jar, then the archive from one real run of the job."""
    jar = pathlib.Path(image_archive.CLASSPATH_JAR)
    archive = pathlib.Path(image_archive.ARCHIVE)
    names = image_archive.write_classpath_jar(jar, pathlib.Path(image_archive.SPARK_JARS))
    print(f"train: {jar}: {len(names)} Spark jars, sorted", flush=True)
    eventer, http = _free_port(), _free_port()
    conf = work / "replica.yaml"
    conf.write_text(
        json.dumps(
            {
                "log": {"level": "WARNING"},
                "syncer": {"port": 0},
                "bus": {"enabled": False},
                "jetstream": {"enabled": False},
                "http": {"port": http},
            }
        )
    )
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "eventfleet_cli", "server", "--config", str(conf)),
            *("--data-dir", str(work / "data"), "--server-id", "1"),
            *("--eventer-port", str(eventer), "--host", "127.0.0.1"),
        ]
    )
    t0 = time.monotonic()
    try:
        _wait_ready(http, server)
        asyncio.run(_seed(eventer, events))
        t1 = time.monotonic()
        print(f"train: {events} events registered in {t1 - t0:.1f} s; running the job", flush=True)
        env = {
            **os.environ,
            "PYSPARK_PYTHON": job_python,
            "PYSPARK_DRIVER_PYTHON": job_python,
            # A build container's host name need not resolve (buildah's does not):
            # Spark looks its own address up at start unless told.
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_HOSTNAME": "localhost",
        }
        dump = f"-XX:ArchiveClassesAtExit={archive} {image_archive.LOG_OPTIONS}"
        subprocess.run(
            [
                SPARK_SUBMIT,
                *("--master", "local[2]"),
                *("--conf", f"spark.driver.extraClassPath={jar}"),
                *("--conf", f"spark.driver.extraJavaOptions={dump}"),
                MAIN,
                *("--eventer", f"127.0.0.1:{eventer}", "--http", f"127.0.0.1:{http}"),
                *("--bucket", "1", "--window", "3600", "--output", str(work / "parquet")),
                *("--result-file", str(work / "result.json")),
            ],
            env=env,
            # The driver pod's working directory (spark-submit's class path names
            # `hive-jackson/*` relative to it).
            cwd="/opt/spark/work-dir",
            check=True,
        )
    finally:
        server.terminate()
        server.wait(timeout=60)
    if not archive.is_file():
        raise RuntimeError(f"the JVM wrote no archive at {archive}")
    print(
        f"train: {archive}: {archive.stat().st_size / 1e6:.0f} MB; the job and the dump"
        f" took {time.monotonic() - t1:.1f} s",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job-python", required=True, help="the job's interpreter (PYSPARK_PYTHON)")
    p.add_argument("--events", type=int, default=5000, help="events the run reads (5000)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="class-archive-") as work:
        train(args.job_python, args.events, pathlib.Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
