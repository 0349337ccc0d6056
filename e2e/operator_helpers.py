"""What the operator's e2e modules on the real cluster share: the EventServer they apply,
how they read its conditions and Events, and the bounded wait they poll with."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def wait_for(
    check: Callable[[], T], *, timeout: float, interval: float = 0.5, what: str = "condition"
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # keep polling, report the last one
            last_error = e
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)


def eventserver(name: str, replicas: int = 3, **spec: Any) -> dict[str, Any]:
    """An EventServer as a user writes it; the Event BUS on, as in production."""
    return {
        "apiVersion": "eventfleet.io/v1",
        "kind": "EventServer",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "protocols": {"bus": {"enabled": True}}, **spec},
    }


def condition(es: dict | None, type_: str) -> dict[str, Any]:
    conditions = ((es or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def strip_server_fields(doc: dict) -> dict:
    """What a client would send back: no status, no server-set metadata."""
    doc = json.loads(json.dumps(doc))
    doc.pop("status", None)
    for key in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
        doc["metadata"].pop(key, None)
    return doc


def peers_of(kubectl, name: str) -> list[dict]:
    cm = kubectl.get("configmap", f"{name}-config")
    return yaml.safe_load(cm["data"]["config.yaml"])["peers"] if cm else []


def config_hash(kubectl, name: str) -> str:
    sts = kubectl.get("statefulset", name)
    return sts["spec"]["template"]["metadata"]["annotations"]["eventfleet.io/config-hash"]


def event_reasons(kubectl, name: str) -> set[str]:
    events = kubectl.json("get", "events", "--field-selector", f"involvedObject.name={name}")
    return {e["reason"] for e in events["items"]}


def restarted_events(kubectl, name: str) -> list[str]:
    """The operator's ReplicaRestarted Event messages for ``name``, oldest first."""
    events = kubectl.json("get", "events", "--field-selector", f"involvedObject.name={name}")
    items = sorted(
        events["items"], key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""
    )
    return [e["message"] for e in items if e["reason"] == "ReplicaRestarted"]


def wait_condition(kubectl, name: str, cond: str, timeout: float = 300) -> None:
    """``kubectl wait --for=condition=<cond>`` on the EventServer (bounded)."""
    kubectl.run(
        "wait", f"--for=condition={cond}", f"eventserver/{name}", f"--timeout={int(timeout)}s",
        timeout=timeout + 10,
    )  # fmt: skip
