"""Day-2 tests that need only the API and the operator, on the real control plane.

The same test functions as ``e2e/test_operator_day2.py`` (which runs them on the API
emulator, with its fake kubelet for the pod-level scenarios); here the real API server
does server-side apply's field ownership and the NetworkPolicy's validation.
"""

from __future__ import annotations

import pytest

from e2e.test_operator_day2 import (
    test_a_foreign_object_is_never_adopted_and_the_fleet_gets_a_network_policy,
    test_fields_the_operator_stops_setting_are_removed,
)

pytest_plugins = ["e2e.k8s.cluster_fixtures"]
pytestmark = pytest.mark.timeout(420)

__all__ = [
    "test_a_foreign_object_is_never_adopted_and_the_fleet_gets_a_network_policy",
    "test_fields_the_operator_stops_setting_are_removed",
]
