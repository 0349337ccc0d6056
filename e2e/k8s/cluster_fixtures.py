"""pytest fixtures on the real control plane (``pytest_plugins = ["e2e.k8s.cluster_fixtures"]``).

One control plane per test session (etcd, kube-apiserver, kube-controller-manager from
scripts/tools/k8s-control-plane.sh), the EventServer CRD and the operator's RBAC
(operator/deploy/rbac.yaml, as is) applied once by the real, validating kubectl. Per test:
a fresh namespace, the real operator running as the ``eventfleet-system/eventfleet-operator``
ServiceAccount (a TokenRequest token, so RBAC is enforced by the API server), and a node
agent (``e2e.k8s.node``) that runs the pods the real StatefulSet controller creates.

The fixture names match ``e2e.k8s.fixtures`` (the emulator's) so a test module moves by
changing its ``pytest_plugins`` line.
"""

from __future__ import annotations

import itertools
import os
import pathlib
from collections.abc import Callable, Iterator

import pytest

from tests import parts

from .controlplane import ControlPlane, available
from .harness import ROOT, Kubectl, OperatorProcess, tool, wait_for
from .node import Fleet, NodeAgent, podman_available

CRD = ROOT / "crds" / "eventfleet.io_eventservers.yaml"
RBAC = ROOT / "operator" / "deploy" / "rbac.yaml"
OPERATOR_SA = ("eventfleet-system", "eventfleet-operator")
_names = itertools.count(1)


@pytest.fixture(scope="session")
def kubectl_binary() -> str:
    binary = tool("kubectl")
    if binary is None:
        parts.skip_missing("kubectl", "no kubectl", "run scripts/tools/k8s-binaries.sh")
    return binary


@pytest.fixture(scope="session")
def control_plane(
    tmp_path_factory: pytest.TempPathFactory, kubectl_binary: str
) -> Iterator[ControlPlane]:
    """The session's control plane, with the CRD and the operator's RBAC applied."""
    reason = available()
    if reason:
        parts.skip_missing("control-plane", reason, "run scripts/tools/k8s-control-plane.sh")
    cluster = ControlPlane(tmp_path_factory.mktemp("controlplane")).start()
    try:
        admin = Kubectl(kubectl_binary, cluster.kubeconfig, validate=True)
        admin.run("apply", "--server-side", "-f", str(CRD.parent))  # every CRD of crds/
        admin.run("wait", "--for=condition=Established", "crd/eventservers.eventfleet.io")
        admin.run("create", "namespace", OPERATOR_SA[0])
        Kubectl(kubectl_binary, cluster.kubeconfig, OPERATOR_SA[0]).run("apply", "-f", str(RBAC))
        # The CRD's OpenAPI is published a moment after Established; validating kubectl
        # needs it, so wait until the server describes the kind.
        wait_for(
            lambda: admin.run("explain", "eventserver.spec.replicas", check=False).returncode == 0,
            timeout=60,
            what="the EventServer schema in the server's OpenAPI",
        )
        yield cluster
    finally:
        cluster.stop()


# The emulator fixtures' name, so tests written for either read the same.
@pytest.fixture
def emulator(control_plane: ControlPlane) -> ControlPlane:
    return control_plane


@pytest.fixture
def namespace(control_plane: ControlPlane, kubectl_binary: str) -> Iterator[str]:
    name = f"e2e-{os.getpid()}-{next(_names)}"
    admin = Kubectl(kubectl_binary, control_plane.kubeconfig, validate=True)
    admin.run("create", "namespace", name)
    try:
        yield name
    finally:
        # The namespace controller deletes everything in it (and the GC their children).
        admin.run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def kubectl(control_plane: ControlPlane, kubectl_binary: str, namespace: str) -> Kubectl:
    """The real kubectl as the cluster admin, validating against the server's OpenAPI."""
    return Kubectl(kubectl_binary, control_plane.kubeconfig, namespace, validate=True)


@pytest.fixture
def urls_file(tmp_path: pathlib.Path) -> pathlib.Path:
    """The operator's --replica-urls-file; the node agent fills it in."""
    return tmp_path / "replica-urls.json"


@pytest.fixture
def operator_kubeconfig(control_plane: ControlPlane, tmp_path: pathlib.Path) -> pathlib.Path:
    """A kubeconfig of the operator's own ServiceAccount (not the admin)."""
    return control_plane.service_account_kubeconfig(*OPERATOR_SA, tmp_path / "operator.kubeconfig")


@pytest.fixture
def operator(
    request: pytest.FixtureRequest,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
    urls_file: pathlib.Path,
) -> Iterator[OperatorProcess]:
    """The real operator process watching this test's namespace, within its RBAC."""
    proc = OperatorProcess(tmp_path, operator_kubeconfig, namespace, urls_file=urls_file).start()
    try:
        yield proc
    finally:
        proc.stop()
        request.node.add_report_section("teardown", "operator log", proc.log()[-20000:])


def _runtime() -> str:
    """``podman``; host processes (``process``) only when a developer allows podman to be
    missing (EVENTFLEET_ALLOW_MISSING=podman, listed in the run's summary), because podman
    is not there or because EVENTFLEET_E2E_RUNTIME=process asks for them. Otherwise a
    missing podman fails the test: pods as host processes run without the image, its user
    and its read-only root, and a test could pass for the wrong reason."""
    wanted = os.environ.get("EVENTFLEET_E2E_RUNTIME", "podman")
    reason = podman_available()
    if wanted == "process":
        reason = "EVENTFLEET_E2E_RUNTIME=process"
    if reason:
        parts.missing("podman", f"{reason}: pods run as host processes", "scripts/tools/images.sh")
        return "process"
    return wanted


@pytest.fixture
def node(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: pathlib.Path,
    urls_file: pathlib.Path,
) -> Iterator[NodeAgent]:
    """The node agent running this namespace's pods."""
    agent = NodeAgent(control_plane, namespace, tmp_path, urls_file, runtime=_runtime())
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
        logs = [
            f"--- {p.parent.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted((agent.workdir / "pods").glob("*/container.log"))
        ]
        request.node.add_report_section(
            "teardown", f"node {agent.node} ({agent.runtime})", "\n".join([*agent.errors, *logs])
        )


@pytest.fixture
def kubelet(node: NodeAgent) -> Callable[[str], Fleet]:
    """``kubelet(name)``: the pods of fleet ``name`` (the node agent runs all of them)."""
    return node.fleet
