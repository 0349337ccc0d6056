"""The project's async Eventer client (used by the CLI, tests and the Spark job).

It lives outside the `eventer` protocol package on purpose: that package imports the
server side (engine, storage, aiosqlite), which a client process must not need.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

from eventfleet_server import chatter
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventType,
    QueryParams,
    QueryResult,
    RegisterEvent,
    Status,
)

_P = "HatEventer."

EventsCb = Callable[[list[Event]], None]


class EventerInitError(Exception):
    """The server refused the connection (its message is the error text)."""


class Client:
    """A connected, initialized Eventer client. Create it with `connect`."""

    def __init__(self, conn: chatter.Connection, status: Status, events_cb: EventsCb | None):
        self._conn = conn
        self.status = status
        self._events_cb = events_cb
        self._futures: dict[chatter.Conversation, asyncio.Future] = {}
        self._task = asyncio.get_running_loop().create_task(self._receive_loop())

    @property
    def is_closed(self) -> bool:
        return self._conn.is_closed

    async def register(
        self, events: Iterable[RegisterEvent], with_response: bool = False
    ) -> list[Event] | None:
        """Register; with a response, returns the created events or None on failure."""
        data = codec.repo.encode(
            _P + "MsgRegisterReq", [codec.register_event_to_sbs(e) for e in events]
        )
        conv = self._conn.send(_P + "MsgRegisterReq", data, last=not with_response)
        if not with_response:
            await self._conn.drain()
            return None
        return await self._wait(conv)

    async def query(self, params: QueryParams) -> QueryResult:
        data = codec.repo.encode(_P + "MsgQueryReq", codec.query_params_to_sbs(params))
        return await self._wait(self._conn.send(_P + "MsgQueryReq", data, last=False))

    async def close(self) -> None:
        self._conn.close()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        await self._conn.wait_closed()

    async def wait_closed(self) -> None:
        await self._conn.wait_closed()

    async def _wait(self, conv):
        if self._conn.is_closed:
            raise ConnectionError("eventer connection is closed")
        fut = asyncio.get_running_loop().create_future()
        self._futures[conv] = fut
        try:
            return await fut
        finally:
            self._futures.pop(conv, None)

    async def _receive_loop(self) -> None:
        try:
            while True:
                msg = await self._conn.receive()
                data = codec.repo.decode(msg.type, msg.data)
                if msg.type == _P + "MsgEventsNotify":
                    if self._events_cb:
                        self._events_cb([codec.event_from_sbs(e) for e in data])
                    if not msg.last:
                        self._conn.send(_P + "MsgEventsAck", b"", conv=msg.conv)
                elif msg.type == _P + "MsgStatusNotify":
                    self.status = codec.status_from_sbs(data)
                elif msg.type == _P + "MsgRegisterRes":
                    value = (
                        [codec.event_from_sbs(e) for e in data[1]] if data[0] == "events" else None
                    )
                    self._resolve(msg.conv, value)
                elif msg.type == _P + "MsgQueryRes":
                    self._resolve(msg.conv, codec.query_result_from_sbs(data))
                else:
                    raise chatter.FrameError(f"unexpected message {msg.type!r}")
        except (ConnectionError, chatter.FrameError):
            pass
        finally:
            self._conn.close()
            for fut in self._futures.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("eventer connection closed"))

    def _resolve(self, conv, value) -> None:
        fut = self._futures.get(conv)
        if fut is not None and not fut.done():
            fut.set_result(value)


async def connect(
    host: str,
    port: int,
    client_name: str,
    *,
    client_token: str | None = None,
    subscriptions: Iterable[EventType] = (),
    server_id: int | None = None,
    persisted: bool = False,
    events_cb: EventsCb | None = None,
    timeout: float = 10.0,
    ssl=None,
    server_hostname: str | None = None,
) -> Client:
    """Connect and initialize; raises `EventerInitError` if the server refuses.

    `ssl`: a client SSLContext (TLS); `server_hostname`: the name the replica's
    certificate must carry when `host` is not it (an address, a port-forward)."""
    conn = await asyncio.wait_for(
        chatter.connect(host, port, ssl=ssl, server_hostname=server_hostname), timeout
    )
    try:
        req = {
            "clientName": client_name,
            "clientToken": codec.opt(client_token),
            "subscriptions": [list(s) for s in subscriptions],
            "serverId": codec.opt(server_id),
            "persisted": persisted,
        }
        conv = conn.send(_P + "MsgInitReq", codec.repo.encode(_P + "MsgInitReq", req), last=False)
        msg = await asyncio.wait_for(conn.receive(), timeout)
        if msg.type != _P + "MsgInitRes" or msg.conv != conv:
            raise EventerInitError(f"unexpected answer to MsgInitReq: {msg.type}")
        kind, value = codec.repo.decode(msg.type, msg.data)
        if kind == "error":
            raise EventerInitError(value)
        return Client(conn, codec.status_from_sbs(value), events_cb)
    except BaseException:
        conn.close()
        raise
