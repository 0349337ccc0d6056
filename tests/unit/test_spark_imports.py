"""The Spark job never loads the replica's server side, storage or aiosqlite.

The image of the job installs the `spark` extra only, which has no aiosqlite. The
import-linter contract in pyproject.toml checks the import graph, but it cannot see
that importing ``a.b.c`` first runs ``a/b/__init__.py`` (that is how the old
``eventfleet_server.eventer.client`` pulled in the whole server). Here a fresh
interpreter imports every module of the job and every module any of its files imports,
at module level or inside a function (the write-back imports the client lazily), and
then looks at ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPARK = ROOT / "spark"

# Whatever the job loads must not start with any of these.
FORBIDDEN = (
    "aiosqlite",
    "aiohttp",
    "kopf",
    "eventfleet_operator",
    "eventfleet_server.main",
    "eventfleet_server.engine",
    "eventfleet_server.storage",
    "eventfleet_server.eventer",
    "eventfleet_server.syncer",
    "eventfleet_server.http",
    "eventfleet_server.config",
)

PROBE = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def _imported_by_the_job() -> list[str]:
    """Every module the job's files import (eventfleet_* only, nested imports too)."""
    names = set()
    for path in SPARK.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
    return sorted(n for n in names if n.startswith("eventfleet_"))


def _loaded_after_importing(modules: list[str]) -> list[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(ROOT / r) for r in ("server", "operator", "spark")),
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(modules)],
        capture_output=True,
        text=True,
        env=env,
        cwd=SPARK,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _forbidden(loaded: list[str]) -> list[str]:
    return [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


def test_the_spark_job_loads_no_server_side_module():
    modules = _imported_by_the_job()
    loaded = _loaded_after_importing(modules)
    assert _forbidden(loaded) == []
    # The detector saw the job's own modules and the lazily imported client.
    assert "eventfleet_spark.job" in modules
    assert "eventfleet_server.client.eventer" in loaded
    assert "eventfleet_spark.writeback" in loaded


def test_the_probe_would_notice_aiosqlite():
    # The protocol package imports the server side: the same probe must flag it.
    loaded = _loaded_after_importing(["eventfleet_server.eventer"])
    assert "aiosqlite" in _forbidden(loaded)
