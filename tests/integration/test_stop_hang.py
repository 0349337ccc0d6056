"""A replica's stop cannot hang: the Event BUS server stops while its clients come and
go, and the stop deadline holds even when the event loop is blocked.

Regression: a replica with the BUS on hung for good on SIGTERM in CI (its log ended at
``status operational -> stopping``; its own stop deadline never fired). The cause was
libzmq's connection monitor: a client that disconnected after the monitor's reading end
was closed blocked libzmq's I/O thread, and `disable_monitor` then blocked the event loop
holding the GIL. The scenario runs in a child process because a hang there holds the GIL
(neither pytest-timeout nor an asyncio timeout could end it); the parent gives it a
bounded time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCENARIO = textwrap.dedent(
    """
    import asyncio, faulthandler, sys
    import zmq, zmq.asyncio
    from eventfleet_server.bus.config import BusConfig
    from eventfleet_server.bus.server import BusServer, PublishResult
    from eventfleet_server.config import loader
    from eventfleet_server.config.typed import build
    from eventfleet_server.common.aiotasks import Tasks

    faulthandler.dump_traceback_later(20, exit=True)  # a hang prints where, then exits


    class Handler:  # the engine side is not what this test is about
        head = 0

        async def read(self, after, limit, subtrees):
            return after, []

        async def publish(self, pubs):
            return PublishResult(0, [])


    class DisconnectsDuringStop(Tasks):
        # Clients leave while the server's loops are being cancelled: the window in
        # which the old stop order had closed the monitors' reading ends already.
        def __init__(self, clients):
            super().__init__("bus")
            self.clients = clients

        async def close(self, timeout=None):
            await super().close(timeout)
            for client in self.clients:
                client.close(linger=0)
            await asyncio.sleep(0.2)  # libzmq reports the disconnects meanwhile


    async def trial():
        ctx = zmq.Context()
        clients = []
        tasks = DisconnectsDuringStop(clients)
        config = build(BusConfig, {**loader.defaults()["bus"], "enabled": True, "port": 0})
        server = BusServer(Handler(), "127.0.0.1", config, tasks=tasks)
        await server.start()
        for name, kind in (("snapshot", zmq.DEALER), ("publisher", zmq.SUB),
                           ("collector", zmq.DEALER)):
            for _ in range(5):
                sock = ctx.socket(kind)
                sock.connect(f"tcp://127.0.0.1:{server.ports[name]}")
                clients.append(sock)
        for _ in range(200):  # every connection seen by the monitors
            if sum(server.counters.connections.values()) == len(clients):
                break
            await asyncio.sleep(0.01)
        assert sum(server.counters.connections.values()) == len(clients), server.counters
        await server.stop()
        ctx.term()


    for _ in range(int(sys.argv[1])):
        asyncio.run(trial())
    print("stopped")
    """
)


def test_bus_stop_with_clients_disconnecting_does_not_hang():
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, "5"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr[-4000:]


BLOCKED_LOOP = textwrap.dedent(
    """
    import asyncio, time
    from eventfleet_server import main

    async def stop_that_blocks():
        main._arm_stop_deadline(asyncio.get_running_loop(), 1.0)
        time.sleep(60)  # a C call that never returns: no asyncio callback can run

    asyncio.run(stop_that_blocks())
    """
)


def test_stop_deadline_holds_when_the_event_loop_is_blocked():
    """The deadline's second line: a watchdog thread that needs neither the loop nor
    the GIL ends the process and prints where every thread was."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_LOOP], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Timeout" in done.stderr and "stop_that_blocks" in done.stderr, done.stderr[-2000:]


FINISHED_STOP = textwrap.dedent(
    """
    import asyncio, os, signal, sys, time
    from eventfleet_server import config, main

    conf = config.load(None, environ={}, overrides={
        "server_id": 1, "data_dir": sys.argv[1], "stop_deadline": 0.5,
        "eventer": {"port": 0}, "syncer": {"port": 0}, "http": {"port": 0},
        "bus": {"enabled": False},
    })

    async def replica():
        asyncio.get_running_loop().call_later(1.0, os.kill, os.getpid(), signal.SIGTERM)
        return await main.run(conf, None)

    code = asyncio.run(replica())
    time.sleep(0.5 + main._WATCHDOG_MARGIN + 1)  # past the watchdog, had it stayed armed
    print("alive", code)
    """
)


def test_a_finished_stop_disarms_the_watchdog(tmp_path):
    """A process that runs a replica and goes on (an embedding, a test) is not killed
    by the watchdog of a stop that completed."""
    done = subprocess.run(
        [sys.executable, "-c", FINISHED_STOP, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "alive 0", done.stderr[-3000:]
