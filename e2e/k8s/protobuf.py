"""Kubernetes protobuf request bodies -> the JSON form of the same object.

client-go (kubectl, helm's release storage) sends built-in kinds as protobuf
(``application/vnd.kubernetes.protobuf``) and does not fall back to JSON on 415. The
envelope is ``k8s\\x00`` + ``runtime.Unknown{typeMeta{apiVersion, kind}, raw}``, and
``raw`` is the object's message from ``k8s.io/api`` (field numbers from the
``generated.proto`` files). Only the kinds these clients create directly are known;
anything else is refused with a clear message (the emulator answers 415).
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

MAGIC = b"k8s\x00"

# message name -> {field number: (json name, type)}; types: string, bytes, int, bool,
# time, "msg:<Name>", "map:<value type>", and a "[]" suffix for repeated fields.
MESSAGES: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {1: ("typeMeta", "msg:TypeMeta"), 2: ("raw", "rawbytes")},
    "TypeMeta": {1: ("apiVersion", "string"), 2: ("kind", "string")},
    "ObjectMeta": {
        1: ("name", "string"),
        2: ("generateName", "string"),
        3: ("namespace", "string"),
        5: ("uid", "string"),
        6: ("resourceVersion", "string"),
        7: ("generation", "int"),
        8: ("creationTimestamp", "time"),
        9: ("deletionTimestamp", "time"),
        10: ("deletionGracePeriodSeconds", "int"),
        11: ("labels", "map:string"),
        12: ("annotations", "map:string"),
        13: ("ownerReferences", "msg:OwnerReference[]"),
        14: ("finalizers", "string[]"),
    },
    "OwnerReference": {
        1: ("kind", "string"),
        3: ("name", "string"),
        4: ("uid", "string"),
        5: ("apiVersion", "string"),
        6: ("controller", "bool"),
        7: ("blockOwnerDeletion", "bool"),
    },
    "Time": {1: ("seconds", "int"), 2: ("nanos", "int")},
    "Secret": {
        1: ("metadata", "msg:ObjectMeta"),
        2: ("data", "map:bytes"),
        3: ("type", "string"),
        4: ("stringData", "map:string"),
        5: ("immutable", "bool"),
    },
    "ConfigMap": {
        1: ("metadata", "msg:ObjectMeta"),
        2: ("data", "map:string"),
        3: ("binaryData", "map:bytes"),
        4: ("immutable", "bool"),
    },
    "Namespace": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", "string[]")},
    "ServiceAccount": {
        1: ("metadata", "msg:ObjectMeta"),
        3: ("imagePullSecrets", "msg:LocalObjectReference[]"),
        4: ("automountServiceAccountToken", "bool"),
    },
    "LocalObjectReference": {1: ("name", "string")},
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "int"),
        2: ("preconditions", "msg:Preconditions"),
        3: ("orphanDependents", "bool"),
        4: ("propagationPolicy", "string"),
        5: ("dryRun", "string[]"),
    },
    "Preconditions": {1: ("uid", "string"), 2: ("resourceVersion", "string")},
}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes):
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _scalar(kind: str, value: Any) -> Any:
    if kind == "string":
        return value.decode("utf-8")
    if kind == "bytes":
        return base64.b64encode(value).decode()
    if kind == "rawbytes":
        return value
    if kind == "int":
        return value - (1 << 64) if value >= 1 << 63 else value
    if kind == "bool":
        return bool(value)
    if kind == "time":
        seconds = decode_message("Time", value).get("seconds", 0)
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if kind.startswith("msg:"):
        return decode_message(kind[4:], value)
    raise ValueError(f"unknown field type {kind}")


def decode_message(name: str, data: bytes) -> dict[str, Any]:
    schema = MESSAGES[name]
    out: dict[str, Any] = {}
    for number, _wire, value in _fields(data):
        if number not in schema:
            continue  # fields we do not model are dropped, as old servers would
        field, kind = schema[number]
        if kind.startswith("map:"):
            entry = {n: v for n, _w, v in _fields(value)}
            key = entry.get(1, b"").decode("utf-8")
            out.setdefault(field, {})[key] = _scalar(kind[4:], entry.get(2, b""))
        elif kind.endswith("[]"):
            out.setdefault(field, []).append(_scalar(kind[:-2], value))
        else:
            value = _scalar(kind, value)
            if value not in ("", 0, False):  # Go's omitempty: zero values are absent in JSON
                out[field] = value
    return out


def decode(data: bytes) -> dict[str, Any]:
    """Decode an enveloped object; raises ``ValueError`` for unknown kinds."""
    if not data.startswith(MAGIC):
        raise ValueError("missing the k8s protobuf magic prefix")
    envelope = decode_message("Unknown", data[len(MAGIC) :])
    type_meta = envelope.get("typeMeta") or {}
    kind = type_meta.get("kind", "")
    if kind not in MESSAGES or kind in ("Unknown", "TypeMeta"):
        raise ValueError(
            f"kind {kind!r} is not known to the emulator's protobuf decoder; send JSON"
        )
    obj = decode_message(kind, envelope.get("raw", b""))
    if type_meta.get("apiVersion"):
        obj["apiVersion"] = type_meta["apiVersion"]
    obj["kind"] = kind
    return obj
