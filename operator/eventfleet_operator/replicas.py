"""The replicas' HTTP contract, as the operator uses it: ``/status`` and ``/flush``.

Where a replica answers is pluggable. In a cluster the default template reaches each
pod through the headless peer Service; an operator running outside the cluster, or a
test, points it elsewhere with a URL template or a file mapping pods to URLs.

``/status`` (version 1)::

    {"version": 1, "server_id": 2, "status": "operational", "ready": true,
     "last_ids": {"1": {"server": 1, "session": 7, "instance": 42}, ...},
     "peers": [{"name": "demo-0", "server_id": 1, "state": "synced",
                "last_event_id": {...} | null, "lag_events": 0, "lag_seconds": 0.0}],
     "storage": {"events": 1234, "db_bytes": 65536}}

``POST /flush?peer=NAME`` answers 200 ``{"flushed": true, "last_ids": {...}}`` once the
peer confirmed that everything this replica holds is committed there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import yaml

from eventfleet_operator import naming

DEFAULT_URL_TEMPLATE = "http://{pod}.{service}.{namespace}.svc:{port}"
SUPPORTED_STATUS_VERSION = 1


class ReplicaUnreachable(Exception):
    """The replica did not answer, or answered something outside the contract."""


@dataclasses.dataclass(frozen=True, order=True)
class EventId:
    server: int
    session: int
    instance: int

    @classmethod
    def parse(cls, value: Any) -> EventId | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ValueError(f"an event id must be an object, got {value!r}")
        return cls(int(value["server"]), int(value["session"]), int(value["instance"]))

    def covers(self, other: EventId | None) -> bool:
        """Does holding up to ``self`` mean holding ``other`` too (same server id)?"""
        # For one server id, instance strictly increases and session never decreases.
        return other is None or (self.session, self.instance) >= (other.session, other.instance)

    def as_dict(self) -> dict[str, int]:
        return {"server": self.server, "session": self.session, "instance": self.instance}


@dataclasses.dataclass(frozen=True)
class PeerLink:
    name: str
    server_id: int
    state: str
    last_event_id: EventId | None
    lag_events: int
    lag_seconds: float


@dataclasses.dataclass(frozen=True)
class ReplicaStatus:
    server_id: int
    status: str
    ready: bool
    last_ids: Mapping[int, EventId]
    peers: tuple[PeerLink, ...]
    events: int | None
    db_bytes: int | None
    # Fingerprints of the tokens the replica has loaded ({"client": [...], "peer": [...]});
    # None from an image that does not report them (or an anonymous /status).
    credentials: Mapping[str, Any] | None = None
    # The store's schema version (storage.schema_version); None from older images.
    schema_version: int | None = None
    # The Event BUS CURVE public key the replica serves to new connections
    # (protocols.bus.curve.public_key); None without CURVE or from an older image.
    bus_curve_key: str | None = None

    @classmethod
    def parse(cls, data: Any) -> ReplicaStatus:
        """Parse a ``/status`` v1 document; raises ``ValueError`` naming the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError("status: expected a JSON object")
        version = data.get("version")
        if version != SUPPORTED_STATUS_VERSION:
            raise ValueError(
                f"status.version: expected {SUPPORTED_STATUS_VERSION}, got {version!r}"
            )
        try:
            last_ids = {int(k): EventId.parse(v) for k, v in (data.get("last_ids") or {}).items()}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"status.last_ids: {e}") from e
        peers = []
        for i, peer in enumerate(data.get("peers") or []):
            try:
                peers.append(
                    PeerLink(
                        name=str(peer["name"]),
                        server_id=int(peer["server_id"]),
                        state=str(peer.get("state") or "unknown"),
                        last_event_id=EventId.parse(peer.get("last_event_id")),
                        lag_events=int(peer.get("lag_events") or 0),
                        lag_seconds=float(peer.get("lag_seconds") or 0.0),
                    )
                )
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"status.peers[{i}]: {e}") from e
        storage = data.get("storage") or {}
        curve = ((data.get("protocols") or {}).get("bus") or {}).get("curve")
        curve_key = curve.get("public_key") if isinstance(curve, Mapping) else None
        return cls(
            server_id=int(data.get("server_id") or 0),
            status=str(data.get("status") or "unknown"),
            ready=bool(data.get("ready")),
            last_ids={k: v for k, v in last_ids.items() if v is not None},
            peers=tuple(peers),
            events=storage.get("events"),
            db_bytes=storage.get("db_bytes"),
            schema_version=storage.get("schema_version")
            if isinstance(storage.get("schema_version"), int)
            else None,
            credentials=data.get("credentials")
            if isinstance(data.get("credentials"), Mapping)
            else None,
            bus_curve_key=curve_key if isinstance(curve_key, str) else None,
        )

    def own_last_id(self) -> EventId | None:
        return self.last_ids.get(self.server_id)


class Endpoints:
    """Where replica ``ordinal`` of fleet ``namespace/name`` answers HTTP.

    ``urls_file`` (JSON or YAML ``{"<namespace>/<pod>": "http://host:port"}``) wins and
    is re-read when it changes; otherwise ``template`` is formatted with ``pod``,
    ``service`` (the headless peer Service), ``namespace``, ``name``, ``ordinal``,
    ``server_id`` and ``port`` (the replicas' HTTP port).

    A fleet with HTTPS (``spec.tls``) is registered with :meth:`trust`: its URLs become
    ``https`` and :meth:`tls_for` gives the context verifying its CA and the name its
    certificate carries for that pod (the pod's peer DNS name, also when the URL is a
    mapped address).
    """

    def __init__(self, template: str = DEFAULT_URL_TEMPLATE, urls_file: str | None = None) -> None:
        self.template = template
        self.urls_file = urls_file
        self._cache: tuple[float, dict[str, str]] | None = None
        # fleet -> (CA PEM, context); a context of None: HTTPS but no CA known yet.
        self._trust: dict[tuple[str, str], tuple[str | None, ssl.SSLContext | None]] = {}
        self._issued: dict[str, tuple[ssl.SSLContext, str] | None] = {}  # https URL -> TLS

    def trust(self, namespace: str, name: str, ca_pem: str | None, *, https: bool) -> None:
        """How to call the replicas of ``namespace/name``: plain HTTP, or HTTPS verifying
        ``ca_pem``. HTTPS without a CA yet refuses every call (a token is never sent to
        a TLS port in clear text). Contexts are kept while the CA stays the same."""
        key = (namespace, name)
        if not https:
            self._trust.pop(key, None)
            return
        known = self._trust.get(key)
        if known is not None and known[0] == ca_pem:
            return
        context = None
        if ca_pem:
            context = ssl.create_default_context(cadata=ca_pem)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._trust[key] = (ca_pem, context)

    def tls_for(self, url: str) -> tuple[ssl.SSLContext, str] | None:
        """The (context, server name) of an https URL this object handed out."""
        parts = urllib.parse.urlsplit(url)
        return self._issued.get(f"{parts.scheme}://{parts.netloc}")

    def _mapping(self) -> dict[str, str]:
        if not self.urls_file:
            return {}
        try:
            mtime = os.stat(self.urls_file).st_mtime
        except FileNotFoundError:
            return {}
        if self._cache is None or self._cache[0] != mtime:
            with open(self.urls_file) as f:
                data = yaml.safe_load(f) or {}
            if not isinstance(data, dict):
                raise ValueError(
                    f"{self.urls_file}: expected a mapping of '<namespace>/<pod>' to URLs"
                )
            self._cache = (mtime, {str(k): str(v) for k, v in data.items()})
        return self._cache[1]

    def url(self, namespace: str, name: str, ordinal: int, port: int) -> str:
        url = self._plain_url(namespace, name, ordinal, port)
        trusted = self._trust.get((namespace, name))
        if trusted is None:
            return url
        url = "https://" + url.split("://", 1)[1] if "://" in url else f"https://{url}"
        context = trusted[1]
        self._issued[url] = (
            (context, naming.peer_host(name, namespace, ordinal)) if context else None
        )
        return url

    def _plain_url(self, namespace: str, name: str, ordinal: int, port: int) -> str:
        pod = naming.pod(name, ordinal)
        mapped = self._mapping().get(f"{namespace}/{pod}")
        if mapped:
            return mapped.rstrip("/")
        return self.template.format(
            pod=pod,
            service=naming.peer_service(name),
            namespace=namespace,
            name=name,
            ordinal=ordinal,
            server_id=naming.server_id(ordinal),
            port=port,
        ).rstrip("/")


class ReplicaClient:
    """HTTP calls to replicas with bounded timeouts; create inside the running loop."""

    def __init__(
        self,
        *,
        status_timeout: float = 3.0,
        flush_timeout: float = 15.0,
        tls_for: Callable[[str], tuple[ssl.SSLContext, str] | None] | None = None,
    ) -> None:
        self._session = aiohttp.ClientSession()
        self.status_timeout = status_timeout
        self.flush_timeout = flush_timeout
        # https URLs: the fleet's CA and the name to verify (Endpoints.tls_for).
        self._tls_for = tls_for or (lambda url: None)

    async def close(self) -> None:
        await self._session.close()

    async def _call(
        self,
        method: str,
        url: str,
        timeout: float,
        params: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> Any:
        # The replicas' admin routes (POST /flush) and the full /status need the fleet's
        # peer credential (docs/security.md); the operator holds the fleet's token.
        headers = {"Authorization": f"Bearer {token}"} if token else None
        tls: dict[str, Any] = {}
        if url.startswith("https://"):
            trusted = self._tls_for(url)
            if trusted is None:
                # Never fall back to the system trust store for a fleet's own CA.
                raise ReplicaUnreachable(f"{method} {url}: no CA known for this replica")
            tls = {"ssl": trusted[0], "server_hostname": trusted[1]}
        try:
            async with self._session.request(
                method,
                url,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
                **tls,
            ) as response:
                text = await response.text()
                if response.status != 200:
                    raise ReplicaUnreachable(
                        f"{method} {url}: HTTP {response.status}: {text[:200]}"
                    )
                return json.loads(text)
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise ReplicaUnreachable(f"{method} {url}: {type(e).__name__}: {e}") from e
        except ValueError as e:
            raise ReplicaUnreachable(f"{method} {url}: not JSON: {e}") from e

    async def status(self, base_url: str, token: str | None = None) -> ReplicaStatus:
        data = await self._call("GET", f"{base_url}/status", self.status_timeout, token=token)
        try:
            return ReplicaStatus.parse(data)
        except ValueError as e:
            raise ReplicaUnreachable(f"GET {base_url}/status: {e}") from e

    async def flush(self, base_url: str, peer: str, token: str | None = None) -> Mapping[str, Any]:
        """Ask the replica to flush to ``peer``; raises unless the peer confirmed."""
        data = await self._call(
            "POST", f"{base_url}/flush", self.flush_timeout, params={"peer": peer}, token=token
        )
        if not isinstance(data, Mapping) or data.get("flushed") is not True:
            raise ReplicaUnreachable(f"POST {base_url}/flush?peer={peer}: not flushed: {data!r}")
        return data

    async def backup(
        self, base_url: str, name: str, token: str | None, *, timeout: float
    ) -> Mapping[str, Any]:
        """``POST /backup?name=``: the replica copies its store to its S3 target."""
        data = await self._call("POST", f"{base_url}/backup", timeout, {"name": name}, token)
        if not isinstance(data, Mapping) or data.get("backed_up") is not True:
            raise ReplicaUnreachable(f"POST {base_url}/backup?name={name}: {data!r}")
        return data

    async def delete_backup(self, base_url: str, name: str, token: str | None) -> None:
        """``DELETE /backup?name=``: the replica deletes that copy from its S3 target."""
        await self._call("DELETE", f"{base_url}/backup", 60.0, {"name": name}, token)
