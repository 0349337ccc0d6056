"""What the schema cannot catch: the operator's own checks name the bad field."""

from __future__ import annotations

import pytest
from eventfleet_operator import model


def parse(spec, name="demo"):
    return model.parse(name, "ns", spec)


def test_defaults():
    spec = parse({})
    assert spec.replicas == 3
    assert spec.image == model.DEFAULT_SERVER_IMAGE
    assert spec.token_ref == model.TokenRef(secret_name="demo-token", key="token", generated=True)
    assert spec.subscriptions == (("*",),)
    assert spec.storage.when_deleted == "Retain"


def test_full(full_spec):
    spec = parse(full_spec)
    assert spec.replicas == 5
    assert spec.token_ref == model.TokenRef("my-token", "secret", generated=False)
    assert spec.not_implemented == ()
    assert spec.aggregation.executor.instances == 3
    assert spec.service_monitor.labels == (("release", "prom"),)


@pytest.mark.parametrize(
    ("spec", "name", "field"),
    [
        ({}, "Demo", "metadata.name"),
        ({}, "9lives", "metadata.name"),
        ({}, "a.b", "metadata.name"),
        ({}, "x" * 53, "metadata.name"),
        ({"replicas": True}, "demo", "spec.replicas"),
        ({"replicas": 0}, "demo", "spec.replicas"),
        ({"replicas": "3"}, "demo", "spec.replicas"),
        ({"ports": {"eventer": 23013}}, "demo", "spec.ports"),
        ({"ports": {"bus": 23079}}, "demo", "spec.ports"),
        (
            {"aggregation": {"enabled": True, "schedule": "every day"}},
            "demo",
            "spec.aggregation.schedule",
        ),
        (
            {"aggregation": {"enabled": True, "schedule": "61 * * * * *"}},
            "demo",
            "spec.aggregation.schedule",
        ),
        (
            {"aggregation": {"enabled": True, "schedule": "@every soon"}},
            "demo",
            "spec.aggregation.schedule",
        ),
        (
            {"aggregation": {"enabled": True, "bucketSeconds": 600, "windowSeconds": 60}},
            "demo",
            "spec.aggregation.windowSeconds",
        ),
        ({"syncer": {"subscriptions": [["*", "a"]]}}, "demo", "spec.syncer.subscriptions[0]"),
        ({"storage": {"size": "big"}}, "demo", "spec.storage.size"),
        ({"resources": {"requests": {"cpu": "fast"}}}, "demo", "spec.resources.requests.cpu"),
        ({"token": {"secretRef": {"key": "k"}}}, "demo", "spec.token.secretRef.name"),
        ({"nodeSelector": {"a": 1}}, "demo", "spec.nodeSelector.a"),
        ({"storage": "1Gi"}, "demo", "spec.storage"),
    ],
)
def test_bad_specs_name_the_field(spec, name, field):
    with pytest.raises(model.SpecError) as err:
        parse(spec, name)
    assert err.value.field.startswith(field), str(err.value)


@pytest.mark.parametrize(
    "schedule",
    [
        "*/10 * * * *",
        "0 3 * * MON-FRI",
        "@hourly",
        "@every 1h30m",
        "0,30 8-18 * * *",
        "15 2 1 JAN *",
    ],
)
def test_good_cron(schedule):
    model.validate_cron(schedule, "f")


def test_disabled_aggregation_is_not_validated():
    # A half-written aggregation section must not break a fleet that does not use it.
    assert (
        parse({"aggregation": {"enabled": False, "schedule": "not yet"}}).aggregation.enabled
        is False
    )


def test_bus_is_enabled_by_default_and_implemented():
    assert parse({}).not_implemented == ()
    assert parse({}).enabled_protocols == ("bus",)
    assert parse({"protocols": {"bus": {"enabled": False}}}).enabled_protocols == ()
    spec = parse({"protocols": {"bus": {"enabled": True}}})
    assert spec.not_implemented == () and spec.enabled_protocols == ("bus",)
