"""The echo plug-in: its factory and the `ProtocolServer` (a TCP line listener)."""

from __future__ import annotations

import asyncio
import json

from eventfleet_server.common.model import EventPayloadJson, RegisterEvent
from eventfleet_server.plugin import ProtocolContext, ProtocolServer

from tests.echo_protocol.config import EchoConfig

CONFIG = EchoConfig


class EchoServer(ProtocolServer):
    """One TCP listener; each connection's lines go through the engine and back."""

    name = "echo"

    def __init__(self, config: EchoConfig, ctx: ProtocolContext):
        self._config = config
        self._ctx = ctx
        # Connections are critical=False tasks of the replica's Tasks: a client that
        # goes away ends its task, and `stop` cancels whatever still runs.
        self._tasks = ctx.tasks.child("echo")
        self._server: asyncio.Server | None = None
        self._connections = 0

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._accept, self._ctx.host, self._config.port
            )
        except OSError as e:
            raise OSError(f"echo cannot listen on {self._ctx.host}:{self._config.port}: {e}") from e

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._tasks.close()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    @property
    def connection_count(self) -> int:
        return self._connections

    @property
    def rejected(self) -> dict[str, int]:
        return {}  # it refuses nothing

    def health(self) -> str | None:
        return None

    def describe(self) -> dict:
        return {"port": self.port if self._server else None}

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        self._tasks.spawn(f"client:{peer}", self._serve(reader, writer), critical=False)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            name = "anonymous"
            while line := await reader.readline():
                text = line.decode("utf-8", "replace").rstrip("\n")
                if text.startswith("name "):
                    name = text[5:] or name
                    continue
                event_type = ("echo", name)
                [event] = await self._ctx.engine.register_wait(
                    [RegisterEvent(event_type, None, EventPayloadJson(json.dumps(text)))]
                )
                writer.write(f"{event.id.instance} {text}\n".encode())
                await writer.drain()
        finally:
            self._connections -= 1
            writer.close()


def create(config: EchoConfig, ctx: ProtocolContext) -> EchoServer:
    """The echo listener of `ctx.engine` on `ctx.host`:`config.port`."""
    return EchoServer(config, ctx)
