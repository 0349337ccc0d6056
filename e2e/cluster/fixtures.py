"""pytest fixtures on the real single-node cluster (``pytest_plugins = ["e2e.cluster.fixtures"]``).

``real_cluster`` is session-scoped and lazy: the cluster starts only when a collected test
asks for it, once for the whole session, and is taken down at the end with every process
stopped by pid and every host change undone. When it cannot start (no root, Go, containers
or built binaries) the test fails with the reason — it is never skipped.

A module that wants shorter names (``kubectl`` for ``ckubectl``) defines them as its own
module-scoped fixtures; ``operator_values`` is the one to override for ``helm --set``.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
from collections.abc import Iterator

import pytest

from .clients import ClusterKubectl, OperatorDeployment, helm
from .cluster import Cluster, ClusterError
from .layout import ROOT

CHART = ROOT / "charts" / "eventfleet-operator"
_names = itertools.count(1)
# The chart's readiness probe timings, shorter (chart values a user may set too): with
# the defaults (first probe after 5 s, then every 10 s) each start of the operator
# (install, upgrade, scale back to 1) waited up to 10 s more for its pod to be Ready
# than the operator took to serve /healthz. The defaults themselves are installed by
# e2e/test_chart_cluster.py and e2e/test_docs_cluster.py.
FAST_READINESS = (
    "--set", "readinessProbe.initialDelaySeconds=1",
    "--set", "readinessProbe.periodSeconds=2",
)  # fmt: skip


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the real cluster run last, in their order: the cluster starts once,
    is never left idle (iptables rules, ~1 GiB of memory) while the others run, and goes
    down when the session ends."""
    on_cluster = [i for i in items if "real_cluster" in getattr(i, "fixturenames", ())]
    if on_cluster:
        chosen = set(on_cluster)
        items[:] = [i for i in items if i not in chosen] + on_cluster


_session_cluster: list[Cluster] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failing test on the cluster says so when the kubelet ran out of disk before it:
    the images it deleted (the pause image among them) fail every later pod, and the
    test's own message would not name the cause."""
    report = yield
    if report.failed and _session_cluster and "real_cluster" in getattr(item, "fixturenames", ()):
        reclaims = _session_cluster[0].disk_reclaims()
        if reclaims:
            report.sections.append(
                (
                    "cluster disk pressure",
                    "the kubelet ran short of disk and deleted images or evicted pods; "
                    "this failure may follow from that:\n" + "\n".join(reclaims[:10]),
                )
            )
    return report


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's cluster (admin kubeconfig: ``real_cluster.kubeconfig``).

    A developer iterating on one module may start the cluster once by hand
    (``scripts/cluster up``) and name its work directory in EVENTFLEET_CLUSTER_WORKDIR:
    the session then uses that cluster and leaves it up (``scripts/cluster down`` ends it).
    CI never sets it: there the session starts and stops its own cluster.
    """
    given = os.environ.get("EVENTFLEET_CLUSTER_WORKDIR")
    if given:
        cluster = Cluster(pathlib.Path(given))
        down = [n for n, s in cluster.status()["processes"].items() if s != "running"]
        if not cluster.state or down:
            pytest.fail(
                f"EVENTFLEET_CLUSTER_WORKDIR={given}: no cluster up there (not running: {down})",
                pytrace=False,
            )
        yield cluster
        return
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.up()
    except ClusterError as e:
        pytest.fail(f"the single-node cluster did not come up: {e}", pytrace=False)
    _session_cluster.append(cluster)
    try:
        yield cluster
    finally:
        _session_cluster.clear()
        reclaims = cluster.disk_reclaims()
        report = cluster.down()
        problems = report["failed"] + report["leftovers"] + report["running"]
        if problems:
            pytest.fail(
                "the cluster did not go down cleanly: " + json.dumps(report, indent=1),
                pytrace=False,
            )
        if reclaims:
            pytest.fail(
                "the kubelet ran short of disk during the session and deleted images or "
                "evicted pods (tests after it may have failed for that):\n"
                + "\n".join(reclaims[:10]),
                pytrace=False,
            )


@pytest.fixture(scope="module")
def restricted_namespace(real_cluster: Cluster) -> Iterator[str]:
    """A namespace enforcing the ``restricted`` Pod Security Standard (deleted after)."""
    name = f"ef-{os.getpid()}-{next(_names)}"
    real_cluster.kubectl("create", "namespace", name)
    real_cluster.kubectl(
        "label", "namespace", name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    try:
        yield name
    finally:
        real_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator_values() -> tuple[str, ...]:
    """Extra ``helm install`` arguments (``--set``...) for the module's operator, as a
    user would pass them; a module overrides this fixture to change them."""
    return ()


@pytest.fixture(scope="module")
def operator_release(
    real_cluster: Cluster,
    restricted_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
    operator_values: tuple[str, ...],
) -> Iterator[str]:
    """``helm install`` of the chart into the namespace, as a user does (defaults: the
    operator watches its release namespace); waits for the operator's Deployment."""
    home = tmp_path_factory.mktemp("helm")
    release = "ef"
    _delete_kept_crds(real_cluster)
    try:
        # Inside the try: a failed `--wait` still leaves a release (and its cluster-wide
        # RBAC) behind, which every later module's install would trip over.
        helm(
            real_cluster, home, "install", release, str(CHART), "--namespace", restricted_namespace,
            "--wait", "--timeout", "180s", *FAST_READINESS, *operator_values,
        )  # fmt: skip
        yield release
    finally:
        # Fleets first: their finalizer needs the operator to go away.
        real_cluster.kubectl(
            "-n", restricted_namespace, "delete", "eventservers", "--all", "--timeout=120s",
            check=False,
        )  # fmt: skip
        try:
            helm(
                real_cluster, home, "uninstall", release, "--namespace", restricted_namespace,
                "--wait",
            )  # fmt: skip
        except AssertionError as e:
            if "release: not found" not in str(e):  # an install refused before it began
                raise
        _delete_kept_crds(real_cluster)


def _delete_kept_crds(cluster: Cluster) -> None:
    """The chart keeps its CRDs on uninstall (``crds.keep``, so that users' EventServers
    survive a reinstall); they still carry the old release's ownership, which the next
    module's ``helm install`` in another namespace refuses. Deleted here as a user who
    uninstalls for good does (docs/operator.md), with the EventServers already gone."""
    listed = cluster.kubectl("get", "crd", "-o", "json")
    names = [
        c["metadata"]["name"]
        for c in json.loads(listed.stdout)["items"]
        if c["spec"]["group"] == "eventfleet.io"
        and "meta.helm.sh/release-namespace" in (c["metadata"].get("annotations") or {})
    ]
    if names:
        cluster.kubectl("delete", "crd", *names, "--timeout=120s", timeout=130)


@pytest.fixture(scope="module")
def ckubectl(real_cluster: Cluster, restricted_namespace: str) -> ClusterKubectl:
    return ClusterKubectl(real_cluster, restricted_namespace)


@pytest.fixture(scope="module")
def operator_pod(ckubectl: ClusterKubectl, operator_release: str) -> OperatorDeployment:
    """The chart's operator Deployment: stop/start it, scrape its metrics, read its log."""
    return OperatorDeployment(ckubectl, f"{operator_release}-eventfleet-operator")
