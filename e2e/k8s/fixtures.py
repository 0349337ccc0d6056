"""pytest fixtures for the operator e2e tests on the API emulator (star-import them into
the test module; see ``__all__``).

One emulator process per test module; per test a fresh namespace, the real operator
watching it, and fake kubelets running real replica processes for the fleets it needs.
"""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Callable, Iterator

import pytest

from tests import parts

from .harness import ROOT, Api, EmulatorProcess, Kubectl, OperatorProcess, tool
from .kubelet import FakeKubelet

CRD = ROOT / "crds" / "eventfleet.io_eventservers.yaml"
_names = itertools.count(1)

# Imported into each emulator test module (``from e2e.k8s.fixtures import *``), never
# registered as a plugin: the real control plane's fixtures (e2e.k8s.cluster_fixtures)
# have the same names and are the global ones; a module-level fixture wins in its module.
__all__ = [
    "api",
    "emulator",
    "kubectl",
    "kubectl_binary",
    "kubelet",
    "namespace",
    "operator",
    "urls_file",
]


# Session scope, as in e2e.k8s.cluster_fixtures: both modules define it, and whichever
# pytest registered first serves every test of the run (a session-scoped control plane
# must not get a module-scoped one).
@pytest.fixture(scope="session")
def kubectl_binary() -> str:
    binary = tool("kubectl")
    if binary is None:
        parts.skip_missing("kubectl", "no kubectl", "run scripts/tools/k8s-binaries.sh")
    return binary


@pytest.fixture(scope="module")
def emulator(
    tmp_path_factory: pytest.TempPathFactory, kubectl_binary: str
) -> Iterator[EmulatorProcess]:
    """The API emulator with the EventServer CRD applied by the real kubectl."""
    proc = EmulatorProcess(tmp_path_factory.mktemp("emulator")).start()
    try:
        # Every CRD of crds/ (EventServer, EventServerBackup): a directory apply.
        Kubectl(kubectl_binary, proc.kubeconfig).run(
            "apply", "--validate=false", "-f", str(CRD.parent)
        )
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def api(emulator: EmulatorProcess) -> Api:
    return Api(emulator.url)


@pytest.fixture
def namespace(emulator: EmulatorProcess, kubectl_binary: str) -> str:
    name = f"e2e-{next(_names)}"
    Kubectl(kubectl_binary, emulator.kubeconfig).run("create", "namespace", name)
    return name


@pytest.fixture
def kubectl(emulator: EmulatorProcess, kubectl_binary: str, namespace: str) -> Kubectl:
    return Kubectl(kubectl_binary, emulator.kubeconfig, namespace)


@pytest.fixture
def urls_file(tmp_path: pathlib.Path) -> pathlib.Path:
    """The operator's --replica-urls-file; the fake kubelets fill it in."""
    return tmp_path / "replica-urls.json"


@pytest.fixture
def operator(
    request: pytest.FixtureRequest,
    emulator: EmulatorProcess,
    namespace: str,
    tmp_path: pathlib.Path,
    urls_file: pathlib.Path,
) -> Iterator[OperatorProcess]:
    """The real operator process watching this test's namespace."""
    proc = OperatorProcess(tmp_path, emulator.kubeconfig, namespace, urls_file=urls_file).start()
    try:
        yield proc
    finally:
        proc.stop()
        request.node.add_report_section("teardown", "operator log", proc.log()[-20000:])


@pytest.fixture
def kubelet(
    request: pytest.FixtureRequest,
    api: Api,
    namespace: str,
    tmp_path: pathlib.Path,
    urls_file: pathlib.Path,
) -> Iterator[Callable[[str], FakeKubelet]]:
    """``kubelet(name)`` starts playing the StatefulSet controller/kubelet for a fleet."""
    started: list[FakeKubelet] = []

    def start(name: str) -> FakeKubelet:
        k = FakeKubelet(api, namespace, name, tmp_path, urls_file)
        k.start()
        started.append(k)
        return k

    try:
        yield start
    finally:
        for k in started:
            k.stop()
            logs = [
                f"--- {p.parent.name}\n{p.read_text()[-4000:]}"
                for p in sorted(k.workdir.glob("*/replica.log"))
            ]
            request.node.add_report_section(
                "teardown", f"kubelet {k.name}", "\n".join([*k.errors, *logs])
            )
