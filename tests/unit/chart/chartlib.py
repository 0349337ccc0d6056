"""Helpers shared by the chart tests (unit and e2e): real helm, rendering, CRD schemas."""

from __future__ import annotations

import copy
import os
import pathlib
import shutil
import subprocess
import threading

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "eventfleet-operator"
EVERYTHING_ON = CHART / "ci" / "everything-on-values.yaml"
EXTERNAL_CRDS = REPO.parent / "shared" / "external-crds"
KUBE_VERSION = "1.33.0"

_install_lock = threading.Lock()
_install_tried: set[str] = set()
# The project script that installs each external binary (CI runs them all first).
INSTALLERS = {
    "helm": "k8s-binaries.sh",
    "kubectl": "k8s-binaries.sh",
    "promtool": "prometheus.sh",
}


def tool(name: str) -> str:
    """Path of a real binary, installing it with the project's script if absent.

    CI runs scripts/tools/*.sh before pytest, so the first branch normally wins; running
    the script here only helps someone who calls pytest directly. Skips (never fails)
    only when the binary cannot be installed at all, e.g. the registry is unreachable.
    """
    local = REPO / ".tools" / "bin" / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    script = REPO / "scripts" / "tools" / INSTALLERS[name]
    with _install_lock:
        if script.name not in _install_tried and script.exists():
            _install_tried.add(script.name)
            subprocess.run(["bash", str(script)], check=False, timeout=600)
    if local.is_file() or shutil.which(name):
        return str(local) if local.is_file() else shutil.which(name)
    pytest.skip(f"{name} is not installed and scripts/tools/{script.name} could not install it")


def helm_env(home: pathlib.Path) -> dict[str, str]:
    """Environment that keeps helm's cache, config and plugins in a throw-away directory."""
    env = dict(os.environ)
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        path = home / var.lower()
        path.mkdir(parents=True, exist_ok=True)
        env[var] = str(path)
    return env


def helm(home: pathlib.Path, *args: str, check: bool = True, timeout: float = 60, env=None):
    proc = subprocess.run(
        [tool("helm"), *args],
        env={**helm_env(home), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def render(
    home: pathlib.Path,
    *values_files: pathlib.Path,
    sets: tuple[str, ...] = (),
    namespace: str = "eventfleet-system",
    release: str = "ef",
    tests: bool = False,
) -> list[dict]:
    """`helm template --include-crds` at the tested Kubernetes version, parsed.

    Without ``tests`` the `helm test` hooks are left out: they are not installed objects.
    """
    args = ["template", release, str(CHART), "--namespace", namespace, "--include-crds"]
    if not tests:
        args.append("--skip-tests")
    args += ["--kube-version", KUBE_VERSION]
    for f in values_files:
        args += ["--values", str(f)]
    for s in sets:
        args += ["--set", s]
    out = helm(home, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def crd_version_schema(crd: dict, version: str | None = None) -> dict:
    """The openAPIV3Schema of a CRD version (the storage version by default)."""
    for v in crd["spec"]["versions"]:
        if (version is None and v.get("storage")) or v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(version)


def structural_to_jsonschema(schema: dict) -> dict:
    """Turn a Kubernetes structural schema into plain JSON Schema for `jsonschema`.

    The Kubernetes dialect differs in three ways that matter for validating objects:
    `nullable: true` admits null, `x-kubernetes-int-or-string` admits an integer or a
    string, and `x-kubernetes-preserve-unknown-fields` admits any extra field. The other
    `x-kubernetes-*` keys only steer the API server (merge strategies, list types) and
    are dropped. Object metadata (`apiVersion`, `kind`, `metadata`) is left open because
    the API server, not the CRD, validates it.
    """

    def walk(node):
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
        out.pop("nullable", None)
        if node.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if node.get("nullable") and "type" in out:
            out["type"] = [out["type"], "null"]
        if node.get("x-kubernetes-preserve-unknown-fields"):
            out.pop("additionalProperties", None)
        elif out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out

    converted = walk(copy.deepcopy(schema))
    props = converted.setdefault("properties", {})
    for key in ("apiVersion", "kind"):
        props.setdefault(key, {"type": "string"})
    props.setdefault("metadata", {"type": "object"})
    return converted


def external_crd(relpath: str) -> dict:
    """An upstream CRD from the shared folder beside the checkout, else the e2e copy."""
    name = pathlib.PurePosixPath(relpath).name
    for path in (EXTERNAL_CRDS / relpath, REPO / "e2e" / "k8s" / "external-crds" / name):
        if path.exists():
            return yaml.safe_load(path.read_text())
    pytest.fail(f"external CRD {relpath} is neither in {EXTERNAL_CRDS} nor in e2e/k8s/")
