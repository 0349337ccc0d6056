"""The real hat-gateway 0.6.48 (PyPI) as an Eventer client of a replica with a client
token configured: Hat components have no token setting, so it is refused by default and
admitted in the hat-compatible mode (`eventer.allow_tokenless_clients`, here limited to
loopback). Its Modbus TCP master device is enabled by an event and reports its status
through the replica; no Modbus slave listens, so the status is about connecting."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys

import pytest
import yaml
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import EventPayloadJson, QueryLatestParams, RegisterEvent

from tests.conftest import running_replica

DEVICE = ("gateway", "modbus_master", "m1")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gateway_conf(eventer_port: int) -> dict:
    return {
        "type": "gateway",
        "name": "gw",
        "log": {"version": 1},
        "event_server": {"eventer_server": {"host": "127.0.0.1", "port": eventer_port}},
        "devices": [
            {
                "module": "hat.gateway.devices.modbus.master",
                "name": "m1",
                "connection": {
                    "modbus_type": "TCP",
                    "transport": {"type": "TCP", "host": "127.0.0.1", "port": closed_port()},
                    "connect_timeout": 1,
                    "connect_delay": 0.2,
                    "request_timeout": 1,
                    "request_delay": 0,
                    "request_retry_immediate_count": 0,
                    "request_retry_delayed_count": 0,
                    "request_retry_delay": 0.1,
                },
                "remote_devices": [],
            }
        ],
    }


@contextlib.asynccontextmanager
async def gateway(tmp_path, eventer_port: int):
    conf = tmp_path / "gateway.yaml"
    conf.write_text(yaml.safe_dump(gateway_conf(eventer_port)))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hat.gateway",
        "--conf",
        str(conf),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def test_gateway_refused_without_hat_compatible_mode(tmp_path):
    async with running_replica(tmp_path / "r", token="s3cret") as replica:
        async with gateway(tmp_path, replica.eventer.port) as proc:
            # hat-gateway gives up (exits, status 0) when its init is refused.
            await asyncio.wait_for(proc.wait(), 30)
        assert replica.eventer.rejected.get("bad_token", 0) >= 1
        assert replica.eventer.connection_count == 0


async def test_gateway_in_hat_compatible_mode(tmp_path):
    eventer = {"allow_tokenless_clients": True, "tokenless_client_networks": ["127.0.0.1"]}
    async with running_replica(tmp_path / "r", token="s3cret", eventer=eventer) as replica:
        async with gateway(tmp_path, replica.eventer.port) as proc:
            async with asyncio.timeout(30):
                while replica.eventer.connection_count < 1:
                    assert proc.returncode is None, (await proc.stdout.read()).decode()[-2000:]
                    await asyncio.sleep(0.1)
            me = await connect("127.0.0.1", replica.eventer.port, "operator", client_token="s3cret")
            try:
                await me.register(
                    [RegisterEvent((*DEVICE, "system", "enable"), None, EventPayloadJson("true"))],
                    with_response=True,
                )
                status = None
                async with asyncio.timeout(30):
                    while status is None:
                        result = await me.query(
                            QueryLatestParams(event_types=[(*DEVICE, "gateway", "status")])
                        )
                        status = result.events[0] if result.events else None
                        await asyncio.sleep(0.2)
                assert status.id.server == replica.engine.server_id
                states = ("CONNECTING", "CONNECTED", "DISCONNECTED")
                assert json.loads(status.payload.data) in states
            finally:
                await me.close()
            assert proc.returncode is None
        assert replica.eventer.rejected.get("bad_token", 0) == 0


pytestmark = pytest.mark.timeout(120)
