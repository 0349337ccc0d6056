"""The local fleet: N replicas as processes on loopback (``eventfleet fleet``).

`layout` decides ports, directories and configuration files; `supervisor` runs the
processes like a StatefulSet would. See docs/fleet.md.
"""

from eventfleet_server.fleet.layout import FleetError, FleetPlan, ReplicaLayout, plan, prepare
from eventfleet_server.fleet.supervisor import Supervisor

__all__ = ["FleetError", "FleetPlan", "ReplicaLayout", "Supervisor", "plan", "prepare"]
