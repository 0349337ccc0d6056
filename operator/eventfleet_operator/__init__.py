"""eventfleet operator: turns ``EventServer`` resources into wired replica fleets.

Rooms: ``model`` (the parsed spec), ``naming`` (names and labels), ``builders`` (pure
child manifests), ``kube`` (a small async Kubernetes client), ``replicas`` (the
replicas' HTTP contract), ``scaling`` (safe scale-down), ``status`` (conditions and
phase), ``reconcile`` (one level-based pass), ``handlers`` (Kopf wiring) and ``cli``.

The operator never imports the replica's code (``eventfleet_server``); it talks to
replicas over HTTP only.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("eventfleet")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

GROUP = "eventfleet.io"
VERSION = "v1"
PLURAL = "eventservers"
KIND = "EventServer"
