"""The listener layer on a live replica: caps, pre-init size limit, log flood, fatal tasks."""

from __future__ import annotations

import asyncio
import logging

from eventfleet_server import config
from eventfleet_server.client.eventer import EventerInitError, connect
from eventfleet_server.common.model import RegisterEvent
from eventfleet_server.main import run

from tests.conftest import running_replica
from tests.unit.test_syncer_replicas import until

CAPS = {"eventer": {"admission": {"max_connections": 4, "max_connections_per_address": 3}}}


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closes the connection within 5 s without sending anything."""
    async with asyncio.timeout(5):
        try:
            return await reader.read(1) == b""
        except ConnectionError:
            return True


async def test_connection_caps_refuse_the_next_connection_and_spare_the_others(tmp_path):
    async with running_replica(tmp_path / "r", **CAPS) as replica:
        port = replica.eventer.port
        clients = [await connect("127.0.0.1", port, f"c{i}") for i in range(3)]
        try:
            # A 4th connection from the same address is refused before any init.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await _closed_by_server(reader)
            writer.close()
            assert replica.eventer.rejected == {"too_many_connections": 1}
            # The admitted clients are unaffected.
            for c in clients:
                res = await c.register([RegisterEvent(("cap",), None, None)], True)
                assert res is not None and len(res) == 1
            assert replica.eventer.connection_count == 3
        finally:
            for c in clients:
                await c.close()
        # Places are freed when clients leave.
        await until(lambda: replica.eventer.connection_count == 0, "condition")
        again = await connect("127.0.0.1", port, "again")
        await again.close()


async def test_total_cap_counts_sessions_and_idle_connections_take_no_session_place(tmp_path):
    caps = {
        "eventer": {
            "admission": {
                "max_connections": 2,
                "max_connections_per_address": 10,
                "max_pending": 4,
                "max_pending_per_address": 4,
            }
        }
    }
    async with running_replica(tmp_path / "r", **caps) as replica:
        port = replica.eventer.port
        # Idle connections that never init: they fill the pending budget only; the 5th
        # and 6th evict the oldest.
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(6)]
        await until(lambda: replica.eventer.rejected.get("evicted_before_init") == 2, "evicted")
        assert await _closed_by_server(idle[0][0]) and await _closed_by_server(idle[1][0])
        # Both session places are still there for clients that init.
        clients = [await connect("127.0.0.1", port, f"c{i}") for i in range(2)]
        try:
            # The total cap (2 < 10 per address) refuses the next one before any init.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await _closed_by_server(reader)
            writer.close()
            assert replica.eventer.rejected["too_many_connections"] == 1
        finally:
            for c in clients:
                await c.close()
        for _, w in idle:
            w.close()


async def test_a_large_frame_before_init_is_refused_without_reading_it(tmp_path):
    async with running_replica(tmp_path / "r") as replica:
        reader, writer = await asyncio.open_connection("127.0.0.1", replica.eventer.port)
        # Announce a 1 MiB message (above the 64 KiB pre-init limit) and send only a bit.
        writer.write(bytes([3]) + (1 << 20).to_bytes(3, "big") + b"x" * 1000)
        await writer.drain()
        assert await _closed_by_server(reader)
        writer.close()
        assert replica.eventer.rejected == {"message_too_large": 1}
        # After init the configured (larger) limit applies: a 200 KiB register works.
        client = await connect("127.0.0.1", replica.eventer.port, "big")
        try:
            from eventfleet_server.common.model import EventPayloadBinary

            payload = EventPayloadBinary("blob", b"\0" * (200 * 1024))
            res = await client.register([RegisterEvent(("big",), None, payload)], True)
            assert res is not None and len(res) == 1
        finally:
            await client.close()


async def test_a_refused_init_is_counted_and_answered(tmp_path):
    async with running_replica(tmp_path / "r", token=None) as replica:
        try:
            await connect("127.0.0.1", replica.eventer.port, "x", client_token="unexpected")
        except EventerInitError as e:
            assert "invalid client token" in str(e)
        else:
            raise AssertionError("a token sent to a token-less Eventer must be refused")
        assert replica.eventer.rejected == {"bad_token": 1}


async def test_a_connection_flood_is_logged_in_a_handful_of_lines(tmp_path, caplog):
    caps = {"eventer": {"admission": {"max_connections": 1, "max_connections_per_address": 1}}}
    async with running_replica(tmp_path / "r", **caps) as replica:
        port = replica.eventer.port
        keep = await connect("127.0.0.1", port, "keeper")
        try:
            with caplog.at_level(logging.INFO, logger="eventfleet_server"):
                for _ in range(1000):
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    assert await _closed_by_server(reader)
                    writer.close()
            assert replica.eventer.rejected["too_many_connections"] == 1000
            lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert 1 <= len(lines) <= 5, [r.getMessage() for r in lines]
        finally:
            await keep.close()


async def test_a_dead_background_task_stops_the_replica_with_its_name(tmp_path, caplog):
    conf = config.load(
        None,
        environ={},
        overrides={
            "data_dir": str(tmp_path / "r"),
            "eventer": {"port": 0},
            "syncer": {"port": 0},
            "http": {"port": 0},
        },
    )
    captured: dict = {}
    import eventfleet_server.main as main_module

    original = main_module.Replica

    class Spy(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            captured["replica"] = self

    main_module.Replica = Spy
    try:
        with caplog.at_level(logging.INFO):
            running = asyncio.get_running_loop().create_task(run(conf, None))
            await until(
                lambda: "replica" in captured and captured["replica"].protocols, "condition"
            )
            replica = captured["replica"]
            await until(lambda: "syncer" in replica.protocols, "condition")
            # Kill the engine's writer from outside, as a bug inside it would.
            replica.engine._writer_task.cancel()
            async with asyncio.timeout(30):
                code = await running
    finally:
        main_module.Replica = original
    assert code == 1
    assert "replica/engine/writer" in (replica.failure or "")
    assert any(
        "replica/engine/writer" in r.getMessage() and r.levelno >= logging.ERROR
        for r in caplog.records
    )
    assert replica.engine.status.value == "stopping"
