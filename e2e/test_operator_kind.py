"""The real-cluster e2e (e2e/kind/run.sh), only where kind and Docker exist.

A developer-only test: the project's CI machines have neither, and there the tests on the
real single-node cluster (e2e/cluster: test_operator.py, test_operator_scaling.py,
test_operator_day2_cluster.py...) stand in. It is deselected (not skipped: a CI run's skips are only
ever missing parts, and CI allows none) unless ``EVENTFLEET_KIND_E2E=1``, on a machine
with docker, kind, kubectl and helm.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from e2e.cluster.layout import ROOT

MISSING = [t for t in ("docker", "kind", "kubectl", "helm") if shutil.which(t) is None]


# Opt-in (EVENTFLEET_KIND_E2E=1, see e2e/conftest.py): deselected otherwise, never skipped.
# Opted in, a missing tool fails the test.
@pytest.mark.kind
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kind_cluster_end_to_end():
    assert not MISSING, f"EVENTFLEET_KIND_E2E=1 but {', '.join(MISSING)} not on PATH"
    subprocess.run(["bash", str(ROOT / "e2e" / "kind" / "run.sh")], check=True, timeout=1700)
