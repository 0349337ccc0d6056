"""Prometheus on the host, configured from the ServiceMonitors the operator wrote.

prometheus-operator is not run here (docs/observability.md says why): this module does
its part. It reads a ServiceMonitor from the API server and writes the scrape job
prometheus-operator generates for it: the selector as ``keep`` relabelling on the
Service's labels, the endpoint's port, path, scheme, interval and ``tlsConfig`` (the CA
taken from the Secret the ServiceMonitor names, as prometheus-operator copies it into
Prometheus' configuration), the ``namespace``/``service``/``pod``/``endpoint``/``job``
target labels. The real ``prometheus`` (scripts/tools/prometheus.sh) applies that
relabelling and scrapes the pods over the bridge, as a Prometheus with ``hostNetwork``
on the node would.

One part is played here instead of by Prometheus: Kubernetes service discovery.
Debian's ``prometheus`` is built without it (Debian removed it in 1.5.0 for its client
library's dependencies; ``kubernetes_sd_configs`` is not a field there), so
:func:`discover` does what ``kubernetes_sd_configs`` with ``role: endpoints`` does —
reads the namespace's Endpoints, Services and Pods from the real API server with the
token of a ServiceAccount bound to the read-only Role Prometheus is given (the server's
RBAC applies) — and hands Prometheus the same targets with the same ``__meta_kubernetes_*``
labels through ``file_sd_configs``.
"""

from __future__ import annotations

import base64
import json
import pathlib
import re
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Any

import yaml

from tests.integration.test_http_promtool import prometheus_tool

from .clients import ClusterKubectl

PROMETHEUS_ACCOUNT = "prometheus"


def _label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus' service discovery names it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def prometheus_identity(k: ClusterKubectl, workdir: pathlib.Path) -> pathlib.Path:
    """A ServiceAccount with read access to services, endpoints and pods of the
    namespace (what Prometheus needs for ``role: endpoints``); its token in a file."""
    ns = k.namespace
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PROMETHEUS_ACCOUNT}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": PROMETHEUS_ACCOUNT},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "endpoints", "pods"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": PROMETHEUS_ACCOUNT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": PROMETHEUS_ACCOUNT,
            },
            "subjects": [{"kind": "ServiceAccount", "name": PROMETHEUS_ACCOUNT, "namespace": ns}],
        },
    ]
    for doc in docs:
        k.apply(doc)
    token = k.run("create", "token", PROMETHEUS_ACCOUNT, "--duration=2h").stdout.strip()
    path = workdir / "prometheus.token"
    path.write_text(token)
    path.chmod(0o600)
    return path


def _secret_file(k: ClusterKubectl, ref: dict[str, str], workdir: pathlib.Path) -> str:
    """A Secret key the ServiceMonitor names, as a file (prometheus-operator copies it
    into Prometheus' own Secret, ``secret_<ns>_<name>_<key>``)."""
    secret = k.get("secret", ref["name"])
    if secret is None or ref["key"] not in (secret.get("data") or {}):
        raise AssertionError(f"secret {ref['name']} has no key {ref['key']!r}")
    path = workdir / f"secret_{k.namespace}_{ref['name']}_{ref['key']}"
    path.write_bytes(base64.b64decode(secret["data"][ref["key"]]))
    return str(path)


def scrape_jobs(
    k: ClusterKubectl, monitor: dict[str, Any], *, sd_file: pathlib.Path, workdir: pathlib.Path
) -> list[dict[str, Any]]:
    """The scrape jobs prometheus-operator generates for ``monitor`` (one per endpoint),
    their targets discovered into ``sd_file`` (:func:`discover`)."""
    meta, spec = monitor["metadata"], monitor["spec"]
    selector = spec["selector"]
    if set(selector) - {"matchLabels"}:
        raise AssertionError(f"only matchLabels selectors are translated: {selector}")
    namespaces = (spec.get("namespaceSelector") or {}).get("matchNames") or [meta["namespace"]]
    if namespaces != [k.namespace]:
        raise AssertionError(f"{meta['name']}: other namespaces than {k.namespace}: {namespaces}")
    keep = []
    for key, value in sorted(selector["matchLabels"].items()):
        name = _label_name(key)
        keep.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{name}",
                    f"__meta_kubernetes_service_labelpresent_{name}",
                ],
                "regex": f"({re.escape(value)});true",
            }
        )
    jobs = []
    for index, endpoint in enumerate(spec["endpoints"]):
        if "port" not in endpoint:
            raise AssertionError(f"only named ports are translated: {endpoint}")
        job: dict[str, Any] = {
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            # In place of kubernetes_sd_configs (role: endpoints, these namespaces): the
            # targets discover() writes, with the labels Kubernetes discovery gives.
            "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "5s"}],
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "relabel_configs": [
                *keep,
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": re.escape(endpoint["port"]),
                },
                {
                    "source_labels": [
                        "__meta_kubernetes_endpoint_address_target_kind",
                        "__meta_kubernetes_endpoint_address_target_name",
                    ],
                    "separator": ";",
                    "regex": "Pod;(.*)",
                    "replacement": "${1}",
                    "target_label": "pod",
                },
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {
                    "source_labels": ["__meta_kubernetes_pod_container_name"],
                    "target_label": "container",
                },
                {
                    "action": "drop",
                    "source_labels": ["__meta_kubernetes_pod_phase"],
                    "regex": "(Failed|Succeeded)",
                },
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
                {"target_label": "endpoint", "replacement": endpoint["port"]},
            ],
        }
        if "interval" in endpoint:
            job["scrape_interval"] = endpoint["interval"]
        tls = endpoint.get("tlsConfig")
        if tls:
            config: dict[str, Any] = {}
            if "ca" in tls:
                config["ca_file"] = _secret_file(k, tls["ca"]["secret"], workdir)
            if "serverName" in tls:
                config["server_name"] = tls["serverName"]
            config["insecure_skip_verify"] = bool(tls.get("insecureSkipVerify", False))
            unknown = set(tls) - {"ca", "serverName", "insecureSkipVerify"}
            if unknown:
                raise AssertionError(f"tlsConfig fields not translated: {sorted(unknown)}")
            job["tls_config"] = config
        jobs.append(job)
    return jobs


def _api_get(api_server: str, api_ca: pathlib.Path, token: str, path: str) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(api_ca))
    request = urllib.request.Request(
        f"{api_server}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=15, context=context) as r:
        return json.load(r)


def discover(
    namespace: str, *, api_server: str, api_ca: pathlib.Path, token_file: pathlib.Path
) -> list[dict[str, Any]]:
    """The targets ``kubernetes_sd_configs`` (``role: endpoints``) finds in ``namespace``,
    read from the API server as the ServiceAccount of ``token_file``, in file_sd form.

    One target per address (ready or not) and port of every Endpoints object, labelled
    as Prometheus' Kubernetes discovery labels it: the namespace, the Service's name and
    labels, the endpoint's port and readiness, the address' target, and the pod's name,
    phase and the container that declares the port.
    """
    token = token_file.read_text().strip()
    base = f"/api/v1/namespaces/{namespace}"

    def items(kind: str) -> list[dict[str, Any]]:
        return _api_get(api_server, api_ca, token, f"{base}/{kind}")["items"]

    services = {s["metadata"]["name"]: s for s in items("services")}
    pods = {p["metadata"]["name"]: p for p in items("pods")}
    groups = []
    for endpoints in items("endpoints"):
        name = endpoints["metadata"]["name"]
        service = services.get(name)
        if service is None:
            continue  # Prometheus' discovery waits for the Service too
        common = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_service_name": name,
        }
        for key, value in (service["metadata"].get("labels") or {}).items():
            common[f"__meta_kubernetes_service_label_{_label_name(key)}"] = value
            common[f"__meta_kubernetes_service_labelpresent_{_label_name(key)}"] = "true"
        for subset in endpoints.get("subsets") or []:
            addresses = [(a, "true") for a in subset.get("addresses") or []]
            addresses += [(a, "false") for a in subset.get("notReadyAddresses") or []]
            for address, ready in addresses:
                for port in subset.get("ports") or []:
                    labels = {
                        **common,
                        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                        "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
                        "__meta_kubernetes_endpoint_ready": ready,
                    }
                    target = address.get("targetRef") or {}
                    if target:
                        labels["__meta_kubernetes_endpoint_address_target_kind"] = target["kind"]
                        labels["__meta_kubernetes_endpoint_address_target_name"] = target["name"]
                    pod = pods.get(target.get("name", "")) if target.get("kind") == "Pod" else None
                    if pod is not None:
                        labels["__meta_kubernetes_pod_name"] = pod["metadata"]["name"]
                        labels["__meta_kubernetes_pod_phase"] = pod["status"].get("phase", "")
                        for container in pod["spec"]["containers"]:
                            declared = {p["containerPort"] for p in container.get("ports") or []}
                            if port["port"] in declared:
                                labels["__meta_kubernetes_pod_container_name"] = container["name"]
                    groups.append(
                        {"targets": [f"{address['ip']}:{port['port']}"], "labels": labels}
                    )
    return groups


def write_targets(path: pathlib.Path, groups: list[dict[str, Any]]) -> None:
    """Replace the file_sd file at once (Prometheus never reads half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=1))
    tmp.rename(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """The real ``prometheus`` on 127.0.0.1 with the given scrape jobs (a temporary TSDB);
    stopped by its pid with :meth:`stop`."""

    def __init__(self, jobs: list[dict[str, Any]], workdir: pathlib.Path) -> None:
        self.workdir = workdir
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({"scrape_configs": jobs}, sort_keys=False))
        check = subprocess.run(
            [prometheus_tool("promtool"), "check", "config", str(config)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if check.returncode != 0:
            raise AssertionError(f"promtool check config: {check.stdout}{check.stderr}")
        self.log = workdir / "prometheus.log"
        port = _free_port()
        self.base = f"http://127.0.0.1:{port}"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    prometheus_tool("prometheus"), f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"prometheus not ready: {self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets", state="active")["activeTargets"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
