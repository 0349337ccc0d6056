"""Observe: what the replicas and their pods say, read after the pass's writes.

The replicas' ``/status`` (with the peer token), the pods by ordinal, and the storage
schema versions they run (``schema``: a pod that refuses a store of a newer schema).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from eventfleet_operator import kube, model, naming
from eventfleet_operator import schema as schema_mod
from eventfleet_operator import status as status_mod
from eventfleet_operator.reconcilers.children import Context
from eventfleet_operator.replicas import ReplicaUnreachable


async def pods(ctx: Context, spec: model.FleetSpec) -> dict[int, dict[str, Any]]:
    """The fleet's replica pods by ordinal."""
    pods = await ctx.kube.list(
        kube.PODS, spec.namespace, label_selector=naming.selector_string(spec.name)
    )
    out = {}
    for pod in pods:
        suffix = pod["metadata"]["name"].rsplit("-", 1)[-1]
        if pod["metadata"]["name"] == naming.pod(
            spec.name, int(suffix) if suffix.isdigit() else -1
        ):
            out[int(suffix)] = pod
    return out


async def replicas(
    ctx: Context, spec: model.FleetSpec, count: int, token: str | None = None
) -> list[status_mod.PeerReport]:
    """Each of the first ``count`` replicas' ``/status`` (or why it did not answer)."""

    async def one(ordinal: int) -> status_mod.PeerReport:
        url = ctx.endpoints.url(spec.namespace, spec.name, ordinal, spec.ports.http)
        report = status_mod.PeerReport(
            ordinal, naming.pod(spec.name, ordinal), naming.server_id(ordinal)
        )
        try:
            return dataclasses.replace(report, status=await ctx.replicas.status(url, token))
        except ReplicaUnreachable as e:
            return dataclasses.replace(report, error=str(e))

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def schema(
    spec: model.FleetSpec,
    previous: Mapping[str, Any],
    peers: Sequence[status_mod.PeerReport],
    pods: Mapping[int, Mapping[str, Any]],
) -> tuple[int | None, str]:
    """The highest storage schema version seen, and a pod that refuses it (or "")."""
    schema_version = schema_mod.highest(
        previous.get("storageSchemaVersion"),
        (p.status.schema_version for p in peers if p.status is not None),
    )
    schema_error = schema_mod.problem(
        ((naming.pod(spec.name, o), pod) for o, pod in sorted(pods.items())), schema_version
    )
    return schema_version, schema_error
