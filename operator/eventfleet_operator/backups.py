"""Backups of a fleet: EventServerBackup objects, the schedule and the pruning.

An ``EventServerBackup`` names a fleet (``spec.eventServer``). The operator picks a
replica that is ready and ``synced`` with every peer (highest ordinal first, so that
replica 0, the one every client sees first in the Service, is the last choice), asks it
for ``POST /backup?name=<object name>`` with the fleet's token, and records the answer
(object key, digest, times) in the status, with a Kubernetes Event. No such replica:
``Pending`` with the reason, retried on the next tick. The replica does the copy and the
upload itself, with its own S3 credentials (docs/backup.md): the operator never reads
the credentials Secret.

``spec.backup.schedule`` is evaluated on the fleet's resync timer, level-based: the last
scheduled object's creation time (or the fleet's) is where the next slot is searched
from, and the object of a slot has a deterministic name (``<fleet>-<YYYYMMDDHHMM>``, with
the seconds for an ``@every`` interval under a minute), so a restarted operator neither
repeats nor skips a slot. Completed scheduled backups
beyond ``spec.backup.retention`` are pruned oldest first: the replica deletes the
object (``DELETE /backup?name=``), then the operator deletes the EventServerBackup.
Failed scheduled ones beyond the same count are deleted too (they have no object).
On-demand backups are never pruned.

This module is pure (tested without a cluster); the steps that read and write
(``run``, ``tick``) are :mod:`eventfleet_operator.reconcilers.backup`.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eventfleet_operator import GROUP, VERSION, kube, naming
from eventfleet_operator.replicas import ReplicaStatus

PLURAL = "eventserverbackups"
KIND = "EventServerBackup"
RESOURCE = kube.EVENTSERVERBACKUPS

PENDING, RUNNING, COMPLETED, FAILED = "Pending", "Running", "Completed", "Failed"
DONE = frozenset({COMPLETED, FAILED})
# A fleet that never gets a ready, in-sync replica fails the backup after this many tries.
MAX_ATTEMPTS = 20
# POST /backup copies and uploads the whole store: minutes for a large one.
BACKUP_TIMEOUT = 1800.0

# -- the schedule (pure) ------------------------------------------------------------------

_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_MONTHS = "jan feb mar apr may jun jul aug sep oct nov dec".split()
_DAYS = "sun mon tue wed thu fri sat".split()
# How far back a missed slot is searched (a cron that matched during a long outage
# gives one backup now, not one per missed slot).
LOOKBACK = datetime.timedelta(days=8)


def every_seconds(schedule: str) -> float | None:
    """The interval of ``@every 6h30m`` in seconds; None for a cron schedule."""
    text = schedule.strip()
    if not text.startswith("@every "):
        return None
    total = 0.0
    for amount, unit in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", text[len("@every ") :]):
        total += int(amount) * _UNITS[unit]
    return total


def _num(text: str, names: Sequence[str]) -> int:
    """A cron field value: a number or a name (JAN=1 for months, SUN=0 for weekdays)."""
    if text in names:
        return names.index(text) + (1 if names is _MONTHS else 0)
    return int(text)


def _values(field: str, lo: int, hi: int, names: Sequence[str] = ()) -> set[int]:
    out: set[int] = set()
    for part in field.lower().split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if base in ("*", "?"):
            start, end = lo, hi
        else:
            first, _, last = base.partition("-")

            start = _num(first, names)
            end = _num(last, names) if last else (hi if step_text else start)
        out.update(range(start, end + 1, step))
    return out


def _compile(expr: str) -> Callable[[datetime.datetime], bool]:
    """A matcher of the 5-field cron `expr` (each field parsed once)."""
    minute, hour, dom, month, dow = expr.split()
    minutes, hours = _values(minute, 0, 59), _values(hour, 0, 23)
    doms, months = _values(dom, 1, 31), _values(month, 1, 12, _MONTHS)
    days = _values(dow, 0, 7, _DAYS)
    if 7 in days:
        days.add(0)
    # cron: when both day fields are restricted, either may match.
    either = dom not in ("*", "?") and dow not in ("*", "?")

    def matches(t: datetime.datetime) -> bool:
        by_dom, by_dow = t.day in doms, (t.isoweekday() % 7) in days
        return (
            t.minute in minutes
            and t.hour in hours
            and t.month in months
            and ((by_dom or by_dow) if either else (by_dom and by_dow))
        )

    return matches


def due_slot(
    schedule: str, since: datetime.datetime, now: datetime.datetime
) -> datetime.datetime | None:
    """The latest slot of `schedule` (UTC) in ``(since, now]``, None if there is none.

    ``@every D`` slots are ``since + k*D``; cron slots are whole minutes, searched at
    most `LOOKBACK` back.
    """
    interval = every_seconds(schedule)
    if interval is not None:
        if interval <= 0 or (now - since).total_seconds() < interval:
            return None
        steps = int((now - since).total_seconds() // interval)
        return since + datetime.timedelta(seconds=steps * interval)
    matches = _compile(_DESCRIPTORS.get(schedule.strip(), schedule.strip()))
    t = now.replace(second=0, microsecond=0)
    floor = max(since, now - LOOKBACK)
    while t > floor:
        if matches(t):
            return t
        t -= datetime.timedelta(minutes=1)
    return None


def scheduled_name(fleet: str, slot: datetime.datetime, schedule: str = "") -> str:
    """``<fleet>-<YYYYMMDDHHMM>``; with the seconds (``...HHMMSS``) for an ``@every``
    interval under a minute, whose slots share minutes: under the minute's name alone
    every slot after the first of a minute was the existing object (409, skipped), so
    ``@every 10s`` made one backup a minute."""
    interval = every_seconds(schedule)
    if interval is not None and interval < 60:
        return f"{fleet}-{slot:%Y%m%d%H%M%S}"
    return f"{fleet}-{slot:%Y%m%d%H%M}"


# -- objects (pure) -------------------------------------------------------------------------


def manifest(fleet: str, namespace: str, name: str, *, scheduled: bool) -> dict[str, Any]:
    """An EventServerBackup of `fleet` (no owner: it outlives the fleet, which is the
    point of a backup: its status holds what spec.bootstrap.fromBackup needs)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                **naming.labels(fleet, "backup"),
                naming.BACKUP_FLEET_LABEL: fleet,
                naming.BACKUP_SCHEDULED_LABEL: "true" if scheduled else "false",
            },
        },
        "spec": {"eventServer": fleet},
    }


def _created(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("creationTimestamp") or "")


def last_scheduled(backups: Sequence[Mapping[str, Any]]) -> datetime.datetime | None:
    times = [
        parse_time(_created(b))
        for b in backups
        if b["metadata"].get("labels", {}).get(naming.BACKUP_SCHEDULED_LABEL) == "true"
    ]
    return max((t for t in times if t is not None), default=None)


def to_prune(backups: Sequence[Mapping[str, Any]], retention: int) -> list[Mapping[str, Any]]:
    """Scheduled backups beyond `retention`, oldest first: completed ones beyond the
    newest `retention` completed, and failed ones beyond the newest `retention` failed."""
    out: list[Mapping[str, Any]] = []
    scheduled = [
        b
        for b in backups
        if b["metadata"].get("labels", {}).get(naming.BACKUP_SCHEDULED_LABEL) == "true"
    ]
    for phase in (COMPLETED, FAILED):
        done = sorted(
            (b for b in scheduled if (b.get("status") or {}).get("phase") == phase),
            key=lambda b: (_created(b), b["metadata"]["name"]),
        )
        out.extend(done[: max(len(done) - retention, 0)])
    return sorted(out, key=lambda b: (_created(b), b["metadata"]["name"]))


def pick_replica(statuses: Sequence[tuple[int, ReplicaStatus | None]]) -> tuple[int | None, str]:
    """The ordinal to back up from (highest ready replica in sync with every peer), or
    None and why none qualifies."""
    why = []
    for ordinal, status in sorted(statuses, key=lambda s: -s[0]):
        if status is None:
            why.append(f"{ordinal}: unreachable")
        elif not status.ready:
            why.append(f"{ordinal}: not ready")
        elif any(p.state != "synced" for p in status.peers):
            behind = ", ".join(f"{p.name}={p.state}" for p in status.peers if p.state != "synced")
            why.append(f"{ordinal}: peers not synced ({behind})")
        else:
            return ordinal, ""
    return None, "no ready replica in sync with every peer: " + "; ".join(why)


def completed_status(answer: Mapping[str, Any], replica: str, attempts: int) -> dict[str, Any]:
    """The status of a backup from the replica's ``POST /backup`` answer."""
    return {
        "phase": COMPLETED,
        "replica": replica,
        "bucket": answer.get("bucket"),
        "objectKey": answer.get("key"),
        "digest": {
            "sha256": answer.get("sha256"),
            "size": answer.get("size"),
            "events": answer.get("events"),
            "eventsSha256": answer.get("events_sha256"),
            "lastIds": {
                k: int(v.get("instance", 0)) for k, v in (answer.get("last_ids") or {}).items()
            },
        },
        "startedAt": _rfc3339(answer.get("started")),
        "finishedAt": _rfc3339(answer.get("finished")),
        "attempts": attempts,
        "error": None,
    }


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _rfc3339(text: Any) -> str | None:
    t = parse_time(text) if isinstance(text, str) else None
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t else None


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
