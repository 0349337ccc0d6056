"""Volume growth: ``spec.storage.size`` may grow, never shrink (pure decisions).

A StatefulSet's volume claim template cannot change, but its claims can grow when their
StorageClass has ``allowVolumeExpansion: true``. The operator:

1. checks the StorageClass (the spec's, the claims', or the cluster default);
2. raises ``spec.resources.requests.storage`` of every claim ``data-NAME-N``;
3. follows each claim until ``status.capacity.storage`` reaches the new size (the
   ``FileSystemResizePending`` condition means the node still has to grow the file
   system, which happens while the pod runs or when it restarts);
4. once every claim has been expanded by the storage controller, deletes the
   StatefulSet with ``propagationPolicy: Orphan`` (the pods keep running) and creates it
   again at once with the new template, so that new replicas get the new size.
"""

from __future__ import annotations

import dataclasses
import decimal
import re
from collections.abc import Mapping, Sequence
from typing import Any

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE]|m)?$")
_FACTORS = {
    None: 1,
    "m": decimal.Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
FS_RESIZE_PENDING = "FileSystemResizePending"


def quantity(text: str | int | None) -> decimal.Decimal | None:
    """A Kubernetes quantity (``1Gi``, ``500M``, ``2``) as a number, or None."""
    if text is None:
        return None
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a quantity such as 10Gi")
    return decimal.Decimal(match.group(1)) * _FACTORS[match.group(2)]


def template_size(statefulset: Mapping[str, Any] | None) -> str | None:
    """The ``data`` claim template's storage request of a StatefulSet."""
    for claim in ((statefulset or {}).get("spec") or {}).get("volumeClaimTemplates") or []:
        if (claim.get("metadata") or {}).get("name") == "data":
            return (
                ((claim.get("spec") or {}).get("resources") or {})
                .get("requests", {})
                .get("storage")
            )
    return None


def only_size_differs(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Do the two StatefulSets' claim templates differ in the storage size only?"""

    def essence(sts: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return [
            ((c.get("metadata") or {}).get("name"), (c.get("spec") or {}).get("storageClassName"))
            for c in (sts.get("spec") or {}).get("volumeClaimTemplates") or []
        ]

    return essence(desired) == essence(live)


@dataclasses.dataclass(frozen=True)
class Claim:
    name: str
    requested: decimal.Decimal | None
    capacity: decimal.Decimal | None
    fs_pending: bool = False
    storage_class: str | None = None

    @classmethod
    def of(cls, pvc: Mapping[str, Any]) -> Claim:
        spec, status = pvc.get("spec") or {}, pvc.get("status") or {}
        conditions = {c.get("type") for c in status.get("conditions") or []}
        return cls(
            name=pvc["metadata"]["name"],
            requested=quantity(
                ((spec.get("resources") or {}).get("requests") or {}).get("storage")
            ),
            capacity=quantity((status.get("capacity") or {}).get("storage")),
            fs_pending=FS_RESIZE_PENDING in conditions,
            storage_class=spec.get("storageClassName"),
        )


@dataclasses.dataclass(frozen=True)
class Step:
    """What to do in this pass of a resize, and how far it is."""

    patch: tuple[str, ...] = ()  # claims whose request must be raised now
    expanding: tuple[str, ...] = ()  # requested, capacity not there yet
    fs_pending: tuple[str, ...] = ()  # expanded; the node grows the file system
    recreate: bool = False  # every claim expanded: recreate the StatefulSet (orphan)

    @property
    def done(self) -> bool:
        return not (self.patch or self.expanding or self.fs_pending)


def plan(want: decimal.Decimal, claims: Sequence[Claim], template_grown: bool) -> Step:
    """The next step for ``claims`` to reach ``want`` bytes."""
    patch = tuple(c.name for c in claims if c.requested is None or c.requested < want)
    expanding = tuple(
        c.name
        for c in claims
        if c.name not in patch and (c.capacity is None or c.capacity < want) and not c.fs_pending
    )
    pending = tuple(c.name for c in claims if c.name not in patch and c.fs_pending)
    recreate = not template_grown and not patch and not expanding
    return Step(patch=patch, expanding=expanding, fs_pending=pending, recreate=recreate)


def expandable(storage_class: Mapping[str, Any] | None) -> bool:
    return bool((storage_class or {}).get("allowVolumeExpansion"))


def default_class(classes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for sc in classes:
        notes = (sc.get("metadata") or {}).get("annotations") or {}
        if notes.get(DEFAULT_CLASS_ANNOTATION) == "true":
            return sc
    return None
