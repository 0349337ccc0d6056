"""HTTP endpoint of a replica: metrics, health, readiness, status and protocol mount points.

See docs/observability.md for the endpoints, every metric and the ``/status`` contract.
"""

from eventfleet_server.http.server import HttpServer
from eventfleet_server.http.status import STATUS_VERSION

__all__ = ["STATUS_VERSION", "HttpServer"]
