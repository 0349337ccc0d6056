"""The docs' Kubernetes steps, as the tests on the real cluster run them.

A fenced block is a cluster step when the line before it is the marker
``<!-- test: cluster -->`` (invisible on the rendered page). The tests take a section's
marked blocks in order and run them as written through bash, with the cluster's admin
kubeconfig in a namespace of the test's choosing, so that a command that drifts from the
code (a renamed flag, field, Secret or condition) fails the test instead of a reader.

What the runner changes, and only this: the documented local ports of a ``kubectl
port-forward`` are mapped to free ones (``23012`` → ``<free>:23012``, and the
``127.0.0.1:23012`` the next commands use → ``127.0.0.1:<free>``), and after a
port-forward put in the background it waits until the forwarded ports accept — the pause
a person typing the next line makes. Values a reader fills in (``$REGISTRY``...) come
from the environment the test passes.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import textwrap
import time

from e2e.cluster.layout import ROOT, TOOLS
from e2e.ports import free_port

MARKER = "<!-- test: cluster -->"
_FENCE = re.compile(
    r"^(?P<indent> *)```(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
_FORWARD = re.compile(r"^(\s*kubectl(?: -n \S+)? port-forward \S+)((?: \d+)+)(\s*&)\s*$", re.M)


def _span(path: pathlib.Path, heading: str) -> tuple[str, int, int]:
    """The file's text and the offsets of the text under ``heading``."""
    text = path.read_text()
    headings, offset, fenced = [], 0, False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := _HEADING.match(line)):
            headings.append((len(m.group(1)), m.group(2), offset, offset + len(line)))
        offset += len(line)
    for i, (level, title, _, end) in enumerate(headings):
        if title == heading:
            stop = next((h[2] for h in headings[i + 1 :] if h[0] <= level), len(text))
            return text, end, stop
    raise AssertionError(f"{path.name}: no heading {heading!r}")


def section(path: pathlib.Path, heading: str) -> str:
    """The text under ``heading`` (a Markdown heading's title) up to the next heading of
    the same or a higher level; ``#`` lines inside fenced blocks are not headings."""
    text, start, stop = _span(path, heading)
    return text[start:stop]


def _marked(path: pathlib.Path, heading: str) -> list[tuple[str, str, int]]:
    text, start, stop = _span(path, heading)
    found = []
    for m in _FENCE.finditer(text, start, stop):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if before == MARKER:
            line = text.count("\n", 0, m.start()) + 1
            found.append((m.group("info").strip(), textwrap.dedent(m.group("body")), line))
    assert found, f"{path.name}, {heading!r}: no block marked {MARKER}"
    return found


def cluster_blocks(path: pathlib.Path, heading: str) -> list[tuple[str, str]]:
    """``(info string, body)`` of the marked blocks of a section, in order (at least one)."""
    return [(info, body) for info, body, _ in _marked(path, heading)]


def block_places(path: pathlib.Path, heading: str) -> list[str]:
    """Where each marked block of a section is (``docs/runbook.md:412 'Restore'``), for
    a failure to name the block to fix."""
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{name}:{line} {heading!r}" for _, _, line in _marked(path, heading)]


class DocShell:
    """Runs doc blocks through bash against the cluster, in one namespace and one
    working directory (files a block writes are there for the next block)."""

    def __init__(
        self, kubeconfig: pathlib.Path, namespace: str, workdir: pathlib.Path, **env: str
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        # The reader's checkout, as the docs' relative paths see it, without the files
        # the blocks write (demo.yaml, server.key...) landing in the repository.
        for name in (".venv", "charts", "dist", "images"):
            if not (workdir / name).exists():
                (workdir / name).symlink_to(ROOT / name)
        (workdir / "scripts").mkdir(exist_ok=True)
        for script in (ROOT / "scripts").iterdir():
            if script.is_file():
                # A wrapper, not a link: the scripts find the checkout from their own path.
                (workdir / "scripts" / script.name).write_text(f'#!/bin/sh\nexec "{script}" "$@"\n')
                (workdir / "scripts" / script.name).chmod(0o755)
        # The reader's current namespace: a copy of the admin kubeconfig with it set.
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.write_text(kubeconfig.read_text())
        self.kubeconfig.chmod(0o600)
        subprocess.run(
            [str(TOOLS / "bin" / "kubectl"), "--kubeconfig", str(self.kubeconfig),
             "config", "set-context", "--current", f"--namespace={namespace}"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        self.local_ports: dict[int, int] = {}
        self.env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{TOOLS / 'bin'}:{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
            "HOME": str(workdir),  # helm's and kubectl's caches: the test's own
            **env,
        }

    def _forwarding(self, body: str) -> str:
        def remap(m: re.Match) -> str:
            pairs = []
            for port in m.group(2).split():
                local = self.local_ports.setdefault(int(port), free_port())
                pairs.append(f"{local}:{port}")
            waits = " ".join(str(self.local_ports[int(p)]) for p in m.group(2).split())
            return f"{m.group(1)} {' '.join(pairs)}{m.group(3)}\n_ef_wait_ports {waits}"

        body = _FORWARD.sub(remap, body)
        for documented, local in self.local_ports.items():
            body = re.sub(rf"\b127\.0\.0\.1:{documented}\b", f"127.0.0.1:{local}", body)
        return body

    def run(self, body: str, timeout: float = 600, where: str = "") -> str:
        """Run one block; returns its stdout, fails with both outputs when it fails."""
        script = self.workdir / ".blocks" / f"{time.monotonic_ns()}.sh"
        script.parent.mkdir(exist_ok=True)
        script.write_text(
            "set -euo pipefail\n"
            # Background jobs (a port-forward) end with the block, as a shell closed.
            "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
            '_ef_wait_ports() { for p in "$@"; do for _ in $(seq 300); do\n'
            "  (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done; done; }\n"
            + self._forwarding(body)
        )
        out, err = script.with_suffix(".out"), script.with_suffix(".err")
        with out.open("w") as o, err.open("w") as e:
            proc = subprocess.run(
                ["bash", str(script)], cwd=self.workdir, env=self.env, stdout=o, stderr=e,
                stdin=subprocess.DEVNULL, timeout=timeout, check=False,
            )  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(
                f"{where or 'doc block'} exited {proc.returncode}:\n{body}\n"
                f"--- stdout\n{out.read_text()[-3000:]}\n--- stderr\n{err.read_text()[-3000:]}"
            )
        return out.read_text()
