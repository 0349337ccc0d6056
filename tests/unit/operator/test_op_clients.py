"""spec.clients: the hat-compatible mode, from the spec to a real replica's Eventer."""

from __future__ import annotations

import pytest
import yaml
from eventfleet_operator import builders, model
from eventfleet_server import config as server_config
from eventfleet_server.listener import Credentials
from eventfleet_server.main import Replica
from hat.drivers import net
from hat.event.eventer import client as hat_client


def fleet(spec):
    return model.parse("demo", "ns", spec, uid="u-1")


def test_off_by_default():
    spec = fleet({})
    assert spec.clients == model.ClientsSpec(allow_tokenless=False, tokenless_networks=())
    eventer = builders.replica_config(spec, peer_count=1, allow_empty_start=True)["eventer"]
    assert eventer["allow_tokenless_clients"] is False
    assert eventer["tokenless_client_networks"] == []


def test_maps_onto_the_replicas_eventer_settings_and_restarts_them():
    spec = fleet({"clients": {"allowTokenless": True, "tokenlessNetworks": ["10.1.0.0/16"]}})
    config = builders.replica_config(spec, peer_count=1, allow_empty_start=True)
    assert config["eventer"]["allow_tokenless_clients"] is True
    assert config["eventer"]["tokenless_client_networks"] == ["10.1.0.0/16"]
    # Read by the Eventer at start only: part of the config hash (a managed rollout).
    off = fleet({})
    assert builders.config_hash(spec, config) != builders.config_hash(
        off, builders.replica_config(off, peer_count=1, allow_empty_start=True)
    )


@pytest.mark.parametrize(
    ("clients", "field"),
    [
        ({"allowTokenless": True, "tokenlessNetworks": ["10.1.0.0/33"]}, "[0]"),
        ({"allowTokenless": True, "tokenlessNetworks": ["::1", "gateway.local"]}, "[1]"),
        ({"allowTokenless": True, "tokenlessNetworks": [17]}, "[0]"),
        ({"tokenlessNetworks": ["10.0.0.0/8"]}, ""),
        ({"allowTokenless": "yes"}, "allowTokenless"),
    ],
)
def test_bad_clients_name_the_field(clients, field):
    with pytest.raises(model.SpecError) as e:
        fleet({"clients": clients})
    expected = "spec.clients." + (
        field if field == "allowTokenless" else f"tokenlessNetworks{field}"
    )
    assert e.value.field == expected, e.value


async def _replica(tmp_path, clients) -> Replica:
    """A real replica running the operator's configuration, localised to loopback."""
    conf = builders.replica_config(
        fleet({"clients": clients}), peer_count=0, allow_empty_start=True
    )
    (tmp_path / "token").write_text("client-token\n")
    (tmp_path / "peer-token").write_text("peer-token\n")
    conf.update(
        host="127.0.0.1",
        data_dir=str(tmp_path / "data"),
        token_file=str(tmp_path / "token"),
        peer_token_file=str(tmp_path / "peer-token"),
        server_id=1,
    )
    for section in ("eventer", "syncer", "http"):
        conf[section]["port"] = 0
    conf["bus"]["enabled"] = False
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(conf))
    loaded = server_config.load(path, environ={})
    replica = Replica(loaded, Credentials(*server_config.read_credentials(loaded, environ={})))
    await replica.start()
    return replica


@pytest.mark.parametrize(
    ("clients", "admitted"),
    [
        ({}, False),
        ({"allowTokenless": True}, True),
        ({"allowTokenless": True, "tokenlessNetworks": ["127.0.0.0/8"]}, True),
        ({"allowTokenless": True, "tokenlessNetworks": ["10.9.0.0/16"]}, False),
    ],
)
async def test_a_tokenless_hat_client_against_the_operators_config(tmp_path, clients, admitted):
    replica = await _replica(tmp_path, clients)
    try:
        addr = net.TcpAddress("127.0.0.1", replica.eventer.port)
        if admitted:
            client = await hat_client.connect(addr, "hat-gateway")
            await client.async_close()
        else:
            with pytest.raises(hat_client.EventerInitError, match="client token required"):
                await hat_client.connect(addr, "hat-gateway")
        # A wrong token is refused in every mode.
        with pytest.raises(hat_client.EventerInitError, match="invalid client token"):
            await hat_client.connect(addr, "c", client_token="peer-token")
    finally:
        await replica.stop()
