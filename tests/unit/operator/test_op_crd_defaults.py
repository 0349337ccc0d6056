"""The CRD is the one source of the spec's defaults (eventfleet_operator.crd).

Every default the CRD states reaches the parsed model; a changed default in the CRD
changes the model with no Python edit; and no default or choice list the CRD states is
written again in eventfleet_operator/model.py.
"""

from __future__ import annotations

import ast
import copy
import pathlib
from collections.abc import Callable
from typing import Any

import op_k8s_schema as k8s_schema
import pytest
from eventfleet_operator import constants, crd, model
from op_fakes import FULL_SPEC

# A spec with every optional object present (its name only), so that the defaults
# inside them apply: token refs, issuerRef, a Replication table and users, backup, restore.
EVERY_OBJECT: dict[str, Any] = {
    "token": {"secretRef": {"name": "client"}},
    "peerToken": {"secretRef": {"name": "peer"}},
    "tls": {"issuerRef": {"name": "issuer"}},
    "protocols": {"replication": {"tables": [{"name": "t"}], "usersSecretRef": {"name": "u"}}},
    "backup": {"s3": {"bucket": "bkt", "credentialsSecret": {"name": "s3"}}},
    "bootstrap": {
        "fromBackup": {"key": "k", "s3": {"bucket": "bkt", "credentialsSecret": {"name": "s3"}}}
    },
}

F = model.FleetSpec
# Where the parsed model carries each CRD default (parsed from EVERY_OBJECT).
CARRIED: dict[str, Callable[[F], Any]] = {
    "spec.replicas": lambda f: f.replicas,
    "spec.imagePullPolicy": lambda f: f.image_pull_policy,
    "spec.storage.size": lambda f: f.storage.size,
    "spec.storage.synchronous": lambda f: f.storage.synchronous,
    "spec.storage.retentionPolicy.whenDeleted": lambda f: f.storage.when_deleted,
    "spec.storage.retentionPolicy.whenScaled": lambda f: f.storage.when_scaled,
    "spec.ports.eventer": lambda f: f.ports["eventer"],
    "spec.ports.syncer": lambda f: f.ports["syncer"],
    "spec.ports.bus": lambda f: f.ports["bus"],
    "spec.ports.http": lambda f: f.ports["http"],
    "spec.token.secretRef.key": lambda f: f.token.key,
    "spec.peerToken.secretRef.key": lambda f: f.peer_token.key,
    "spec.clients.allowTokenless": lambda f: f.clients.allow_tokenless,
    "spec.tls.enabled": lambda f: f.tls.enabled,
    "spec.tls.provider": lambda f: f.tls.provider,
    "spec.tls.http": lambda f: f.tls.http,
    "spec.tls.issuerRef.kind": lambda f: f.tls.issuer.kind,
    "spec.tls.issuerRef.group": lambda f: f.tls.issuer.group,
    "spec.protocols.replication.enabled": lambda f: f.replication.enabled,
    "spec.protocols.replication.typePrefix": lambda f: f.replication.type_prefix,
    "spec.protocols.replication.tables[].key": lambda f: f.replication.tables[0]["key"],
    "spec.protocols.replication.tables[].add": lambda f: f.replication.tables[0]["add"],
    "spec.protocols.replication.tables[].delete": lambda f: f.replication.tables[0]["delete"],
    "spec.protocols.replication.usersSecretRef.key": lambda f: f.replication.users_key,
    "spec.protocols.bus.enabled": lambda f: "bus" in f.enabled_protocols,
    "spec.protocols.bus.curve": lambda f: {
        "enabled": f.bus_curve.enabled,
        "tokens": f.bus_curve.tokens,
    },
    "spec.protocols.bus.curve.enabled": lambda f: f.bus_curve.enabled,
    "spec.protocols.bus.curve.tokens": lambda f: f.bus_curve.tokens,
    "spec.protocols.jetstream.enabled": lambda f: f.jetstream.enabled,
    "spec.protocols.jetstream.path": lambda f: f.jetstream.path,
    "spec.protocols.jetstream.typePrefix": lambda f: f.jetstream.type_prefix,
    "spec.syncer.subscriptions": lambda f: f.subscriptions,
    "spec.monitoring.serviceMonitor.enabled": lambda f: f.service_monitor.enabled,
    "spec.monitoring.serviceMonitor.interval": lambda f: f.service_monitor.interval,
    "spec.aggregation.enabled": lambda f: f.aggregation.enabled,
    "spec.aggregation.schedule": lambda f: f.aggregation.schedule,
    "spec.aggregation.timeZone": lambda f: f.aggregation.time_zone,
    "spec.aggregation.concurrencyPolicy": lambda f: f.aggregation.concurrency_policy,
    "spec.aggregation.suspend": lambda f: f.aggregation.suspend,
    "spec.aggregation.bucketSeconds": lambda f: f.aggregation.bucket_seconds,
    "spec.aggregation.windowSeconds": lambda f: f.aggregation.window_seconds,
    "spec.aggregation.sparkVersion": lambda f: f.aggregation.spark_version,
    "spec.aggregation.serviceAccountName": lambda f: f.aggregation.service_account_name,
    "spec.aggregation.driver.cores": lambda f: f.aggregation.driver.cores,
    "spec.aggregation.driver.memory": lambda f: f.aggregation.driver.memory,
    "spec.aggregation.executor.instances": lambda f: f.aggregation.executor.instances,
    "spec.aggregation.executor.cores": lambda f: f.aggregation.executor.cores,
    "spec.aggregation.executor.memory": lambda f: f.aggregation.executor.memory,
    "spec.securityContext.runAsUser": lambda f: f.security.run_as_user,
    "spec.securityContext.runAsGroup": lambda f: f.security.run_as_group,
    "spec.securityContext.fsGroup": lambda f: f.security.fs_group,
    "spec.logLevel": lambda f: f.log_level,
    "spec.terminationGracePeriodSeconds": lambda f: f.termination_grace_period_seconds,
    "spec.updateStrategy.type": lambda f: f.update_strategy,
    "spec.backup.retention": lambda f: f.backup.retention,
    "spec.backup.suspend": lambda f: f.backup.suspend,
    "spec.backup.s3.region": lambda f: f.backup.s3.region,
    "spec.backup.s3.addressingStyle": lambda f: f.backup.s3.addressing_style,
    "spec.backup.s3.credentialsSecret.accessKeyIdKey": (
        lambda f: f.backup.s3.credentials.access_key_id_key
    ),
    "spec.backup.s3.credentialsSecret.secretAccessKeyKey": (
        lambda f: f.backup.s3.credentials.secret_access_key_key
    ),
    "spec.bootstrap.fromBackup.s3.region": lambda f: f.from_backup.s3.region,
    "spec.bootstrap.fromBackup.s3.addressingStyle": lambda f: f.from_backup.s3.addressing_style,
    "spec.bootstrap.fromBackup.s3.credentialsSecret.accessKeyIdKey": (
        lambda f: f.from_backup.s3.credentials.access_key_id_key
    ),
    "spec.bootstrap.fromBackup.s3.credentialsSecret.secretAccessKeyKey": (
        lambda f: f.from_backup.s3.credentials.secret_access_key_key
    ),
    "spec.hibernate": lambda f: f.hibernate,
    "spec.podDisruptionBudget.enabled": lambda f: f.pdb.enabled,
    "spec.podDisruptionBudget.maxUnavailable": lambda f: f.pdb.max_unavailable,
    "spec.podDisruptionBudget.unhealthyPodEvictionPolicy": (
        lambda f: f.pdb.unhealthy_pod_eviction_policy
    ),
    "spec.networkPolicy.enabled": lambda f: f.network_policy.enabled,
}
# Defaults EVERY_OBJECT overrides (it lists a table): checked on the empty spec.
CARRIED_BY_EMPTY: dict[str, Callable[[F], Any]] = {
    "spec.protocols.replication.tables": lambda f: f.replication.tables,
}


def as_model(value: Any) -> Any:
    """A JSON default in the model's terms: lists are tuples."""
    if isinstance(value, list):
        return tuple(as_model(v) for v in value)
    if isinstance(value, dict):
        return {k: as_model(v) for k, v in value.items()}
    return value


def stated() -> dict[str, Any]:
    """The CRD's defaults, but for the ``{}`` of an object (it only makes room for the
    defaults of its fields, which are listed themselves)."""
    return {path: value for path, value in crd.defaults().items() if value != {}}


def test_every_crd_default_has_a_place_in_the_model():
    # A new default in the CRD must say where the model carries it (CARRIED).
    assert set(stated()) == set(CARRIED) | set(CARRIED_BY_EMPTY)


@pytest.mark.parametrize("path", sorted(stated()))
def test_the_parsed_model_carries_the_crd_default(path):
    if path in CARRIED_BY_EMPTY:
        carried = CARRIED_BY_EMPTY[path](model.parse("demo", "ns", {}))
    else:
        carried = CARRIED[path](model.parse("demo", "ns", copy.deepcopy(EVERY_OBJECT)))
    expected = as_model(crd.default(path))
    assert carried == expected and type(carried) is type(expected), (path, carried)


def test_the_generated_token_refs_use_the_crds_key():
    fleet = model.parse("demo", "ns", {})
    assert fleet.token_ref.key == crd.default("spec.token.secretRef.key")
    assert fleet.peer_token_ref.key == crd.default("spec.peerToken.secretRef.key")


def test_a_default_changed_in_the_crd_changes_the_model(monkeypatch):
    schema = copy.deepcopy(crd.spec_schema())
    schema["properties"]["storage"]["properties"]["size"]["default"] = "7Gi"
    curve = schema["properties"]["protocols"]["properties"]["bus"]["properties"]["curve"]
    curve["properties"]["tokens"]["default"] = False
    curve["default"] = {"enabled": False}
    monkeypatch.setattr(crd, "spec_schema", lambda: schema)
    fleet = model.parse("demo", "ns", {})
    assert fleet.storage.size == "7Gi"
    assert fleet.bus_curve.tokens is False


def test_defaulting_is_the_api_servers():
    given = {"storage": {"size": None, "synchronous": ""}, "protocols": {"bus": {}}}
    out = crd.with_defaults(given)
    assert given == {"storage": {"size": None, "synchronous": ""}, "protocols": {"bus": {}}}
    # A null or (the operator's lenience) an empty string takes the default.
    assert out["storage"]["size"] == crd.default("spec.storage.size")
    assert out["storage"]["synchronous"] == crd.default("spec.storage.synchronous")
    # Defaults inside a defaulted object apply too.
    assert out["storage"]["retentionPolicy"]["whenDeleted"] == crd.default(
        "spec.storage.retentionPolicy.whenDeleted"
    )
    assert out["protocols"]["bus"]["curve"] == {"enabled": False, "tokens": True}
    # Items of a list are defaulted; a value of the wrong type is left to the parser.
    tables = crd.with_defaults({"protocols": {"replication": {"tables": [{"name": "t"}, 5]}}})
    assert tables["protocols"]["replication"]["tables"][1] == 5
    assert tables["protocols"]["replication"]["tables"][0]["key"] == crd.default(
        "spec.protocols.replication.tables[].key"
    )
    assert crd.with_defaults({"storage": "big"})["storage"] == "big"
    # An empty object with required fields stays empty (the parser reads it as before).
    assert crd.with_defaults({"token": {"secretRef": {}}})["token"] == {"secretRef": {}}


@pytest.mark.parametrize("spec", [{}, EVERY_OBJECT, FULL_SPEC], ids=["empty", "objects", "full"])
def test_defaulting_agrees_with_the_api_server_oracle(spec):
    # The tests' own structural defaulting (op_k8s_schema), written apart from the
    # operator's, on the CRD file in crds/.
    schema = k8s_schema.crd_schema(k8s_schema.load_crd(), "v1")["properties"]["spec"]
    assert crd.with_defaults(spec) == k8s_schema.apply_defaults(schema, spec)


def test_an_unknown_crd_path_is_named():
    with pytest.raises(KeyError, match=r"spec\.storage\.nope"):
        crd.default("spec.storage.nope")
    with pytest.raises(KeyError, match=r"no default for 'spec\.storage\.storageClassName'"):
        crd.default("spec.storage.storageClassName")


@pytest.mark.parametrize(
    ("spec", "field", "bad"),
    [
        ({"storage": {"synchronous": "SOMETIMES"}}, "spec.storage.synchronous", "'SOMETIMES'"),
        ({"logLevel": "LOUD"}, "spec.logLevel", "'LOUD'"),
        ({"tls": {"provider": "Vault"}}, "spec.tls.provider", "'Vault'"),
        ({"storage": {"size": "lots"}}, "spec.storage.size", "'lots'"),
        ({"replicas": 0}, "spec.replicas", "got 0"),
        ({"replicas": "3"}, "spec.replicas", "got str '3'"),
        ({"hibernate": "yes"}, "spec.hibernate", "got str 'yes'"),
        ({"tolerations": ["x"]}, "spec.tolerations[0]", "got str 'x'"),
        ({"podLabels": {"tier": 1}}, "spec.podLabels.tier", "got int 1"),
        ({"storage": {"retentionPolicy": {"whenScaled": "Keep"}}}, "", "'Keep'"),
    ],
)
def test_a_bad_value_is_named_with_its_field_and_the_crds_choices(spec, field, bad):
    with pytest.raises(model.SpecError) as e:
        model.parse("demo", "ns", spec)
    field = field or "spec.storage.retentionPolicy.whenScaled"
    assert e.value.field == field
    assert bad in str(e.value)
    # An enum field's message lists the CRD's choices (list items and map entries have none).
    values = () if "[" in field or "podLabels" in field else crd.schema_at(field).get("enum", ())
    assert all(v in str(e.value) for v in values)


MODEL_PY = pathlib.Path(model.__file__)


def literals(path: pathlib.Path) -> set[Any]:
    """Every str and int constant of a module, docstrings aside."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and id(node) not in docstrings
        and type(node.value) in (str, int)
    }


def crd_words() -> tuple[set[str], set[int]]:
    """The CRD's field names (a key written in Python is not a default) and its bounds
    (a bound such as 3 for a bucket name is not the default 3 replicas)."""
    names: set[str] = set()
    bounds: set[int] = set()

    def walk(schema: dict) -> None:
        names.update(schema.get("properties") or {})
        for key in ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"):
            if key in schema:
                bounds.add(schema[key])
        for sub in (schema.get("properties") or {}).values():
            walk(sub)
        if isinstance(schema.get("items"), dict):
            walk(schema["items"])

    walk(crd.spec_schema())
    return names, bounds


def enums() -> list[tuple[str, ...]]:
    """Every ``enum`` of the CRD."""
    out = []

    def walk(schema: dict) -> None:
        if "enum" in schema:
            out.append(tuple(schema["enum"]))
        for sub in (schema.get("properties") or {}).values():
            walk(sub)
        if isinstance(schema.get("items"), dict):
            walk(schema["items"])

    walk(crd.spec_schema())
    return out


def test_model_py_states_no_default_the_crd_states():
    names, bounds = crd_words()
    found = literals(MODEL_PY)
    repeated = set()
    for path, value in stated().items():
        if isinstance(value, bool) or not isinstance(value, str | int):
            continue  # True/False and lists: the parser takes no default argument at all
        if isinstance(value, str) and value in names:
            continue  # "token", "path": also field names, written as keys
        if isinstance(value, int) and (value in bounds or value in (0, 1)):
            continue
        if value in found:
            repeated.add(f"{path}={value!r}")
    assert not repeated, f"model.py repeats CRD defaults: {sorted(repeated)}"


def test_model_py_lists_no_choices_the_crd_lists():
    # A tuple or list literal holding two values of one CRD enum is a copy of its choices
    # (one value alone is a rule on it, such as provider == "Operator").
    tree = ast.parse(MODEL_PY.read_text())
    copies = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            copies += [(node.lineno, e) for e in enums() if len(words & set(e)) >= 2]
    assert not copies, f"model.py lists CRD choices again: {copies}"


def integer_bounds() -> list[tuple[str, str, int]]:
    """(path, minimum|maximum, bound) of every integer field of the CRD outside lists."""
    out = []

    def walk(schema: dict, path: str) -> None:
        if schema.get("type") == "integer":
            out.extend((path, k, schema[k]) for k in ("minimum", "maximum") if k in schema)
        for key, sub in (schema.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")

    walk(crd.spec_schema(), "spec")
    return out


def placed(path: str, value: Any) -> dict[str, Any]:
    """EVERY_OBJECT with ``value`` at ``path`` (objects on the way created)."""
    spec = copy.deepcopy(EVERY_OBJECT)
    *parents, last = path.split(".")[1:]
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return spec


# What a field's bound value needs besides itself to be a valid spec (cross-field rules).
NEEDS: dict[str, dict[str, Any]] = {
    "spec.protocols.bus.curve.plainPort": {"enabled": True},  # PLAIN beside CURVE only
}


@pytest.mark.parametrize(("path", "kind", "bound"), integer_bounds())
def test_the_parser_enforces_every_crd_integer_bound(path, kind, bound):
    beyond = bound - 1 if kind == "minimum" else bound + 1

    def spec(value: int) -> dict[str, Any]:
        doc = placed(path, value)
        node = doc
        for key in path.split(".")[1:-1]:
            node = node[key]
        node.update(NEEDS.get(path, {}))
        return doc

    with pytest.raises(model.SpecError) as e:
        model.parse("demo", "ns", spec(beyond))
    assert e.value.field == path and f"got {beyond}" in e.value.message
    if not path.startswith("spec.ports."):  # a bound port may collide with its neighbour
        model.parse("demo", "ns", spec(bound))


@pytest.mark.parametrize("entry", constants.PROTOCOL_PORTS, ids=lambda e: e.protocol)
def test_the_crd_port_bounds_fit_the_protocols_port_block(entry):
    # The parser takes the CRD's bounds: a block of `width` ports must fit under 65536.
    schema = crd.schema_at(f"spec.ports.{entry.protocol}")
    assert (schema["minimum"], schema["maximum"]) == (constants.MIN_PORT, entry.max_base)
