"""The README's and the quick start's examples work, run against a real local fleet.

Every fenced ``python`` block of README.md and docs/quickstart.md runs as a script (the
real hat-event 0.9.44 client, as a reader would use it); a ``text`` block right after
one is its expected output (each line must appear). Every ``eventfleet register``,
``query`` and ``watch`` command of the ``sh`` blocks runs as the ``eventfleet`` CLI:

* ``register`` must print the registered event with the documented type;
* ``query ... latest PATTERN`` must (eventually: it may ask another replica than the
  one that registered) print an event of every type the page registered before that
  matches the pattern;
* ``watch PATTERN`` must print an event registered while it runs, and stop quietly on
  Ctrl-C (SIGINT), as the page says.

The fleet is ``eventfleet fleet --replicas 3`` on a free block of ports; the documented
ports (the default layout from 23012) are shifted to it. Leading ``NAME=value``
environment assignments (the Kubernetes section's ``EVENTFLEET_TOKEN=$TOKEN``) are
dropped: the local fleet has no token.

docs/aggregation.md's local example runs whole, through bash, as written (Spark local
mode): see ``test_aggregation_local_example_runs_as_written``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from e2e.fleet_helpers import FleetProc, free_block

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "quickstart.md"]
DOC_BASE = 23012  # `eventfleet fleet`'s default base port, which the docs show
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
CLI = re.compile(r"(?:^|\s)(?:\S*/)?eventfleet\s+(register|query|watch)\b")


def blocks(path: pathlib.Path) -> list[tuple[str, str]]:
    """``(info string, body)`` of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(path.read_text())]


def shift_ports(text: str, base: int) -> str:
    """Documented ports of the default layout (23012..23041) → the test fleet's."""
    return re.sub(r"\b230[1-4]\d\b", lambda m: str(int(m.group()) - DOC_BASE + base), text)


def cli_argv(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words.pop(0)  # environment assignment (see the module doc)
    assert words[0].endswith("eventfleet"), line
    return [sys.executable, "-m", "eventfleet_cli", *words[1:]]


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def matches(pattern: tuple[str, ...], event_type: tuple[str, ...]) -> bool:
    """hat-event 0.9 semantics: '?' one segment, '*' (last) the rest."""
    if not pattern:
        return not event_type
    if pattern[0] == "*":
        return True
    if not event_type:
        return False
    return pattern[0] in ("?", event_type[0]) and matches(pattern[1:], event_type[1:])


def example_type(pattern: tuple[str, ...]) -> tuple[str, ...]:
    """A type that the watch pattern matches, to register while watching."""
    out = ["doc-test" if s == "?" else s for s in pattern if s != "*"]
    return (*out, "watched") if pattern and pattern[-1] == "*" else tuple(out)


class DocRunner:
    def __init__(self, base: int, tmp: pathlib.Path):
        self.base = base
        self.tmp = tmp
        self.registered: list[tuple[str, ...]] = []
        self.ran = {"python": 0, "register": 0, "query": 0, "watch": 0}

    def python(self, body: str, expected: str | None, where: str) -> None:
        script = self.tmp / f"snippet-{sum(self.ran.values())}.py"
        script.write_text(shift_ports(body, self.base))
        result = run([sys.executable, str(script)])
        assert result.returncode == 0, f"{where}: python block failed:\n{result.stderr[-2000:]}"
        assert "Warning" not in result.stderr, f"{where}: noisy:\n{result.stderr}"
        for line in (expected or "").splitlines():
            assert line in result.stdout.splitlines(), f"{where}: {line!r} not in\n{result.stdout}"
        self.ran["python"] += 1

    def command(self, line: str, where: str) -> None:
        argv = cli_argv(shift_ports(line, self.base))
        kind = CLI.search(line).group(1)
        getattr(self, kind)(argv, where)
        self.ran[kind] += 1

    def register(self, argv: list[str], where: str) -> None:
        result = run(argv)
        assert result.returncode == 0, f"{where}: {result.stderr}"
        (event,) = json_lines(result.stdout)
        type_arg = next(a for a in argv[4:] if not a.startswith("-") and "/" in a)
        assert tuple(event["type"]) == tuple(type_arg.split("/")), where
        self.registered.append(tuple(event["type"]))

    def query(self, argv: list[str], where: str) -> None:
        patterns = [tuple(a.split("/")) for a in argv[argv.index("latest") + 1 :]]
        want = {t for t in self.registered if any(matches(p, t) for p in patterns)}
        deadline = time.monotonic() + 20  # another replica: replication takes a moment
        while True:
            result = run(argv)
            assert result.returncode == 0, f"{where}: {result.stderr}"
            got = {tuple(e["type"]) for e in json_lines(result.stdout)}
            if want <= got or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert want and want <= got, f"{where}: wanted {want}, got {got}"

    def watch(self, argv: list[str], where: str) -> None:
        pattern = tuple(argv[-1].split("/"))
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        try:
            time.sleep(2.0)  # subscribed by then; an event registered earlier is not "new"
            event_type = example_type(pattern)
            eventer = argv[argv.index("--eventer") + 1]
            cli = [sys.executable, "-m", "eventfleet_cli"]
            reg = run([*cli, "register", "--eventer", eventer, "/".join(event_type), "--json", "1"])
            assert reg.returncode == 0, reg.stderr
            line = proc.stdout.readline()  # bounded by the finally below if it hangs
            assert tuple(json.loads(line)["type"]) == event_type, f"{where}: {line!r}"
            proc.send_signal(signal.SIGINT)  # the docs: "Ctrl-C to stop"
            proc.wait(timeout=10)
            stderr = proc.stderr.read()
            assert "Traceback" not in stderr, f"{where}: Ctrl-C is noisy:\n{stderr}"
            self.registered.append(event_type)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def local_fleet(tmp_path_factory):
    """``(base port, data dir)`` of a three-replica local fleet, as ``./scripts/run``."""
    import asyncio

    base = free_block(3)
    data = tmp_path_factory.mktemp("docs") / "data"
    fleet = FleetProc(data, 3, base_port=base).start()
    try:
        asyncio.run(fleet.wait_up())
        yield base, data
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def fleet_base(local_fleet):
    return local_fleet[0]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_doc_examples_run(doc, fleet_base, tmp_path):
    runner = DocRunner(fleet_base, tmp_path)
    found = blocks(doc)
    for i, (info, body) in enumerate(found):
        where = f"{doc.name} block {i + 1}"
        if info == "python":
            nxt = found[i + 1] if i + 1 < len(found) else ("", "")
            runner.python(body, nxt[1] if nxt[0] == "text" else None, where)
        elif info == "sh":
            for line in body.splitlines():
                if CLI.search(line):
                    runner.command(line, where)
    # The page has examples of each kind: the extraction itself did not silently fail.
    assert runner.ran["python"] >= 1 and runner.ran["register"] >= 1, runner.ran
    assert runner.ran["query"] >= 1 and runner.ran["watch"] >= 1, runner.ran


AGGREGATION = ROOT / "docs" / "aggregation.md"


def checkout_like(workdir: pathlib.Path, data_dir: pathlib.Path) -> None:
    """A directory where the docs' relative paths mean what they mean in a checkout
    after ``./scripts/run``: ``.venv/bin/eventfleet`` (this interpreter's) and ``.data``
    (the running fleet's data directory, with its ``token``)."""
    (workdir / ".venv" / "bin").mkdir(parents=True)
    (workdir / ".venv" / "bin" / "eventfleet").symlink_to(
        pathlib.Path(sys.executable).parent / "eventfleet"
    )
    (workdir / ".data").symlink_to(data_dir)


def test_aggregation_local_example_runs_as_written(local_fleet, tmp_path):
    """docs/aggregation.md's local example, every line through bash, in a checkout-like
    directory; only the documented ports are moved to the test fleet's. The job reads
    through ``--http`` (GET /export): a wrong HTTP port or a missing token fails the run
    (ExportReadError), only a replica without the route falls back to Eventer."""
    pytest.importorskip("pyspark")
    base, data_dir = local_fleet
    (body,) = [b for info, b in blocks(AGGREGATION) if info == "sh" and "aggregate --eventer" in b]
    assert "127.0.0.1:23017" in body and "--token-file .data/token" in body  # HTTP, token
    checkout_like(tmp_path, data_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTFLEET_")}
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", shift_ports(body, base)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    # The last command prints the written-back aggregates: demo/temp's two values.
    written = [
        e
        for e in json_lines("\n".join(ln for ln in result.stdout.splitlines() if ln[:1] == "{"))
        if e.get("type", [])[:3] == ["eventfleet", "aggregate", "10"]
    ]
    demo = [e for e in written if e["type"][3:] == ["demo", "temp"]]
    assert demo, f"no aggregate of demo/temp in:\n{result.stdout[-4000:]}"
    assert sum(e["payload"]["json"]["count"] for e in demo) >= 2, demo
    assert list((tmp_path / "aggregates").rglob("*.parquet")), "no Parquet written"


def test_extraction_sees_the_examples():
    readme = blocks(DOCS[0])
    assert [i for i, _ in readme].count("python") == 1
    assert shift_ports("127.0.0.1:23022 and 23017", 40000) == "127.0.0.1:40010 and 40005"
    assert cli_argv("EVENTFLEET_TOKEN=$TOKEN .venv/bin/eventfleet query latest 'a/*'")[-3:] == [
        "query",
        "latest",
        "a/*",
    ]
    assert matches(("a", "*"), ("a", "b", "c")) and not matches(("a", "?"), ("a", "b", "c"))
    assert example_type(("sensors", "*")) == ("sensors", "watched")
    assert os.path.exists(DOCS[1])
