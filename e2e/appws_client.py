"""A replicator client written for the tests from the Replication seed document and the
AppWebsocket login description, independent of the project's replication package (it
does not import it): JSON text frames ``{mt, api, src}``, AppChallenge/AppLogin with
the SHA-256 digest, ReplicateStart/Next and the live Add/Update/Del messages."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import aiohttp


def login_digest(app, domain, sip, guid, dn, challenge, password, info=None) -> str:
    parts = [app, domain, sip, guid, dn]
    if info is not None:
        parts.append(info)
    parts += [challenge, password]
    return hashlib.sha256(":".join(parts).encode()).hexdigest()


class AppWsClient:
    def __init__(self, url: str):
        self.url = url
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.src = 0
        self.other: list[dict[str, Any]] = []

    async def __aenter__(self) -> AppWsClient:
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(self.url, max_msg_size=0)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.ws is not None:
            await self.ws.close()
        await self.http.close()

    async def send(self, msg: dict[str, Any] | str) -> None:
        await self.ws.send_str(msg if isinstance(msg, str) else json.dumps(msg))

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        frame = await self.ws.receive(timeout=timeout)
        if frame.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"{frame.type.name} frame: {frame.data!r}")
        return json.loads(frame.data)

    async def request(self, msg: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """Send with a fresh src and return the answer carrying that src (others are
        collected in `self.other`)."""
        self.src += 1
        src = f"t{self.src}"
        await self.send({**msg, "src": src})
        while True:
            answer = await self.recv(timeout)
            if answer.get("src") == src:
                return answer
            self.other.append(answer)

    async def challenge(self) -> str:
        return (await self.request({"mt": "AppChallenge"}))["challenge"]

    def login_message(self, challenge: str, password: str, *, sip="alice", info=None) -> dict:
        fields = {"app": "test", "domain": "example.com", "sip": sip, "guid": "g1", "dn": "Alice"}
        if info is not None:
            fields["info"] = info
        digest = login_digest(
            fields["app"],
            fields["domain"],
            sip,
            fields["guid"],
            fields["dn"],
            challenge,
            password,
            info,
        )
        return {"mt": "AppLogin", **fields, "digest": digest}

    async def login(self, password: str, **kw) -> dict[str, Any]:
        self.other = []
        challenge = await self.challenge()
        return await self.request(self.login_message(challenge, password, **kw))

    async def start(self, table: str, *, guid="", usn=0, add=True, delete=True, columns=None):
        return await self.request(
            {
                "api": table,
                "mt": "ReplicateStart",
                "guid": guid,
                "usn": usn,
                "add": add,
                "del": delete,
                "columns": columns if columns is not None else {},
            }
        )

    async def initial_pass(self, table: str) -> tuple[dict[str, dict], int, list[dict]]:
        """ReplicateNext until the end marker: (rows by key 'id', end usn, other msgs)."""
        rows: dict[str, dict] = {}
        extra: list[dict] = []
        while True:
            answer = await self.request({"api": table, "mt": "ReplicateNext"})
            assert "error" not in answer, answer
            if "columns" not in answer:
                extra.extend(self.other)
                self.other = []
                return rows, answer["usn"], extra
            rows[str(answer["columns"]["id"])] = answer["columns"]

    async def live(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        out = list(self.other)
        self.other = []
        while len(out) < count:
            out.append(await self.recv(timeout))
        return out

    async def quiet(self, seconds: float = 0.3) -> list[dict[str, Any]]:
        """Whatever arrives within `seconds` (expected: nothing)."""
        out = list(self.other)
        self.other = []
        try:
            while True:
                out.append(await self.recv(seconds))
        except TimeoutError:
            return out
