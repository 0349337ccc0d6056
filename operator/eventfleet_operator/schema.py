"""Storage schema versions: a replica image never opens a store of a newer schema.

Each replica reports the schema version of its store in ``/status``
(``storage.schema_version``); the operator keeps the highest it has seen in
``status.storageSchemaVersion``. A replica started on a store whose schema is newer than
it knows (an image downgrade across a schema change) refuses to start, before anything
in the file changes, with one line naming the file and both versions; that line is the
container's termination message (``terminationMessagePolicy: FallbackToLogsOnError``),
which the operator reads from the pod to say why the rollout stopped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# The replica's SchemaVersionError text (eventfleet_server.storage.errors).
_REFUSAL = re.compile(
    r"(?P<file>\S+): storage schema version (?P<found>\d+) is newer than this "
    r"replica's (?P<known>\d+)"
)


def refusal(pod: Mapping[str, Any]) -> tuple[str, int, int] | None:
    """(file, store's version, image's version) when the pod's replica container last
    stopped because its store's schema is newer than its image knows."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            message = str((state.get("terminated") or {}).get("message") or "")
            found = _REFUSAL.search(message)
            if found:
                return found["file"], int(found["found"]), int(found["known"])
    return None


def problem(pods: Iterable[tuple[str, Mapping[str, Any]]], highest: int | None) -> str:
    """The ``Ready=False`` (``StorageSchemaTooNew``) message, or "" when no pod refuses."""
    refused = []
    for name, pod in pods:
        found = refusal(pod)
        if found is not None:
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            file, data, known = found
            refused.append(
                f"{name} (image {containers[0].get('image', '?')}, storage schema {known}) "
                f"refuses {file} of storage schema {data}"
            )
    if not refused:
        return ""
    seen = f" (the fleet's stores are at version {highest})" if highest else ""
    return (
        f"{'; '.join(refused)}{seen}: a downgrade across storage schema versions is "
        "refused before any store changes; set spec.image back to the newer image (the "
        "managed rollout replaces no other pod meanwhile)"
    )


def highest(previous: int | None, reported: Iterable[int | None]) -> int | None:
    """The highest storage schema version seen so far (never goes down)."""
    values = [v for v in (previous, *reported) if isinstance(v, int)]
    return max(values) if values else None
