"""A Kubernetes API *emulator* for tests: kmock 0.8's ``KubernetesEmulator``, fixed.

This is not a cluster. There are no controllers (no pods ever run, no garbage
collection, no scheduler), no authentication and no admission. It is an in-memory
object store that speaks enough of the real API that the real ``kubectl``, ``helm``
and ``kopf`` work against it. kmock keeps providing the HTTP server, the request log
and its reaction DSL (reactions registered on the emulator, e.g. ``emulator['get
/api/v1/pods'] << 500``, still take precedence, for fault injection); the Kubernetes
semantics are replaced where kmock 0.8 trips these clients:

* discovery: core ``groupVersion`` is ``v1`` (kmock: ``/v1``); CRDs become discoverable
  when created and vanish when deleted; ``/status`` and ``/scale`` subresources are
  listed (``scale`` as ``autoscaling/v1`` ``Scale``); ``/version`` says 1.33;
* objects get ``uid``, ``resourceVersion`` (one global counter, like etcd revisions),
  ``creationTimestamp`` and ``generation`` (bumped on spec changes only);
* lists carry ``kind``/``apiVersion`` and the list resourceVersion; ``labelSelector``
  and ``fieldSelector`` work; ``/api/v1/namespaces[/NAME]`` paths parse;
* watches are ``application/json`` streams, honour ``?resourceVersion`` (replay from an
  event log, 410 Gone when too old) and ``timeoutSeconds``;
* POST, PUT (with optimistic concurrency), PATCH (merge, strategic, JSON patch with
  ``test``, server-side apply), DELETE (finalizers -> ``deletionTimestamp``), delete
  collection, ``dryRun``;
* status subresource (writes to the main resource ignore ``status`` and vice versa),
  scale subresource answering ``autoscaling/v1 Scale`` (so ``kubectl scale`` succeeds);
* CRD structural defaults are applied to custom resources, and their OpenAPI schema is
  enforced (422 Invalid), as the real API server does; CEL rules are not evaluated;
* protobuf request bodies (kubectl and helm send them for built-in kinds) are decoded;
  answers are always JSON, which clients accept;
* server-side printing (``as=Table``) for ``kubectl get``, including CRD printer columns.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import copy
import dataclasses
import datetime
import json
import random
import re
import string
import uuid
from collections.abc import Iterable
from typing import Any

import aiohttp.web
import kmock
import yaml
from kmock._internal import rendering

from . import patching, protobuf, schema

KUBE_VERSION = (1, 33, 0)
LOG_LIMIT = 100_000


class ApiError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}


def status_body(
    code: int, reason: str, message: str, details: dict | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class Kind:
    """One served resource type (built-in from kmock's bundled list, or from a CRD)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: list[str] = dataclasses.field(default_factory=list)
    categories: list[str] = dataclasses.field(default_factory=list)
    verbs: list[str] = dataclasses.field(
        default_factory=lambda: [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    )
    subresources: set[str] = dataclasses.field(default_factory=set)
    scale: dict[str, str] | None = None
    openapi: dict[str, Any] | None = None
    printer_columns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    crd: str | None = None  # the defining CRD's name

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


BUILTIN_SCALE = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}


@dataclasses.dataclass
class Route:
    group: str | None = None
    version: str | None = None
    namespace: str | None = None
    plural: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> Route:
    """``/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]`` and ``/apis/G/V/...`` (also namespaces)."""
    parts = [p for p in path.split("/") if p]
    route = Route()
    if parts[:1] == ["api"] and len(parts) >= 2:
        route.group, route.version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        route.group, route.version, rest = parts[1], parts[2], parts[3:]
    elif parts[:1] == ["apis"] and len(parts) == 2:
        route.group = parts[1]
        return route
    else:
        return route
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        route.namespace, rest = rest[1], rest[2:]
    if rest:
        route.plural = rest[0]
    if len(rest) >= 2:
        route.name = rest[1]
    if len(rest) >= 3:
        route.subresource = "/".join(rest[2:])
    return route


def parse_label_selector(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """``a=b,c!=d,e,!f,g in (x,y),h notin (z)`` -> (key, op, values)."""
    terms: list[tuple[str, str, tuple[str, ...]]] = []
    for raw in re.findall(r"(?:[^,(]|\([^)]*\))+", text or ""):
        term = raw.strip()
        if not term:
            continue
        m = re.match(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$", term)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            terms.append((m.group(1), m.group(2), values))
        elif "!=" in term:
            k, v = term.split("!=", 1)
            terms.append((k.strip(), "!=", (v.strip(),)))
        elif "==" in term or "=" in term:
            k, v = re.split(r"==?", term, maxsplit=1)
            terms.append((k.strip(), "=", (v.strip(),)))
        elif term.startswith("!"):
            terms.append((term[1:].strip(), "!", ()))
        else:
            terms.append((term, "exists", ()))
    return terms


def labels_match(labels: dict[str, str], terms: Iterable[tuple[str, str, tuple[str, ...]]]) -> bool:
    for key, op, values in terms:
        value = labels.get(key)
        ok = {
            "=": value == values[0] if values else False,
            "!=": value != (values[0] if values else None),
            "in": value in values,
            "notin": value not in values,
            "exists": key in labels,
            "!": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def field_value(obj: dict[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def fields_match(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        negate = "!=" in term
        key, value = re.split(r"!=|==|=", term, maxsplit=1)
        actual = field_value(obj, key.strip())
        actual = "" if actual is None else str(actual)
        if (actual == value.strip()) == negate:
            return False
    return True


def age(timestamp: str | None) -> str:
    """kubectl's short age (``42s``, ``5m3s``, ``2h``, ``3d``), as servers print it."""
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 600:
        return f"{seconds // 60}m{seconds % 60}s" if seconds % 60 else f"{seconds // 60}m"
    if seconds < 3 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def jsonpath(obj: Any, expr: str) -> Any:
    """The tiny JSONPath subset CRD printer columns use: ``.a.b[?(@.k=="v")].c``, ``[0]``."""
    tokens = re.findall(r"\.([\w-]+)|\[\?\(@\.([\w-]+)==[\"']([^\"']*)[\"']\)\]|\[(\d+)\]", expr)
    current: list[Any] = [obj]
    for key, fkey, fval, index in tokens:
        nxt: list[Any] = []
        for value in current:
            if key and isinstance(value, dict) and key in value:
                nxt.append(value[key])
            elif fkey and isinstance(value, list):
                nxt.extend(v for v in value if isinstance(v, dict) and str(v.get(fkey)) == fval)
            elif index and isinstance(value, list) and int(index) < len(value):
                nxt.append(value[int(index)])
        current = nxt
    return current[0] if current else None


class Emulator(kmock.KubernetesEmulator):
    """The emulator; serve it with ``kmock.Server(emulator)`` inside ``async with emulator``."""

    def __attrs_post_init__(self) -> None:
        # NB: no super().__attrs_post_init__(): kmock's catch-all fallbacks would answer
        # every request before ours. User reactions (the DSL) still come first.
        self.audit_path: str | None = None  # set it to get a JSON-lines audit log
        self.kinds: dict[tuple[str, str, str], Kind] = {}
        self.store: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.applied: dict[tuple[str, str, str, str, str], Any] = {}
        self.rv = 1
        self.log: list[tuple[int, str, str, str, dict[str, Any]]] = []
        self.changed: asyncio.Condition | None = None
        self._notifiers: set[asyncio.Task] = set()
        bundled = kmock.ResourcesArray()
        bundled.load_bundled()
        for res in bundled:
            info = bundled[res]
            if res.group == "metrics.k8s.io":
                continue  # served by metrics-server on real clusters, never stored
            kind = Kind(
                group=res.group or "",
                version=res.version or "v1",
                plural=res.plural or "",
                kind=info.kind or "",
                namespaced=bool(info.namespaced),
                singular=info.singular or (info.kind or "").lower(),
                short_names=sorted(info.shortnames),
                categories=sorted(info.categories),
                verbs=sorted(info.verbs),
                subresources={s for s in info.subresources if s in ("status", "scale")},
            )
            if "scale" in kind.subresources:
                kind.scale = dict(BUILTIN_SCALE)
            self.kinds[(kind.group, kind.version, kind.plural)] = kind
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self._commit_new(self.kind("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    # ----------------------------------------------------------------- plumbing

    def kind(self, group: str, version: str, plural: str) -> Kind:
        return self.kinds[(group, version, plural)]

    def objects_of(
        self, group: str, plural: str, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Stored objects (deep copies), for assertions in tests."""
        return [
            copy.deepcopy(o)
            for (g, p, ns, _), o in sorted(self.store.items())
            if g == group and p == plural and (namespace is None or ns == namespace)
        ]

    def get_object(
        self, group: str, plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        obj = self.store.get((group, plural, namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's own parser fails on /api/v1/namespaces; ours is used instead.
        await raw_request.read()
        try:
            request = rendering.Request(
                id=len(self._requests),
                raw_request=raw_request,
                url=raw_request.url,
                method=raw_request.method,
                params=dict(raw_request.query),
                headers=dict(raw_request.headers),
                body=await raw_request.read(),
            )
            self._requests.append(request)
            return await self._handle(request)
        except ApiError as e:
            return aiohttp.web.json_response(
                status_body(e.code, e.reason, e.message, e.details), status=e.code
            )
        except Exception as e:  # a bug here must reach the client, not hang it
            return aiohttp.web.json_response(
                status_body(500, "InternalError", f"emulator: {type(e).__name__}: {e}"), status=500
            )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        try:
            return await kmock.RawHandler._handle(self, request)  # user reactions only
        except NotImplementedError:
            pass
        if self.changed is None:
            self.changed = asyncio.Condition()
        return await self.serve(request._raw_request)

    # ----------------------------------------------------------------- routing

    async def serve(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        path, method = raw.path.rstrip("/") or "/", raw.method.upper()
        if path in ("/healthz", "/readyz", "/livez"):
            return aiohttp.web.Response(text="ok")
        if path == "/version":
            major, minor, patch = KUBE_VERSION
            return self.json(
                {
                    "major": str(major),
                    "minor": str(minor),
                    "gitVersion": f"v{major}.{minor}.{patch}",
                    "gitTreeState": "clean",
                    "platform": "linux/amd64",
                    "goVersion": "go1.24",
                    "compiler": "gc",
                }
            )
        if path == "/api":
            return self.json({"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"]})
        if path == "/apis":
            return self.json(self.group_list())
        if path == "/":
            return self.json({"paths": ["/api", "/api/v1", "/apis", "/version"]})
        route = parse_path(path)
        if route.group is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if route.version is None:
            return self.json(self.group_info(route.group))
        if route.plural is None:
            return self.json(self.resource_list(route.group, route.version))
        kind = self.kinds.get((route.group, route.version, route.plural))
        if kind is None:
            if route.group == "" and route.version == "v1" and route.plural == "namespaces":
                pass
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ({route.plural})",
            )
        if not kind.namespaced:
            route.namespace = None
        query = raw.query
        self.audit(raw, kind, route, method)
        if method == "GET" and query.get("watch") in ("true", "1"):
            return await self.watch(raw, kind, route)
        body = (
            self.decode_body(raw, await raw.read())
            if method in ("POST", "PUT", "PATCH", "DELETE")
            else None
        )
        dry = query.get("dryRun") == "All"
        # kubectl's default --validate=strict arrives as fieldValidation=Strict; the
        # verbs below are synchronous, so this cannot leak into another request.
        self.strict = query.get("fieldValidation") == "Strict"
        if route.subresource and route.subresource not in kind.subresources:
            raise ApiError(
                404, "NotFound", f"{kind.plural} has no subresource {route.subresource!r}"
            )
        if method == "GET" and route.name is None:
            return self.render(raw, kind, self.list(kind, route, query), listing=True)
        if method == "GET":
            obj = self.get(kind, route)
            if route.subresource == "scale":
                return self.json(self.scale_of(kind, obj))
            return self.render(raw, kind, obj)
        if method == "POST" and route.name is None:
            return self.json(self.create(kind, route, body, dry), status=201)
        if method == "PUT" and route.name:
            return self.json(self.replace(kind, route, body, dry, query))
        if method == "PATCH" and route.name:
            ctype = (raw.content_type or "").lower()
            result, created = self.patch(kind, route, body, ctype, dry, query)
            return self.json(result, status=201 if created else 200)
        if method == "DELETE" and route.name:
            return self.json(self.delete(kind, route, body or {}, dry))
        if method == "DELETE":
            return self.json(self.delete_collection(kind, route, query, dry))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    def audit(self, raw: aiohttp.web.BaseRequest, kind: Kind, route: Route, method: str) -> None:
        """One JSON line per resource request (RBAC verb, resource, client) if enabled."""
        if not self.audit_path:
            return
        if method == "GET":
            verb = (
                "watch"
                if raw.query.get("watch") in ("true", "1")
                else "get"
                if route.name
                else "list"
            )
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
                method, method
            )
            if verb == "delete" and not route.name:
                verb = "deletecollection"
        verbs = [verb]
        key = self._key(kind, route.namespace, route.name or "")
        if verb == "patch" and "apply-patch" in (raw.content_type or "") and key not in self.store:
            verbs.append("create")  # server-side apply of an absent object creates it
        resource = f"{kind.plural}/{route.subresource}" if route.subresource else kind.plural
        with open(self.audit_path, "a") as f:
            for v in verbs:
                entry = {
                    "verb": v,
                    "group": kind.group,
                    "resource": resource,
                    "namespace": route.namespace,
                    "name": route.name,
                    "userAgent": raw.headers.get("User-Agent", ""),
                }
                f.write(json.dumps(entry) + "\n")

    @staticmethod
    def json(data: Any, status: int = 200) -> aiohttp.web.Response:
        return aiohttp.web.json_response(data, status=status)

    def decode_body(self, raw: aiohttp.web.BaseRequest, data: bytes) -> Any:
        if not data:
            return None
        ctype = (raw.content_type or "").lower()
        if "protobuf" in ctype:
            try:
                return protobuf.decode(data)
            except ValueError as e:
                raise ApiError(
                    415, "UnsupportedMediaType", f"cannot decode the protobuf body: {e}"
                ) from e
        text = data.decode("utf-8")
        try:
            if "yaml" in ctype:
                return yaml.safe_load(text)
            return json.loads(text)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"cannot decode the body ({ctype}): {e}") from e

    # ----------------------------------------------------------------- discovery

    def group_list(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {}
        for kind in self.kinds.values():
            if kind.group and kind.version not in groups.setdefault(kind.group, []):
                groups[kind.group].append(kind.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group(g, v) for g, v in groups.items()],
        }

    @staticmethod
    def _group(group: str, versions: list[str]) -> dict[str, Any]:
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def group_info(self, group: str) -> dict[str, Any]:
        versions = [k.version for k in self.kinds.values() if k.group == group]
        if not versions:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource (group {group})"
            )
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            **self._group(group, list(dict.fromkeys(versions))),
        }

    def resource_list(self, group: str, version: str) -> dict[str, Any]:
        kinds = [k for k in self.kinds.values() if k.group == group and k.version == version]
        if not kinds:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ({group}/{version})",
            )
        resources = []
        for k in sorted(kinds, key=lambda k: k.plural):
            entry = {
                "name": k.plural,
                "singularName": k.singular,
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": k.verbs,
            }
            if k.short_names:
                entry["shortNames"] = k.short_names
            if k.categories:
                entry["categories"] = k.categories
            resources.append(entry)
            if k.has_status:
                resources.append(
                    {
                        "name": f"{k.plural}/status",
                        "singularName": "",
                        "namespaced": k.namespaced,
                        "kind": k.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if "scale" in k.subresources:
                resources.append(
                    {
                        "name": f"{k.plural}/scale",
                        "singularName": "",
                        "namespaced": k.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        gv = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }

    # ----------------------------------------------------------------- state

    def _key(self, kind: Kind, namespace: str | None, name: str) -> tuple[str, str, str, str]:
        return (kind.group, kind.plural, namespace or "", name)

    def _record(self, kind: Kind, event: str, obj: dict[str, Any]) -> None:
        self.log.append((self.rv, kind.group, kind.plural, event, copy.deepcopy(obj)))
        if len(self.log) > LOG_LIMIT:
            del self.log[: LOG_LIMIT // 10]
        res = kmock.resource(kind.group, kind.version, kind.plural)
        meta = obj["metadata"]
        key = (res, meta.get("namespace"), meta["name"])
        # Mirror into kmock's object history so kmock-style assertions keep working.
        if event == "DELETED":
            if key in self._objects:
                self._objects[key].delete()
        elif key in self._objects:
            self._objects[key].history.append(copy.deepcopy(obj))
        else:
            self._objects[key] = copy.deepcopy(obj)
        if self.changed is not None:
            task = asyncio.get_running_loop().create_task(self._notify())
            self._notifiers.add(task)  # keep a reference until it ran (asyncio holds weak ones)
            task.add_done_callback(self._notifiers.discard)

    async def _notify(self) -> None:
        assert self.changed is not None
        async with self.changed:
            self.changed.notify_all()

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _commit_new(self, kind: Kind, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=now(),
            resourceVersion=self._next_rv(),
            generation=1,
        )
        if namespace:
            meta["namespace"] = namespace
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        self._on_store(kind, obj)
        self.store[self._key(kind, namespace, meta["name"])] = obj
        self._record(kind, "ADDED", obj)
        return copy.deepcopy(obj)

    def _commit_update(
        self, kind: Kind, old: dict[str, Any], new: dict[str, Any]
    ) -> dict[str, Any]:
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(kind, new)
        if _essence(old) == _essence(new):
            return copy.deepcopy(old)  # no-op writes do not bump resourceVersion
        if _spec_of(old) != _spec_of(new):
            meta["generation"] = int(old["metadata"].get("generation") or 1) + 1
        meta["resourceVersion"] = self._next_rv()
        self._on_store(kind, new)
        self.store[self._key(kind, meta.get("namespace"), meta["name"])] = new
        self._record(kind, "MODIFIED", new)
        return copy.deepcopy(new)

    def _remove(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        self.store.pop(self._key(kind, meta.get("namespace"), meta["name"]), None)
        for k in [
            k for k in self.applied if k[:4] == self._key(kind, meta.get("namespace"), meta["name"])
        ]:
            del self.applied[k]
        meta["resourceVersion"] = self._next_rv()
        self._record(kind, "DELETED", obj)
        self._on_removed(kind, obj)
        return copy.deepcopy(obj)

    # What the API server itself (not a controller) does for particular kinds.
    def _on_store(self, kind: Kind, obj: dict[str, Any]) -> None:
        if (kind.group, kind.plural) == ("", "secrets"):
            obj["type"] = obj.get("type") or "Opaque"
        if (kind.group, kind.plural) == ("", "secrets") and "stringData" in obj:
            data = obj.setdefault("data", {}) or {}
            for k, v in (obj.pop("stringData") or {}).items():
                data[k] = base64.b64encode(str(v).encode()).decode()
            obj["data"] = data
        elif (kind.group, kind.plural) == ("", "services"):
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec.get("clusterIP") in (None, ""):
                spec["clusterIP"] = f"198.19.1.{random.randint(1, 254)}"
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
        elif (kind.group, kind.plural) == ("", "namespaces"):
            obj.setdefault("status", {})["phase"] = (
                "Terminating" if obj["metadata"].get("deletionTimestamp") else "Active"
            )
        elif (kind.group, kind.plural) == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._register_crd(obj)

    def _on_removed(self, kind: Kind, obj: dict[str, Any]) -> None:
        if (kind.group, kind.plural) == ("apiextensions.k8s.io", "customresourcedefinitions"):
            for key, k in list(self.kinds.items()):
                if k.crd == obj["metadata"]["name"]:
                    for skey, stored in list(self.store.items()):
                        if skey[:2] == (k.group, k.plural):
                            self._remove(k, stored)
                    del self.kinds[key]
        elif (kind.group, kind.plural) == ("", "namespaces"):
            # The namespace controller's job, done at once: drop everything inside.
            for (g, p, ns, _), stored in list(self.store.items()):
                if ns == obj["metadata"]["name"]:
                    owner = next(k for k in self.kinds.values() if (k.group, k.plural) == (g, p))
                    self._remove(owner, stored)

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        for key, k in list(self.kinds.items()):
            if k.crd == crd["metadata"]["name"]:
                del self.kinds[key]
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            subs = version.get("subresources") or {}
            kind = Kind(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or names["kind"].lower(),
                short_names=list(names.get("shortNames") or []),
                categories=list(names.get("categories") or []),
                subresources={s for s in ("status", "scale") if s in subs},
                scale=subs.get("scale"),
                openapi=(version.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=list(version.get("additionalPrinterColumns") or []),
                crd=crd["metadata"]["name"],
            )
            self.kinds[(kind.group, kind.version, kind.plural)] = kind
        crd["status"] = {
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "lastTransitionTime": now(),
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "lastTransitionTime": now(),
                },
            ],
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
        }

    # ----------------------------------------------------------------- verbs

    def get(self, kind: Kind, route: Route) -> dict[str, Any]:
        obj = self.store.get(self._key(kind, route.namespace, route.name or ""))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{kind.plural}.{kind.group or "core"} "{route.name}" not found',
                {"name": route.name, "group": kind.group, "kind": kind.plural},
            )
        return copy.deepcopy(obj)

    def list(self, kind: Kind, route: Route, query: Any) -> dict[str, Any]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        items = [
            copy.deepcopy(obj)
            for (g, p, ns, _), obj in sorted(self.store.items())
            if (g, p) == (kind.group, kind.plural)
            and (route.namespace is None or ns == route.namespace)
            and labels_match(obj["metadata"].get("labels") or {}, labels)
            and fields_match(obj, query.get("fieldSelector", ""))
        ]
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    def _prepare(self, kind: Kind, obj: Any, route: Route, strict: bool = False) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        if obj.get("kind") not in (None, kind.kind):
            raise ApiError(
                400, "BadRequest", f"kind {obj.get('kind')!r} does not match {kind.kind!r}"
            )
        meta = obj.setdefault("metadata", {})
        body_ns = meta.get("namespace")
        if kind.namespaced and body_ns and route.namespace and body_ns != route.namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the "
                "request",
            )
        if kind.namespaced:
            meta["namespace"] = route.namespace or body_ns or "default"
        else:
            meta.pop("namespace", None)
        if kind.openapi is not None:
            obj = schema.apply_defaults(kind.openapi, obj)
            problems = schema.validate(
                kind.openapi, obj, strict=strict or getattr(self, "strict", False)
            )
            if problems:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{kind.kind}.{kind.group} "{meta.get("name")}" is invalid: '
                    + "; ".join(problems),
                    {
                        "name": meta.get("name"),
                        "group": kind.group,
                        "kind": kind.kind,
                        # kubectl prints these `field: message` lines.
                        "causes": [
                            {"reason": "FieldValueInvalid", "field": f, "message": m}
                            for f, m in (p.split(": ", 1) for p in problems)
                        ],
                    },
                )
        return obj

    def create(self, kind: Kind, route: Route, body: Any, dry: bool) -> dict[str, Any]:
        obj = self._prepare(kind, copy.deepcopy(body), route)
        meta = obj["metadata"]
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "metadata.name or metadata.generateName is required")
            meta["name"] = meta["generateName"] + "".join(
                random.choices(string.ascii_lowercase + string.digits, k=5)
            )
        if self._key(kind, meta.get("namespace"), meta["name"]) in self.store:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{kind.plural}.{kind.group or "core"} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": kind.group, "kind": kind.plural},
            )
        for field in ("resourceVersion", "uid", "deletionTimestamp", "creationTimestamp"):
            meta.pop(field, None)
        if kind.has_status:
            obj.pop("status", None)
        if dry:
            return obj
        return self._commit_new(kind, meta.get("namespace"), obj)

    def _merge_write(
        self, kind: Kind, route: Route, old: dict[str, Any], new: dict[str, Any]
    ) -> dict[str, Any]:
        """Apply subresource rules and immutable metadata to a full new object."""
        if route.subresource == "status":
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status")
            return merged
        new = self._prepare(kind, new, route)
        meta = new["metadata"]
        for field in (
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "generation",
            "deletionTimestamp",
        ):
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
            else:
                meta.pop(field, None)
        if kind.has_status:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        if (kind.group, kind.plural) == ("apps", "statefulsets"):
            self._check_statefulset_update(old, new)
        return new

    @staticmethod
    def _check_statefulset_update(old: dict[str, Any], new: dict[str, Any]) -> None:
        """The API server's StatefulSet validation: most of the spec is immutable."""
        mutable = {
            "replicas",
            "ordinals",
            "template",
            "updateStrategy",
            "persistentVolumeClaimRetentionPolicy",
            "minReadySeconds",
        }
        before = {k: v for k, v in (old.get("spec") or {}).items() if k not in mutable}
        after = {k: v for k, v in (new.get("spec") or {}).items() if k not in mutable}
        if before != after:
            raise ApiError(
                422,
                "Invalid",
                f'StatefulSet.apps "{old["metadata"]["name"]}" is invalid: spec: Forbidden: '
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', "
                "'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and "
                "'minReadySeconds' are forbidden",
            )

    def _check_rv(self, old: dict[str, Any], new: Any) -> None:
        want = (new.get("metadata") or {}).get("resourceVersion") if isinstance(new, dict) else None
        if want and want != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {old["kind"]} "{old["metadata"]["name"]}": '
                "the object has been modified; please apply your changes to the latest version "
                "and try again",
            )

    def replace(self, kind: Kind, route: Route, body: Any, dry: bool, query: Any) -> dict[str, Any]:
        if route.subresource == "scale":
            obj = self.get(kind, route)
            self._check_rv(obj, body)
            return self._set_scale(kind, route, obj, body, dry)
        old = self.get(kind, route)
        self._check_rv(old, body)
        new = self._merge_write(kind, route, old, copy.deepcopy(body))
        return new if dry else self._commit_update(kind, old, new)

    def patch(
        self, kind: Kind, route: Route, body: Any, ctype: str, dry: bool, query: Any
    ) -> tuple[dict, bool]:
        key = self._key(kind, route.namespace, route.name or "")
        if route.subresource == "scale":
            obj = self.get(kind, route)
            scale = self.scale_of(kind, obj)
            return self._set_scale(kind, route, obj, self._patched(scale, body, ctype), dry), False
        if "apply-patch" in ctype:
            manager = query.get("fieldManager") or "unknown"
            if key not in self.store:
                created = self.create(kind, route, body, dry)
                if not dry:
                    self.applied[(*key, manager)] = copy.deepcopy(body)
                return created, True
            old = self.get(kind, route)
            previous = self.applied.get((*key, manager), {})
            new = patching.apply(old, previous, body)
            new = self._merge_write(kind, route, old, new)
            if dry:
                return new, False
            self.applied[(*key, manager)] = copy.deepcopy(body)
            return self._commit_update(kind, old, new), False
        old = self.get(kind, route)
        if isinstance(body, dict):
            self._check_rv(old, body)
        if "strategic" in ctype and kind.openapi is not None:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "strategic merge patch is not supported for custom resources",
            )
        new = self._patched(old, body, ctype)
        new = self._merge_write(kind, route, old, new)
        return (new if dry else self._commit_update(kind, old, new)), False

    @staticmethod
    def _patched(doc: dict[str, Any], body: Any, ctype: str) -> dict[str, Any]:
        try:
            if "json-patch" in ctype:
                return patching.json_patch(doc, body)
            if "strategic" in ctype:
                return patching.strategic_merge_patch(doc, body)
            if "merge-patch" in ctype:
                return patching.merge_patch(doc, body)
        except patching.PatchError as e:
            raise ApiError(422, "Invalid", str(e)) from e
        raise ApiError(
            415, "UnsupportedMediaType", f"the patch content type {ctype!r} is not supported"
        )

    def delete(
        self, kind: Kind, route: Route, options: dict[str, Any], dry: bool
    ) -> dict[str, Any]:
        obj = self.get(kind, route)
        precondition = (options.get("preconditions") or {}).get("resourceVersion")
        if precondition and precondition != obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the resourceVersion precondition failed")
        if dry:
            return obj
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(obj)
                new["metadata"]["deletionTimestamp"] = now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._commit_update(kind, obj, new)
            return obj
        return self._remove(kind, obj)

    def delete_collection(self, kind: Kind, route: Route, query: Any, dry: bool) -> dict[str, Any]:
        listing = self.list(kind, route, query)
        for item in listing["items"]:
            meta = item["metadata"]
            self.delete(kind, Route(namespace=meta.get("namespace"), name=meta["name"]), {}, dry)
        return listing

    # ----------------------------------------------------------------- scale

    def scale_of(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        scale = kind.scale or {}
        meta = obj["metadata"]
        selector = None
        if scale.get("labelSelectorPath"):
            selector = jsonpath(obj, scale["labelSelectorPath"])
        elif isinstance((obj.get("spec") or {}).get("selector"), dict):
            labels = (obj["spec"]["selector"].get("matchLabels")) or {}
            selector = ",".join(f"{k}={v}" for k, v in labels.items())
        status: dict[str, Any] = {
            "replicas": int(jsonpath(obj, scale.get("statusReplicasPath", "")) or 0)
        }
        if selector:
            status["selector"] = selector
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": int(jsonpath(obj, scale.get("specReplicasPath", "")) or 0)},
            "status": status,
        }

    def _set_scale(
        self, kind: Kind, route: Route, obj: dict[str, Any], scale: Any, dry: bool
    ) -> dict[str, Any]:
        replicas = ((scale or {}).get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, "Invalid", "spec.replicas: must be a non-negative integer")
        path = [p for p in (kind.scale or BUILTIN_SCALE)["specReplicasPath"].split(".") if p]
        new = copy.deepcopy(obj)
        target = new
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = replicas
        plain = Route(route.group, route.version, route.namespace, route.plural, route.name)
        new = self._merge_write(kind, plain, obj, new)
        stored = new if dry else self._commit_update(kind, obj, new)
        return self.scale_of(kind, stored)

    # ----------------------------------------------------------------- reading

    def render(
        self, raw: aiohttp.web.BaseRequest, kind: Kind, data: dict[str, Any], listing: bool = False
    ):
        if "as=Table" in raw.headers.get("Accept", ""):
            items = data["items"] if listing else [data]
            return self.json(self.table(kind, items, data["metadata"].get("resourceVersion", "")))
        return self.json(data)

    def table(self, kind: Kind, items: list[dict[str, Any]], rv: str) -> dict[str, Any]:
        columns = [
            {
                "name": "Name",
                "type": "string",
                "format": "name",
                "description": "Name",
                "priority": 0,
            }
        ]
        extra = [c for c in kind.printer_columns if c.get("name") != "Age"]
        columns += [
            {
                "name": c["name"],
                "type": c.get("type", "string"),
                "format": c.get("format", ""),
                "description": c.get("description", ""),
                "priority": c.get("priority", 0),
            }
            for c in extra
        ]
        columns.append(
            {"name": "Age", "type": "date", "format": "", "description": "Age", "priority": 0}
        )
        rows = []
        for obj in items:
            cells = [obj["metadata"]["name"]]
            for c in extra:
                value = jsonpath(obj, c["jsonPath"])
                if c.get("type") == "date" and isinstance(value, str):
                    value = age(value)
                cells.append("<none>" if value is None else value)
            cells.append(age(obj["metadata"].get("creationTimestamp")))
            rows.append({"cells": cells, "object": obj})
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": rv},
            "columnDefinitions": columns,
            "rows": rows,
        }

    async def watch(
        self, raw: aiohttp.web.BaseRequest, kind: Kind, route: Route
    ) -> aiohttp.web.StreamResponse:
        query = raw.query
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = query.get("fieldSelector", "")
        name = route.name
        as_table = "as=Table" in raw.headers.get("Accept", "")
        timeout = float(query.get("timeoutSeconds") or 0) or None

        def wanted(group: str, plural: str, obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return (
                (group, plural) == (kind.group, kind.plural)
                and (route.namespace is None or meta.get("namespace") == route.namespace)
                and (name is None or meta["name"] == name)
                and labels_match(meta.get("labels") or {}, labels)
                and fields_match(obj, fields)
            )

        def frame(event: str, obj: dict[str, Any]) -> bytes:
            payload = (
                self.table(kind, [obj], obj["metadata"]["resourceVersion"]) if as_table else obj
            )
            return json.dumps({"type": event, "object": payload}).encode() + b"\n"

        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        start = query.get("resourceVersion") or "0"
        try:
            if start == "0":
                position = self.rv
                for (g, p, _ns, _n), obj in sorted(self.store.items()):
                    if wanted(g, p, obj):
                        await response.write(frame("ADDED", obj))
            else:
                position = int(start)
                if self.log and position < self.log[0][0] - 1 and position < self.rv:
                    gone = status_body(
                        410, "Expired", f"too old resource version: {position} ({self.log[0][0]})"
                    )
                    await response.write(
                        json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n"
                    )
                    return response
            deadline = asyncio.get_running_loop().time() + timeout if timeout else None
            assert self.changed is not None
            while True:
                first = bisect.bisect_right(self.log, position, key=lambda e: e[0])
                for rv, g, p, event, obj in self.log[first:]:
                    position = rv
                    if wanted(g, p, obj):
                        await response.write(frame(event, obj))
                remaining = (
                    None if deadline is None else deadline - asyncio.get_running_loop().time()
                )
                if remaining is not None and remaining <= 0:
                    break
                async with self.changed:
                    if not any(e[0] > position for e in self.log[-50:]):
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(
                                self.changed.wait(), timeout=min(remaining or 5.0, 5.0)
                            )
        except (ConnectionResetError, asyncio.CancelledError):
            return response
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response


def _essence(obj: dict[str, Any]) -> Any:
    trimmed = copy.deepcopy(obj)
    trimmed.get("metadata", {}).pop("resourceVersion", None)
    return trimmed


def _spec_of(obj: dict[str, Any]) -> Any:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}
