"""spec.protocols.jetstream: parsed, validated, rendered into the replica config that the
replica's own configuration schema accepts."""

from __future__ import annotations

import pytest
from eventfleet_operator import builders, model
from eventfleet_server import config
from eventfleet_server.config.typed import build
from eventfleet_server.jetstream.config import JetstreamConfig


def render(protocols: dict) -> dict:
    spec = model.parse("fleet", "ns", {"protocols": protocols})
    return builders.replica_config(spec, peer_count=3, allow_empty_start=False)


def replica_accepts(rendered: dict, tmp_path) -> JetstreamConfig:
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(rendered))
    conf = config.load(path, environ={"EVENTFLEET_POD_NAME": "fleet-0"})
    return build(JetstreamConfig, conf["jetstream"])


def test_jetstream_is_on_by_default_and_the_replica_accepts_the_section(tmp_path):
    rendered = render({})
    assert rendered["jetstream"] == {"enabled": True, "path": "/jetstream", "type_prefix": []}
    js = replica_accepts(rendered, tmp_path)
    assert js.enabled and js.path == "/jetstream"


def test_jetstream_settings_are_rendered(tmp_path):
    rendered = render({"jetstream": {"enabled": False, "path": "/sync", "typePrefix": ["site"]}})
    assert rendered["jetstream"] == {"enabled": False, "path": "/sync", "type_prefix": ["site"]}
    js = replica_accepts(rendered, tmp_path)
    assert not js.enabled and js.type_prefix == ("site",)


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"path": "jetstream"}, "spec.protocols.jetstream.path"),
        ({"path": "/js/"}, "spec.protocols.jetstream.path"),
        ({"typePrefix": ["a", "*"]}, r"spec.protocols.jetstream.typePrefix\[1\]"),
        ({"enabled": "yes"}, "spec.protocols.jetstream.enabled"),
    ],
)
def test_bad_jetstream_settings_name_the_field(section, field):
    with pytest.raises(model.SpecError, match=field):
        render({"jetstream": section})
