"""Deletion: every child of a deleted ``EventServer`` removed explicitly (garbage
collection may not run, or not yet), only what this EventServer owns, and its volume
claims only with ``spec.storage.retentionPolicy.whenDeleted: Delete``.

It works from the raw body, not the parsed spec: a fleet with a spec that no longer
parses must still go away cleanly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import crd, kube, metrics, naming
from eventfleet_operator.constants import Operation
from eventfleet_operator.reconcilers.children import Context, delete_owned


async def cleanup(ctx: Context, body: Mapping[str, Any], log: logging.Logger) -> list[str]:
    """Delete every child explicitly: garbage collection may not run (or not yet)."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    # The CRD's defaults, without the parser's checks (a spec that fails them still goes).
    spec = crd.with_defaults(body.get("spec") or {})
    when_deleted = ((spec.get("storage") or {}).get("retentionPolicy") or {}).get("whenDeleted")
    token_ref = ((spec.get("token") or {}).get("secretRef") or {}).get("name")
    peer_token_ref = ((spec.get("peerToken") or {}).get("secretRef") or {}).get("name")
    uid = meta.get("uid", "")
    deleted: list[str] = []
    async with ctx.lock(namespace, name):
        targets: list[tuple[kube.Resource, str]] = [
            (kube.STATEFULSETS, naming.statefulset(name)),
            (kube.SERVICES, naming.client_service(name)),
            (kube.SERVICES, naming.peer_service(name)),
            (kube.CONFIGMAPS, naming.configmap(name)),
            (kube.PDBS, naming.pdb(name)),
            (kube.NETWORKPOLICIES, naming.network_policy(name)),
        ]
        if not token_ref:  # never delete a Secret the user owns
            targets.append((kube.SECRETS, naming.token_secret(name)))
        if not peer_token_ref:
            targets.append((kube.SECRETS, naming.peer_token_secret(name)))
        targets.append((kube.SECRETS, naming.bus_curve_secret(name)))  # ours only
        for optional, child in (
            (kube.SERVICEMONITORS, naming.service_monitor(name)),
            (kube.SPARKAPPS, naming.spark_app(name)),
        ):
            if await ctx.kube.has_resource(optional, ttl=0):
                targets.append((optional, child))
        for resource, child in targets:
            # Only what this EventServer owns: a same-named object of someone else stays.
            if await delete_owned(ctx, resource, namespace, child, uid, log):
                deleted.append(f"{resource.kind}/{child}")
                metrics.CHILD_WRITES.labels(resource.kind, Operation.DELETED).inc()
        if when_deleted == "Delete":
            claims = await ctx.kube.list(
                kube.PVCS, namespace, label_selector=naming.selector_string(name)
            )
            for claim in claims:
                claim_name = claim["metadata"]["name"]
                # Claims belong to the StatefulSet's template (data-NAME-N), not to the
                # EventServer: the name and the labels are what marks them as the fleet's.
                if naming.claim_ordinal(name, claim_name) is None:
                    continue
                if await ctx.kube.delete(
                    kube.PVCS, namespace, claim_name, uid=claim["metadata"].get("uid")
                ):
                    deleted.append(f"PersistentVolumeClaim/{claim_name}")
    ctx.locks.pop((namespace, name), None)
    log.info("deleted children: %s", ", ".join(deleted) or "none left")
    return deleted
