"""A small async Kubernetes API client for the children the operator manages.

Kopf watches the ``EventServer`` resources with its own client; the children are
written here with server-side apply (one field manager, ``force=true``), so a
hand-edited field that the operator owns is taken back and a field the operator no
longer sets is removed, with no read-modify-write races. Credentials come from the
in-cluster service account or ``KUBECONFIG`` through the ``kubernetes`` package's
loaders (which also refresh rotating in-cluster tokens).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import aiohttp

from eventfleet_operator import __version__, naming

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Resource:
    """A resource type: where its objects live in the REST API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{urllib.parse.quote(namespace, safe='')}")
        parts.append(self.plural)
        if name:
            parts.append(urllib.parse.quote(name, safe=""))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


EVENTSERVERS = Resource("eventfleet.io", "v1", "eventservers", "EventServer")
EVENTSERVERBACKUPS = Resource("eventfleet.io", "v1", "eventserverbackups", "EventServerBackup")
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet")
SERVICES = Resource("", "v1", "services", "Service")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
PODS = Resource("", "v1", "pods", "Pod")
PVCS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
NETWORKPOLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
STORAGECLASSES = Resource(
    "storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False
)
SERVICEMONITORS = Resource("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor")
SPARKAPPS = Resource(
    "sparkoperator.k8s.io", "v1beta2", "scheduledsparkapplications", "ScheduledSparkApplication"
)
CERTIFICATES = Resource("cert-manager.io", "v1", "certificates", "Certificate")
ISSUERS = Resource("cert-manager.io", "v1", "issuers", "Issuer")

BY_KIND = {
    r.kind: r
    for r in (
        EVENTSERVERS,
        EVENTSERVERBACKUPS,
        STATEFULSETS,
        SERVICES,
        CONFIGMAPS,
        SECRETS,
        PODS,
        PVCS,
        PDBS,
        NETWORKPOLICIES,
        SERVICEMONITORS,
        SPARKAPPS,
        CERTIFICATES,
        ISSUERS,
    )
}


def resource_of(manifest: Mapping[str, Any]) -> Resource:
    kind = manifest.get("kind", "")
    if kind not in BY_KIND:
        raise ValueError(f"kind {kind!r} is not one the operator manages")
    return BY_KIND[kind]


class ApiError(Exception):
    """A non-2xx answer from the API server, with its ``Status`` reason and message."""

    def __init__(
        self, status: int, reason: str, message: str, *, method: str = "", path: str = ""
    ) -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """A refusal the API server lifts by itself within seconds: throttling, an
        unavailable or timed-out server, or a kind it cannot map yet — the 403 of
        OwnerReferencesPermissionEnforcement for an owner whose CRD is seconds old
        ("cannot find RESTMapping ... no matches for kind"), seen on the first pass after
        installing the chart on a real cluster."""
        if self.status in (429, 500, 502, 503, 504):
            return True
        return self.status == 403 and "cannot find RESTMapping" in self.message


@dataclasses.dataclass
class Credentials:
    server: str
    ssl: ssl.SSLContext | bool
    headers: dict[str, str]
    token_getter: Any = None  # returns "Bearer ..." on each call (refreshing tokens)


def load_credentials() -> Credentials:
    """In-cluster service account if present, else ``KUBECONFIG`` / ``~/.kube/config``."""
    import kubernetes  # heavy import; only when the operator really starts

    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
        source = "in-cluster service account"
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=cfg)
        source = "kubeconfig"
    context: ssl.SSLContext | bool = False
    if cfg.host.startswith("https"):
        if not cfg.verify_ssl:
            context = False
        else:
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)
    logger.info("Kubernetes API at %s (credentials: %s)", cfg.host, source)

    def token() -> str | None:
        # get_api_key_with_prefix calls the refresh hook of rotating in-cluster tokens.
        return cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix(
            "BearerToken"
        )

    return Credentials(server=cfg.host.rstrip("/"), ssl=context, headers={}, token_getter=token)


class KubeClient:
    """Async JSON client; create inside the running loop, ``await close()`` at the end."""

    def __init__(
        self, credentials: Credentials, *, timeout: float = 30.0, discovery_ttl: float = 60.0
    ) -> None:
        self._creds = credentials
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout),
            headers={"User-Agent": f"eventfleet-operator/{__version__}"},
        )
        self._discovery: dict[str, tuple[float, set[str]]] = {}
        self.discovery_ttl = discovery_ttl

    async def close(self) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json", **self._creds.headers}
        if self._creds.token_getter is not None:
            token = self._creds.token_getter()
            if token:
                headers["Authorization"] = token
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        async with self._session.request(
            method,
            self._creds.server + path,
            params=params,
            data=data,
            headers=headers,
            ssl=self._creds.ssl,
        ) as response:
            text = await response.text()
            if response.status >= 400:
                reason, message = response.reason or "", text[:500]
                try:
                    status = json.loads(text)
                    reason, message = status.get("reason", reason), status.get("message", message)
                except ValueError:
                    pass
                raise ApiError(response.status, reason, message, method=method, path=path)
            return json.loads(text) if text else None

    async def get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """The object, or ``None`` if it does not exist."""
        try:
            return await self.request("GET", resource.path(namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self, resource: Resource, namespace: str | None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self.request("GET", resource.path(namespace), params=params)
        return list(result.get("items") or [])

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        resource = resource_of(manifest)
        return await self.request(
            "POST", resource.path(manifest["metadata"].get("namespace")), body=manifest
        )

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply as the operator's field manager, taking fields back if needed."""
        resource = resource_of(manifest)
        meta = manifest["metadata"]
        return await self.request(
            "PATCH",
            resource.path(meta.get("namespace"), meta["name"]),
            params={"fieldManager": naming.FIELD_MANAGER, "force": "true"},
            body=manifest,
            content_type="application/apply-patch+yaml",  # JSON is valid YAML
        )

    async def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        return await self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        propagation: str = "Background",
    ) -> bool:
        """Delete (background propagation); ``False`` if it was already gone.

        With ``uid``, only that very object (a precondition): an object recreated by
        someone else under the same name in the meantime is left alone (409).
        ``propagation="Orphan"`` leaves the dependents (a StatefulSet's pods) running.
        """
        options: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": propagation,
        }
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", resource.path(namespace, name), body=options)
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    async def has_resource(self, resource: Resource, *, ttl: float | None = None) -> bool:
        """Is this (optional) resource type served? Cached for ``ttl`` seconds.

        Discovery needs no RBAC beyond the default ``system:discovery`` role, and the
        short cache notices a CRD installed after the operator started.
        """
        key = resource.api_version
        cached = self._discovery.get(key)
        now = time.monotonic()
        if cached is None or now - cached[0] > (self.discovery_ttl if ttl is None else ttl):
            path = (
                f"/apis/{resource.group}/{resource.version}"
                if resource.group
                else f"/api/{resource.version}"
            )
            try:
                found = await self.request("GET", path)
                names = {r.get("name", "") for r in found.get("resources") or []}
            except ApiError as e:
                if e.status not in (404, 503):
                    raise
                names = set()
            cached = (now, names)
            self._discovery[key] = cached
        return resource.plural in cached[1]
