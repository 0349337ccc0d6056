"""The real-cluster e2e (e2e/kind/run.sh), only where kind and Docker exist.

It is skipped on the project's CI machines, which have neither: there the tests on the
real control plane with the node agent (test_operator.py, test_operator_scaling.py,
test_chart_cluster.py) stand in. Opt in with
``EVENTFLEET_KIND_E2E=1`` on a machine with docker, kind, kubectl and helm.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from e2e.k8s.harness import ROOT

MISSING = [t for t in ("docker", "kind", "kubectl", "helm") if shutil.which(t) is None]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(
    os.environ.get("EVENTFLEET_KIND_E2E") != "1",
    reason="real-cluster e2e: set EVENTFLEET_KIND_E2E=1",
)
@pytest.mark.skipif(
    bool(MISSING), reason=f"real-cluster e2e needs {', '.join(MISSING)} (no Docker engine here)"
)
def test_kind_cluster_end_to_end():
    subprocess.run(["bash", str(ROOT / "e2e" / "kind" / "run.sh")], check=True, timeout=1700)
