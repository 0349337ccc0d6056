"""Run reconciliation passes against the in-memory API (``FakeKube``) and scripted replicas."""

from __future__ import annotations

import base64
import copy
import logging
from typing import Any

from eventfleet_operator import reconcile, tokens
from eventfleet_operator.config import OperatorConfig
from op_fakes import FakeEndpoints, FakeReplicas, status_doc
from op_kube import FakeKube

LOG = logging.getLogger("test.operator")


class Harness:
    """One EventServer in namespace ``ns`` and what each pass did (status, Events)."""

    def __init__(self, spec: dict[str, Any] | None = None, name: str = "demo") -> None:
        self.kube = FakeKube()
        self.replicas = FakeReplicas()
        self.ctx = reconcile.Context(
            config=OperatorConfig(namespaces=("ns",)),
            kube=self.kube,  # type: ignore[arg-type]
            replicas=self.replicas,  # type: ignore[arg-type]
            endpoints=FakeEndpoints(),  # type: ignore[arg-type]
        )
        self.body = self.kube.put(
            {
                "apiVersion": "eventfleet.io/v1",
                "kind": "EventServer",
                "metadata": {"name": name, "namespace": "ns", "annotations": {}},
                "spec": copy.deepcopy(spec or {}),
            }
        )
        self.name = name
        self.events: list[tuple[str, str, str]] = []

    @property
    def uid(self) -> str:
        return self.body["metadata"]["uid"]

    def emit(self, type_: Any, reason: Any, message: str) -> None:
        self.events.append((str(type_), str(reason), message))

    def set_spec(self, spec: dict[str, Any]) -> None:
        self.body["spec"] = copy.deepcopy(spec)
        self.body["metadata"]["generation"] = self.body["metadata"].get("generation", 1) + 1

    def annotate(self, **annotations: str | None) -> None:
        notes = self.body["metadata"].setdefault("annotations", {})
        for k, v in annotations.items():
            key = k if "/" in k else f"eventfleet.io/{k.replace('_', '-')}"
            if v is None:
                notes.pop(key, None)
            else:
                notes[key] = v

    async def run(self) -> dict[str, Any]:
        status = await reconcile.reconcile(self.ctx, copy.deepcopy(self.body), LOG, self.emit)
        self.body["status"] = status
        return status

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.body["status"]["conditions"] if c["type"] == type_)

    def sts(self) -> dict[str, Any]:
        found = self.kube.obj("StatefulSet", self.name)
        assert found is not None
        return found

    def secret_tokens(self, name: str) -> tuple[str, ...]:
        """The tokens a token Secret of the fake API holds now."""
        data = self.kube.obj("Secret", name)["data"]["token"]
        return tokens.parse(base64.b64decode(data).decode())

    def replicas_load(self, count: int) -> None:
        """The fake replicas report the tokens the Secrets hold now (their reload)."""
        client = self.secret_tokens(f"{self.name}-token")
        peer = self.secret_tokens(f"{self.name}-peer-token")
        for i in range(count):
            doc = status_doc(i + 1, {j + 1: (1, 0) for j in range(count)})
            doc["credentials"] = {
                "client": [tokens.fingerprint(t) for t in client],
                "peer": [tokens.fingerprint(t) for t in peer],
            }
            self.replicas.docs[i] = doc
