"""scripts/package-chart: the `helm package` archive and its OCI image layout.

The layout is checked against the OCI image-layout rules (every blob named by its
digest, sizes right, the tag in index.json) and then pulled with the real `helm pull
oci://` from a stand-in registry on loopback that serves the layout read-only through
the OCI distribution API (no registry runs in the unit suite): helm must get back the
exact archive `helm package` wrote, and install-render it.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import pathlib
import re
import subprocess
import sys
import threading

import pytest
import yaml

from tests.unit.chart.chartlib import CHART, KUBE_VERSION, REPO, helm

SCRIPT = REPO / "scripts" / "package-chart"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("helm-home")


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    return out / f"eventfleet-operator-{version}.tgz", out / "oci", version


def _blob(layout: pathlib.Path, descriptor: dict) -> bytes:
    algorithm, digest = descriptor["digest"].split(":")
    data = (layout / "blobs" / algorithm / digest).read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest
    assert len(data) == descriptor["size"]
    return data


def test_layout_holds_the_packaged_chart_as_a_helm_artifact(packaged):
    archive, layout, version = packaged
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    (descriptor,) = index["manifests"]
    assert descriptor["annotations"]["org.opencontainers.image.ref.name"] == version
    manifest = json.loads(_blob(layout, descriptor))
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    config = json.loads(_blob(layout, manifest["config"]))
    assert config["name"] == "eventfleet-operator" and config["version"] == version
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    assert _blob(layout, layer) == archive.read_bytes()
    # Nothing else in the layout.
    blobs = {p.name for p in (layout / "blobs" / "sha256").iterdir()}
    assert blobs == {d["digest"].split(":")[1] for d in (descriptor, manifest["config"], layer)}


class LayoutRegistry:
    """Read-only OCI distribution API over one image layout, repository ``charts/<name>``."""

    def __init__(self, layout: pathlib.Path, repository: str):
        index = json.loads((layout / "index.json").read_text())
        self.tags = {
            d["annotations"]["org.opencontainers.image.ref.name"]: d for d in index["manifests"]
        }
        prefix = f"/v2/{repository}"
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body=b"", media_type="application/json", digest=None):
                self.send_response(status)
                self.send_header("Content-Type", media_type)
                self.send_header("Content-Length", str(len(body)))
                if digest:
                    self.send_header("Docker-Content-Digest", digest)
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                path = self.path.split("?")[0]
                if path in ("/v2", "/v2/"):
                    return self._send(200, b"{}")
                if path == f"{prefix}/tags/list":
                    tags = {"name": repository, "tags": sorted(registry.tags)}
                    return self._send(200, json.dumps(tags).encode())
                m = re.fullmatch(rf"{re.escape(prefix)}/(manifests|blobs)/(.+)", path)
                if not m:
                    return self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}')
                kind, ref = m.groups()
                descriptor = registry.tags.get(ref)
                digest = descriptor["digest"] if descriptor else ref
                blob = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
                if not digest.startswith("sha256:") or not blob.is_file():
                    return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                data = blob.read_bytes()
                media_type = (
                    json.loads(data).get("mediaType", "application/octet-stream")
                    if kind == "manifests"
                    else "application/octet-stream"
                )
                return self._send(200, data, media_type, digest)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_helm_pulls_the_layout_and_gets_the_packaged_archive(packaged, home, tmp_path):
    archive, layout, version = packaged
    registry = LayoutRegistry(layout, "charts/eventfleet-operator")
    try:
        ref = f"oci://{registry.address}/charts/eventfleet-operator"
        pulled = tmp_path / "pulled"
        pulled.mkdir()
        helm(home, "pull", ref, "--version", version, "--plain-http", "-d", str(pulled))
        assert (pulled / archive.name).read_bytes() == archive.read_bytes()
        # ... and renders as an install would (the chart from the registry, not the tree).
        out = helm(
            home,
            "template",
            "ef",
            ref,
            "--version",
            version,
            "--plain-http",
            "-n",
            "eventfleet-system",
            "--kube-version",
            KUBE_VERSION,
        ).stdout
        kinds = {d["kind"] for d in yaml.safe_load_all(out) if d}
        assert {"Deployment", "CustomResourceDefinition", "ServiceAccount"} <= kinds
    finally:
        registry.close()


def test_packaged_archive_installs_what_the_readme_says(packaged):
    archive, _, version = packaged
    assert archive.name == f"eventfleet-operator-{version}.tgz"
    readme = (CHART / "README.md").read_text()
    assert "scripts/package-chart" in readme
    assert "helm install eventfleet-operator dist/chart/eventfleet-operator-" in readme
