"""Headless Chromium for the e2e pictures: the browser, the node driver run, the PNGs.

Chromium is Debian's (scripts/tools/chromium.sh); the drivers are node scripts using
playwright-core from npm (scripts/tools/jetstream.sh, `ensure_tools`). Each driver
prints one JSON line last, which `run_driver` returns. Pictures go to
$EVENTFLEET_ARTIFACTS/<name> (default <repo>/.artifacts/<name>) unless
``EVENTFLEET_UPDATE_SCREENSHOTS=1`` asks for the committed ones under docs/img to be
rewritten (review them, then commit).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import subprocess

from e2e.jetstream.refclient import ROOT, node_env

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: pathlib.Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def chromium() -> str:
    """The Chromium binary, installed by scripts/tools/chromium.sh when missing."""
    found = shutil.which("chromium") or shutil.which("chromium", path=str(ROOT / ".tools/bin"))
    if not found:
        subprocess.run(["bash", str(ROOT / "scripts/tools/chromium.sh")], check=True, timeout=900)
        found = shutil.which("chromium", path="/usr/bin:" + str(ROOT / ".tools/bin"))
    assert found, "chromium is required: scripts/tools/chromium.sh"
    return found


def updating_pictures() -> bool:
    """True when the run rewrites the committed pictures (EVENTFLEET_UPDATE_SCREENSHOTS=1)."""
    return os.environ.get("EVENTFLEET_UPDATE_SCREENSHOTS") == "1"


def artifacts(name: str) -> pathlib.Path:
    """$EVENTFLEET_ARTIFACTS/`name` (default <repo>/.artifacts/`name`), created."""
    path = pathlib.Path(os.environ.get("EVENTFLEET_ARTIFACTS", ROOT / ".artifacts")) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


async def run_driver(
    script: pathlib.Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> dict:
    """Run the node browser driver `script` with `args` on Chromium (extra environment
    `env`); the JSON of the last line it prints. Killed after `timeout` seconds."""
    full_env = node_env()
    full_env["CHROMIUM"] = chromium()
    full_env.update(env or {})
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(script),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=full_env,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert out, f"browser driver {script.name} printed nothing; stderr:\n{err.decode()[-3000:]}"
    return json.loads(out.decode().strip().splitlines()[-1])
