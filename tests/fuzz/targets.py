"""Fuzz targets: every decoder that sees bytes from the network or text from an
operator, wrapped so that the only acceptable outcomes are a value or the decoder's own
documented error. Shared by the Hypothesis tests (bounded, in CI) and the atheris
driver (``scripts/fuzz``, long runs; docs/security.md records them)."""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import logging
import pathlib
import shutil
import struct
import tempfile
from types import SimpleNamespace

from eventfleet_server import config
from eventfleet_server.bus import wire as bus_wire
from eventfleet_server.chatter import connection as chatter_connection
from eventfleet_server.common import codec
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import (
    QueryLatestParams,
    QueryServerParams,
    QueryTimeseriesParams,
    RegisterEvent,
    check_register_event,
)
from eventfleet_server.common.sbsguard import SbsBoundsError, check_bounds
from eventfleet_server.common.sbsint import SbsIntError
from eventfleet_server.common.subscription import InvalidSubscriptionError, Subscription
from eventfleet_server.engine import Engine
from eventfleet_server.eventer.wire import (
    BadRequest,
    InvalidRegistration,
    RegisterLimits,
    decode_init_req,
    decode_query_req,
    decode_register,
)
from eventfleet_server.jetstream import wire as jetstream_wire
from eventfleet_server.jetstream.adapter import EngineBackend as JetstreamBackend
from eventfleet_server.jetstream.config import JetstreamConfig
from eventfleet_server.jetstream.scope import root_uuid
from eventfleet_server.jetstream.server import JetstreamServer
from eventfleet_server.jetstream.session import JetstreamProtocol
from eventfleet_server.listener import Rejections, RejectReason, TokenPolicy
from eventfleet_server.replication import wire as replication_wire
from eventfleet_server.replication.adapter import EngineBackend
from eventfleet_server.replication.config import ReplicationConfig
from eventfleet_server.replication.login import Credentials, FailedLogins, digest
from eventfleet_server.replication.session import PublisherSession
from eventfleet_server.storage import Storage
from eventfleet_server.syncer import wire as syncer_wire

# Inputs that got past the frame decoder, per target (the rest were refused as bad
# frames): scripts/fuzz reports it, so a run's case count says how deep it went.
REACHED: collections.Counter[str] = collections.Counter()


class _Transport:
    """Enough of a transport for `Connection` to read (nothing is ever written)."""

    def get_extra_info(self, name):
        return ("127.0.0.1", 1)

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def _read_frames(data: bytes) -> int:
    conn = chatter_connection.Connection(max_msg_size=64 * 1024, ping_delay=None)
    conn.connection_made(_Transport())
    # In two pieces: a frame split across reads takes the buffering path too.
    half = len(data) // 2
    conn.data_received(data[:half])
    conn.data_received(data[half:])
    conn.connection_lost(None)
    count = 0
    try:
        while True:
            await conn.receive()
            count += 1
    except (chatter_connection.FrameError, ConnectionError):
        return count


def chatter_frames(data: bytes) -> None:
    """Chatter framing: frames until the data ends; garbage → FrameError, end → closed."""
    asyncio.run(_read_frames(data))


def chatter_large_msg(data: bytes) -> None:
    """The hand parser of HatChatter.Msg bodies: its refusals are `SbsIntError` and
    `UnicodeDecodeError` (its docstring); any other ValueError is a bug."""
    try:
        chatter_connection.parse_msg(data)
    except (SbsIntError, UnicodeDecodeError):
        pass


def eventer_register(data: bytes) -> None:
    """MsgRegisterReq: the bounded, sliced decoder. The only refusal is
    `InvalidRegistration` (its `MalformedRequest` and `RequestRefused` included); any
    other exception — a bare ValueError too — fails the target. What it accepts must be
    events the shared rule accepts."""
    limits = RegisterLimits(max_events=1000, max_payload_bytes=4096)
    try:
        events = asyncio.run(decode_register(data, limits))
    except InvalidRegistration:
        return
    for i, event in enumerate(events):
        assert isinstance(event, RegisterEvent)
        check_register_event(i, event)  # raises: accepted what the rule refuses


def eventer_init(data: bytes) -> None:
    """MsgInitReq as the Eventer server reads it (`eventer.requests`: bounds, the C
    decoder), then the fields and the subscription it takes from it. The only refusals:
    `BadRequest` (the init error "does not decode") and an invalid subscription (its own
    init error); any other exception fails the target."""
    try:
        req = decode_init_req(data)
    except BadRequest:
        return
    assert isinstance(req["clientName"], str)
    assert req["clientToken"][0] in ("none", "value")
    assert req["serverId"][0] in ("none", "value")
    assert isinstance(req["persisted"], bool)
    try:
        Subscription(req["subscriptions"])
    except InvalidSubscriptionError:
        return


def eventer_query(data: bytes) -> None:
    """MsgQueryReq as the Eventer server reads it (`eventer.requests`: bounds, decode,
    model conversion, the checks). The only refusal is `BadRequest` (``bad_query``)."""
    try:
        params = decode_query_req(data)
    except BadRequest:
        return
    assert isinstance(params, QueryLatestParams | QueryTimeseriesParams | QueryServerParams)


def syncer_init(data: bytes) -> None:
    try:
        syncer_wire.decode_init_req(data)
    except syncer_wire.ProtocolError:
        pass


def syncer_events(data: bytes) -> None:
    """MsgEvents from an authenticated peer (no bounds walk: see docs/security.md)."""
    try:
        check_bounds(codec.repo, syncer_wire.EVENTS, data)
    except SbsBoundsError:
        return
    try:
        syncer_wire.decode_events(data, 2)
    except syncer_wire.ProtocolError:
        pass


_CONFIG_DIR = pathlib.Path(tempfile.mkdtemp(prefix="eventfleet-fuzz-"))
# Made at import (every test run and fuzz session): removed at exit, not left in /tmp.
atexit.register(shutil.rmtree, _CONFIG_DIR, ignore_errors=True)


def config_yaml(data: bytes) -> None:
    """A configuration file: valid, or ConfigError naming the problem."""
    path = _CONFIG_DIR / "conf.yaml"
    path.write_bytes(data)
    try:
        conf = config.load(path, environ={})
    except config.ConfigError:
        return
    config.build(config.ReplicaConfig, conf)


# -- Event BUS (ZeroMQ multipart messages) ----------------------------------------------------


def split_frames(data: bytes) -> list[bytes]:
    """A multipart message from flat bytes: a length byte, then that many bytes, per frame
    (a short last frame takes what is left). Any bytes make some message, so the fuzzer
    reaches every frame count and frame content."""
    frames = []
    pos = 0
    while pos < len(data):
        n = data[pos]
        frames.append(data[pos + 1 : pos + 1 + n])
        pos += 1 + n
    return frames


def join_frames(frames: list[bytes]) -> bytes:
    """The inverse of `split_frames` (frames of at most 255 bytes)."""
    return b"".join(bytes((len(f),)) + f for f in frames)


def bus_int(data: bytes) -> None:
    """A sequence frame in either encoding; a decoded value re-encodes to itself."""
    try:
        value = bus_wire.decode_int(data)
    except bus_wire.WireError as e:
        assert e.reason == "bad_message"
        return
    assert 0 <= value <= bus_wire.MAX_SEQUENCE
    for encoding in bus_wire.IntegerEncoding:
        assert bus_wire.decode_int(bus_wire.encode_int(value, encoding)) == value


def bus_syncstart(data: bytes) -> None:
    """SYNCSTART on the snapshot socket, with and without the command frame in front."""
    frames = split_frames(data)
    for message in (frames, [bus_wire.SYNCSTART, *frames]):
        try:
            start = bus_wire.parse_syncstart(message)
        except bus_wire.WireError:
            continue
        assert start.subtrees_frame == message[1]
        assert all(s.startswith("/") for s in start.subtrees)
        assert 0 <= start.sequence <= bus_wire.MAX_SEQUENCE


def bus_pub(data: bytes) -> None:
    """A PUB (six frames, or seven with a leading empty delimiter)."""
    try:
        pub = bus_wire.parse_pub(split_frames(data))
    except bus_wire.WireError:
        return
    # The topic <-> type mapping is one-to-one: what was accepted maps back to itself.
    assert bus_wire.type_to_topic(pub.event_type) == pub.topic
    if pub.source_timestamp is not None:
        assert 0 <= pub.source_timestamp.us < 1_000_000


# -- websocket protocols (JSON text frames) ----------------------------------------------------


def _text(data: bytes) -> str:
    # aiohttp hands a TEXT frame over as str (invalid UTF-8 never reaches the decoder);
    # lone surrogates still can, through JSON escapes such as "\ud800".
    return data.decode("utf-8", "replace")


# Rejections are counted as in a server, their log lines dropped (thousands per second).
_QUIET = logging.getLogger("tests.fuzz.rejections")
_QUIET.disabled = True


class _Sent(list):
    def __call__(self, msg) -> None:
        if isinstance(msg, str):  # a frame joined from a stored row: it must be one
            replication_wire.decode(msg)
            self.append(msg)
            return
        self.append(replication_wire.encode(msg))  # a reply must be encodable


def _replication_frame(data: bytes) -> dict | None:
    """The fuzzer's bytes as an AppWebsocket frame; None when the frame decoder refuses
    them (its own refusal: nothing for a session to see)."""
    try:
        return replication_wire.decode(_text(data))
    except replication_wire.FrameError:
        return None


def _publisher_session(backend, sent: _Sent) -> tuple[PublisherSession, Rejections]:
    """A publisher session as the server makes one (user ``user``, password ``secret``)
    on `backend`, answering into `sent`, and its rejection counts."""
    rejections = Rejections("fuzz", logger=_QUIET)
    session = PublisherSession(
        backend,
        credentials=Credentials({"user": "secret"}),
        failed_logins=FailedLogins(1000, 60.0),
        challenge_ttl=60.0,
        peer="127.0.0.1",
        send=sent,
        rejections=rejections,
    )
    return session, rejections


def replication_frame(data: bytes) -> None:
    """An AppWebsocket frame as a peer that has not logged in sends it: the frame decoder,
    then the session (challenge issued first, so AppLogin reaches the digest check).
    Every refusal is a reply and a counted rejection, never an exception."""
    msg = _replication_frame(data)
    if msg is None:
        return
    REACHED["replication_frame"] += 1
    sent = _Sent()
    # The backend is never reached before login.
    session, rejections = _publisher_session(SimpleNamespace(tables={}, table_configs={}), sent)
    session.handle({"mt": "AppChallenge"})
    session.handle(msg)
    assert len(sent) == 2  # the challenge, and one answer to the message
    assert not session.logged_in  # nobody knows the challenge
    # Anything but another AppChallenge is refused before login, and counted.
    assert sum(rejections.counts.values()) == (msg["mt"] != "AppChallenge")


# The tables a logged-in replicator reaches: one with a column list (some updatable, adds
# and deletes granted), one open to any column with adds and deletes refused.
REPLICATION_TABLES = {
    "items": {
        "key": "id",
        "columns": {"id": {}, "name": {"update": True}, "price": {"update": False}},
        "add": True,
        "delete": True,
    },
    "free": {"key": "k", "add": False, "delete": False},
}


class _Store:
    """A real store and engine on a private event loop, in a temp dir."""

    def __init__(self, prefix: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.fatal: list[str] = []  # the engine's writer stopped: a failure of the target
        self.tasks = Tasks("fuzz", self.fatal.append)
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
        self.storage = self.loop.run_until_complete(
            Storage.open(self.dir / "e.sqlite", synchronous="OFF")
        )
        self.engine = Engine(self.storage, 1, tasks=self.tasks)
        self.loop.run_until_complete(self.engine.start())
        self.engine.set_operational()

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.stop())
        self.loop.run_until_complete(self.storage.close())
        self.loop.run_until_complete(self.tasks.close(5.0))
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Replica(_Store):
    """A real store, engine and replication backend (EngineBackend) on a private event
    loop, in a temp dir; rebuilt once the fuzzer's writes make it large (bounded time per
    input: each session's ReplicateStart walks every row)."""

    MAX_SEQ = 2000

    def __init__(self) -> None:
        super().__init__("eventfleet-fuzz-replica-")
        config = ReplicationConfig.from_mapping(
            {"tables": [{"name": n, **t} for n, t in REPLICATION_TABLES.items()]}
        )
        self.backend = EngineBackend(self.engine, config)
        self.loop.run_until_complete(self._fill())

    async def _fill(self) -> None:
        await self.backend.start()
        # Rows for the pass, updates and deletes to find (one is a tombstone already).
        self.backend.write_many(
            "items",
            [(str(i), {"id": i, "name": f"n{i}", "price": i * 10}) for i in range(1, 4)],
        )
        self.backend.write_many("free", [("a", {"k": "a", "v": 1}), ("b", {"k": "b"})])
        self.backend.write("items", "3", None)
        await self.engine.flush()

    def close(self) -> None:
        self.backend.stop()
        super().close()


_replica: _Replica | None = None


def close_replica() -> None:
    """Close the replica behind ``replication_logged_in``, if one was made: its store's
    worker threads are not daemons, so a process that leaves it open never exits."""
    global _replica
    if _replica is not None:
        _replica.close()
        _replica = None


def _replica_now() -> _Replica:
    global _replica
    if _replica is not None and _replica.backend.last_seq() > _Replica.MAX_SEQ:
        _replica.close()
        _replica = None
    if _replica is None:
        _replica = _Replica()
    return _replica


def _logged_in_session(replica: _Replica, sent: _Sent) -> tuple[PublisherSession, Rejections]:
    """A publisher session that logged in as the server checks it (a fresh challenge and
    its digest) and started both tables: ``items`` read to its end marker (live), ``free``
    still in its initial pass; and its rejection counts."""
    session, rejections = _publisher_session(replica.backend, sent)
    session.handle({"mt": "AppChallenge", "src": 1})
    fields = {"app": "fuzz", "domain": "d", "sip": "user", "guid": "g", "dn": "n"}
    challenge = sent[-1]
    session.handle(
        {
            "mt": "AppLogin",
            **fields,
            "digest": digest(fields, replication_wire.decode(challenge)["challenge"], "secret"),
        }
    )
    assert session.logged_in, sent[-1]
    session.handle({"mt": "ReplicateStart", "api": "items", "add": True, "del": True})
    session.handle({"mt": "ReplicateStart", "api": "free", "columns": {"k": {}, "v": {}}})
    while session.describe()["tables"]["items"] == "pass":
        session.handle({"mt": "ReplicateNext", "api": "items"})
    assert sum(rejections.counts.values()) == 0, rejections.counts
    return session, rejections


async def _handle_on_the_loop(replica: _Replica, session: PublisherSession, msg: dict) -> None:
    # As the server does: on the loop (the engine registers there), the session listening
    # to the replica's row changes.
    unlisten = replica.backend.add_change_listener(session.on_changes)
    try:
        session.handle(msg)
        await replica.engine.flush()  # the writes commit; their changes reach on_changes
    finally:
        unlisten()


def replication_logged_in(data: bytes) -> None:
    """An AppWebsocket frame from a replicator that has logged in (real challenge and
    digest) and started the tables of a real replica (store, engine, EngineBackend): the
    frame decoder, then the session's ReplicateStart/Next/Add/Update/Del handling and the
    writes it registers, committed, with the row changes fanned back to the session.
    The only acceptable refusal is the protocol's: an error reply and one counted
    rejection for each; any exception fails the target."""
    msg = _replication_frame(data)
    if msg is None:
        return
    REACHED["replication_logged_in"] += 1
    replica = _replica_now()
    sent = _Sent()
    session, rejections = _logged_in_session(replica, sent)
    before = len(sent)
    replica.loop.run_until_complete(_handle_on_the_loop(replica, session, msg))
    assert session.logged_in and not replica.fatal, replica.fatal
    answers = [replication_wire.decode(m) for m in sent[before:]]
    errors = sum(1 for m in answers if "error" in m)
    assert sum(rejections.counts.values()) == errors, (rejections.counts, answers)


class _Outlet:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, messages: list[dict]) -> None:
        jetstream_wire.encode(messages)  # a reply must be encodable
        self.sent.extend(messages)

    def close(self, code: int, reason: str) -> None:
        pass


def jetstream_frame(data: bytes) -> None:
    """A Jetstream frame as the first message of a connection: the frame decoder, each
    message's index, and SessionCreate with its token check (the unauthenticated surface)."""
    try:
        messages = jetstream_wire.decode(_text(data))
    except jetstream_wire.WireError:
        return
    REACHED["jetstream_frame"] += 1
    for m in messages:
        try:
            jetstream_wire.index_of(m)
        except jetstream_wire.WireError:
            pass
        jetstream_wire.describe(m)
    first = messages[0]
    if first["type"] != "SessionCreate":
        return
    server = SimpleNamespace(_tokens=TokenPolicy.of("secret"))
    rejections = Rejections("fuzz", logger=_QUIET)
    protocol = JetstreamProtocol(
        None,  # not reached by SessionCreate
        authenticate=lambda presented: JetstreamServer._authenticate(server, presented),
        reject=lambda reason, detail: rejections.reject(RejectReason(reason), detail),
        scope_pattern=".*",
        max_fragments=100,
        resend_buffer=100,
        session_expiry=60.0,
    )
    outlet = _Outlet()
    session = protocol.create_session(first, outlet)
    if session is not None:  # only with the right token
        assert first["params"]["token"] == "secret" and outlet.sent[0]["sessionToken"]
    else:  # a denial, answered and counted
        assert sum(rejections.counts.values()) == 1
        assert outlet.sent[0]["type"] == "SessionCreateReply" and "error" in outlet.sent[0]


# -- Jetstream past the handshake ---------------------------------------------------------------

# The replica's default classes (the demo's list) plus every other property kind the
# server checks: a number, any JSON, a collection of primitives and a single reference.
JETSTREAM_CLASSES = {
    "List": {"title": "string", "items": ["Item"], "pinned": "Item"},
    "Item": {
        "text": "string",
        "done": "boolean",
        "created": "date",
        "n": "number",
        "extra": "any",
        "tags": ["string"],
    },
}
JETSTREAM_SCOPE = "s"


def _strict_json(text: str):
    def refuse(constant: str):
        raise AssertionError(f"{constant} in a frame sent to a client (not JSON)")

    return json.loads(text, parse_constant=refuse)


class _Client:
    """The Outlet of one client session: every frame must be what a websocket text frame
    can carry (UTF-8) and what a browser's JSON.parse reads back."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.closed: tuple[int, str] | None = None

    def send(self, messages: list[dict]) -> None:
        text = jetstream_wire.encode(messages)
        text.encode("utf-8")  # aiohttp's send_str, and the direct write, encode strictly
        _strict_json(text)
        self.sent.extend(messages)

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


class _JetstreamReplica(_Store):
    """A real store and engine with the replica's Jetstream stack on top (the engine
    backend and the protocol, configured from the replica's defaults), a scope with a
    list of two items in it, and an observer session that fetched the scope, so every
    accepted sync is fanned out to another client. Rebuilt after `MAX_SYNCS` stored syncs
    (bounded time per input: a fetch loads the scope's latest events)."""

    MAX_SYNCS = 500

    def __init__(self) -> None:
        super().__init__("eventfleet-fuzz-jetstream-")
        defaults = config.load(None, environ={})["jetstream"]
        self.config = config.build(JetstreamConfig, {**defaults, "classes": JETSTREAM_CLASSES})
        self.rejections = Rejections("fuzz", logger=_QUIET)
        self.backend = JetstreamBackend(
            self.engine, self.config.type_prefix, self.config.model_schema()
        )
        server = SimpleNamespace(_tokens=TokenPolicy.of("secret"))
        self.protocol = JetstreamProtocol(
            self.backend,
            authenticate=lambda presented: JetstreamServer._authenticate(server, presented),
            reject=lambda reason, detail: self.rejections.reject(RejectReason(reason), detail),
            scope_pattern=self.config.scope_pattern,
            max_fragments=self.config.max_fragments,
            resend_buffer=self.config.resend_buffer,
            session_expiry=self.config.session_expiry,
        )
        self.backend.start(self.protocol.broadcast)
        self.observer = _Client()
        self.observer_session = self.loop.run_until_complete(self._fill())

    async def _fill(self):
        session = self.session(self.observer)
        fetch = {"type": "ScopeFetch", "index": 1, "name": JETSTREAM_SCOPE}
        await self.protocol.handle(session, fetch)
        root = self.observer.sent[-1]["rootUUID"]
        await self.protocol.handle(
            session,
            {
                "type": "ScopeSync",
                "index": 2,
                "scopeIndex": 0,
                "fragments": [
                    {"type": "add", "clsName": "Item", "uuid": "i1", "properties": {"text": "a"}},
                    {"type": "add", "clsName": "Item", "uuid": "i2", "properties": {"n": 2}},
                    {
                        "type": "change",
                        "clsName": "List",
                        "uuid": root,
                        "properties": {"title": "t", "items": ["i1", "i2"], "pinned": "i1"},
                    },
                ],
            },
        )
        await self.engine.flush()
        assert self.observer.sent[-1]["fragmentReplies"] == [{}, {}, {}], self.observer.sent[-1]
        assert not self.rejections.counts, self.rejections.counts
        return session

    def session(self, client: _Client):
        session = self.protocol.create_session(
            {"type": "SessionCreate", "version": "0.0.1", "params": {"token": "secret"}}, client
        )
        assert session is not None, client.sent
        return session

    def close(self) -> None:
        self.protocol.close_all()
        self.backend.stop()
        super().close()


_jetstream: _JetstreamReplica | None = None


def _jetstream_now() -> _JetstreamReplica:
    global _jetstream
    if _jetstream is not None and _jetstream.protocol.syncs_applied > _JetstreamReplica.MAX_SYNCS:
        _jetstream.close()
        _jetstream = None
    if _jetstream is None:
        _jetstream = _JetstreamReplica()
    return _jetstream


def _index(message: dict) -> int | None:
    try:
        return jetstream_wire.index_of(message)
    except jetstream_wire.WireError:
        return None


async def _handle_checked(js: _JetstreamReplica, session, client: _Client, message: dict) -> None:
    """One client message, and what the protocol promises for it: a reply to every
    ScopeFetch and ScopeSync (an error in it counted as one rejection), a counted
    rejection for anything it cannot use, nothing for a resent index."""
    rejected = sum(js.rejections.counts.values())
    sent = len(client.sent)
    seen = session.client_index
    await js.protocol.handle(session, message)
    await js.engine.flush()  # accepted writes commit and fan out to the observer
    new = client.sent[sent:]
    counted = sum(js.rejections.counts.values()) - rejected
    kind, index = message["type"], _index(message)
    if index is None:
        assert counted == 1 and not new, (counted, new)
        return
    if index != 0 and index <= seen:
        assert counted == 0 and not new, (counted, new)  # a resend: dropped
        return
    if kind == "Ping":
        ack = message.get("ack")
        bad = isinstance(ack, bool) or not isinstance(ack, int) or ack < 0
        assert counted == bad, (counted, ack)
        return
    if kind not in ("ScopeFetch", "ScopeSync"):
        assert counted == 1 and not new, (counted, new)
        return
    replies = [m for m in new if m["type"] == kind + "Reply"]
    assert len(replies) == 1 and replies[0]["replyTo"] == index, new
    reply = replies[0]
    if kind == "ScopeFetch":
        if "error" in reply:  # the one refusal; "scope-unavailable" is a store failure
            assert reply["error"]["type"] == "invalid-scope-name", reply
            assert counted == 1, counted
        else:
            assert counted == 0 and new[-1]["type"] == "ScopeState", new
        return
    errors = [r["error"] for r in reply["fragmentReplies"] if "error" in r]
    # "could-not-apply-sync-message": the store refused what the checks accepted.
    assert all(e["type"] != "could-not-apply-sync-message" for e in errors), errors
    fragments = message.get("fragments")
    # An empty sync of a scope never fetched is refused with nothing to carry the error.
    empty_unknown = fragments == [] and not _fetched(js, session, message.get("scopeIndex"))
    refused = bool(errors) or not isinstance(fragments, list) or empty_unknown
    assert counted == refused, (counted, errors)


def _fetched(js: _JetstreamReplica, session, scope_index) -> bool:
    if isinstance(scope_index, bool) or not isinstance(scope_index, int):
        return False
    if not 0 <= scope_index < len(session.scopes) or session.scopes[scope_index] is None:
        return False
    return js.backend.scope(session.scopes[scope_index]) is not None


async def _check_scopes_match_the_store(js: _JetstreamReplica, session) -> None:
    """Every scope the session fetched holds what a fresh load from the store holds: the
    in-memory models (checked against by the next sync) never drift from what was stored."""
    fresh = JetstreamBackend(js.engine, js.config.type_prefix, js.config.model_schema())
    for name in {n for n in session.scopes if n is not None}:
        cached = js.backend.scope(name)
        loaded = await fresh.open_scope(name)
        assert {u: (m.cls_name, m.properties) for u, m in cached.models.items()} == {
            u: (m.cls_name, m.properties) for u, m in loaded.models.items()
        }, name
        # Every reference names a model as it is stored (uuids are kept lower-case):
        # one the checks resolved but a ScopeState could not would drop out of the state.
        for uid, model in cached.models.items():
            for ref in cached._references(model.cls_name, model.properties):
                assert ref == ref.lower(), (uid, model.properties)


async def _session_messages(js: _JetstreamReplica, messages: list[dict]) -> None:
    client = _Client()
    session = js.session(client)
    try:
        await _handle_checked(
            js, session, client, {"type": "ScopeFetch", "index": 1, "name": JETSTREAM_SCOPE}
        )
        for message in messages:
            await _handle_checked(js, session, client, message)
        await _check_scopes_match_the_store(js, session)
        assert client.closed is None, client.closed  # no client message ends a session
    finally:
        js.protocol.expire(session)
    assert js.observer.closed is None, js.observer.closed
    assert not js.fatal and not js.engine.callback_failures, (js.fatal, js.engine.callback_failures)
    assert not js.observer_session.expired


def _run_session(target: str, messages: list[dict]) -> None:
    REACHED[target] += 1
    js = _jetstream_now()
    js.loop.run_until_complete(_session_messages(js, messages))


def close_jetstream() -> None:
    """Close the replica behind the Jetstream session targets, if one was made."""
    global _jetstream
    if _jetstream is not None:
        _jetstream.close()
        _jetstream = None


def jetstream_session(data: bytes) -> None:
    """A Jetstream frame from a client whose session exists (SessionCreate with the right
    token, the scope fetched) on a real replica's Jetstream stack (store, engine, engine
    backend, protocol): any messages — ScopeFetch, ScopeSync, Ping, others —, each handled
    and committed, accepted changes fanned out to another session. The only acceptable
    refusal is the protocol's (a reply and one counted rejection, or for messages without
    a reply a counted rejection); any exception, a frame a client could not read, a
    callback failure in the engine or a scope that differs from the store fails it."""
    try:
        messages = jetstream_wire.decode(_text(data))
    except jetstream_wire.WireError:
        return  # the server's bad_frame refusal, before the protocol
    shifted = [{**m, "index": m["index"] + 1} if _index(m) else m for m in messages]
    _run_session("jetstream_session", shifted)


def jetstream_scope_sync(data: bytes) -> None:
    """A ScopeSync on the fetched scope whose fragments (JSON text that is not an object)
    or fields (an object: fragments, atomic, scopeIndex…, read after the defaults so they
    win) are the fuzzed text, in a frame decoded as the server does; checked as
    `jetstream_session`. Puts the fuzzer straight at the fragment checks."""
    text = _text(data).strip()
    head = '{"type":"ScopeSync","index":2,"scopeIndex":0,'
    frame = head + text[1:] if text.startswith("{") else head + '"fragments":' + text + "}"
    try:
        messages = jetstream_wire.decode(frame)
    except jetstream_wire.WireError:
        return
    _run_session("jetstream_scope_sync", messages)


def jetstream_scope_fetch(data: bytes) -> None:
    """A ScopeFetch whose name is the fuzzed text, then a ScopeSync of the new scope's root
    on it; checked as `jetstream_session`."""
    name = _text(data)
    _run_session(
        "jetstream_scope_fetch",
        [
            {"type": "ScopeFetch", "index": 2, "name": name},
            {
                "type": "ScopeSync",
                "index": 3,
                "scopeIndex": 1,
                "fragments": [
                    {"type": "add", "clsName": "Item", "uuid": "x1", "properties": {"text": name}},
                    {
                        "type": "change",
                        "clsName": "List",
                        "uuid": jetstream_root(name),
                        "properties": {"title": name, "items": ["x1"]},
                    },
                ],
            },
        ],
    )


class _Choices:
    """Fuzz bytes read as a series of choices (0 once they run out): a byte-driven builder
    of well-formed messages, so that every input reaches the session, not the JSON syntax."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def pick(self, options: list):
        return options[self.byte() % len(options)]

    def text(self) -> str:
        """Up to 12 UTF-16 code units, lone surrogates included (JSON can carry them)."""
        n = 2 * (self.byte() % 13)
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        return raw[: len(raw) // 2 * 2].decode("utf-16-le", "surrogatepass")

    def number(self):
        kind = self.byte() % 6
        if kind == 0:
            return self.byte() - 128
        if kind == 1:
            return 10 ** (2 * self.byte()) * self.pick([1, -1])  # to 10**510: past a double
        if kind == 2:
            b = bytes(self.byte() for _ in range(8))
            return struct.unpack("<d", b)[0]  # any double, NaN and infinities included
        if kind == 3:
            return self.byte() * 1e12 + 0.5
        if kind == 4:
            return 2**53 + self.byte()
        return 0

    def value(self, depth: int = 0):
        kind = self.byte() % (10 if depth < 3 else 7)
        if kind == 0:
            return None
        if kind == 1:
            return bool(self.byte() & 1)
        if kind == 2:
            return self.number()
        if kind == 3:
            return self.text()
        if kind == 4:
            return self.pick(["i1", "i2", "i3", "I2", jetstream_root(JETSTREAM_SCOPE), "x-1"])
        if kind == 5:
            return self.pick(["2026-11-27T04:00:00Z", "2026-11-27", "0001-01-01T00:00:00+14:00"])
        if kind == 6:
            return self.pick(["", "*", "?", "a" * 65, "é", "\u2028"])
        if kind in (7, 8):
            return [self.value(depth + 1) for _ in range(self.byte() % 4)]
        keys = ["title", "items", "pinned", "text", "done", "created", "n", "extra", "tags"]
        return {
            self.pick([*keys, self.text()]): self.value(depth + 1) for _ in range(self.byte() % 4)
        }

    def uuid(self) -> str:
        root = jetstream_root(JETSTREAM_SCOPE)
        return self.pick([root, "i1", "i1", "i2", "i2", "i3", "n1", "n2", "I1", self.text()])

    def property(self, key: str):
        """Mostly a value of the key's declared kind (so that whole fragments pass and
        reach the store and the fan-out), else any value."""
        if self.byte() % 4 == 0:
            return self.value()
        kinds = {
            "title": self.text,
            "text": self.text,
            "done": lambda: bool(self.byte() & 1),
            "created": lambda: self.pick([self.number(), self.value()]),
            "n": self.number,
            "extra": self.value,
            "tags": lambda: [self.text() for _ in range(self.byte() % 3)],
            "items": lambda: [self.uuid() for _ in range(self.byte() % 4)],
            "pinned": self.uuid,
        }
        return kinds.get(key, self.value)()

    def fragment(self):
        keys = ["title", "items", "pinned", "text", "done", "created", "n", "extra", "tags"]
        fragment = {
            "type": self.pick(["add", "add", "change", "change", "remove", self.text()]),
            "clsName": self.pick(["List", "Item", "Item", self.text(), None]),
            "uuid": self.uuid(),
        }
        shape = self.byte() % 8
        if shape < 6:
            names = [self.pick([*keys, *keys, self.text()]) for _ in range(self.byte() % 5)]
            fragment["properties"] = {k: self.property(k) for k in names}
        elif shape == 6:
            fragment["properties"] = self.value()
        return fragment

    def message(self) -> dict:
        kind = self.byte() % 8
        index = self.pick([2, 3, 4, 5, 0, 1, -1, "2", None, 2.0])
        if kind < 5:
            message = {
                "type": "ScopeSync",
                "index": index,
                "scopeIndex": self.pick([0, 0, 0, 1, 2, -1, "0", None, True]),
                "fragments": [self.fragment() for _ in range(self.byte() % 7)],
            }
            atomic = self.byte() % 4
            if atomic < 3:
                message["atomic"] = [False, True, self.value()][atomic]
            return message
        if kind == 5:
            name = self.pick([JETSTREAM_SCOPE, "t", "u.v:w-x_y", "", "*", "a" * 101, self.text()])
            return {"type": "ScopeFetch", "index": index, "name": name}
        if kind == 6:
            return {"type": "Ping", "index": 0, "ack": self.value(), "resendMissing": self.value()}
        return {"type": self.pick(["SessionCreate", "Nope", self.text()]), "index": index}


def jetstream_built(data: bytes) -> None:
    """Up to four well-formed Jetstream messages built from the fuzz bytes (`_Choices`:
    syncs of adds and changes with properties of every JSON kind — numbers beyond a double,
    NaN, lone surrogates, the scope's own uuids and references —, fetches, Pings), sent as
    one JSON frame in a session on the fetched scope; checked as `jetstream_session`.
    Random bytes rarely make JSON: this target spends every case past the decoder."""
    choices = _Choices(data)
    messages = [choices.message() for _ in range(1 + choices.byte() % 4)]
    frame = json.dumps(messages)  # NaN and Infinity as Python writes them: the wire refuses
    try:
        decoded = jetstream_wire.decode(frame)
    except jetstream_wire.WireError:
        assert "NaN" in frame or "Infinity" in frame, frame  # nothing else is refused
        return
    _run_session("jetstream_built", decoded)


def jetstream_root(name: str) -> str:
    """The root uuid of scope `name` on the fuzz replica."""
    return root_uuid((), name)


TARGETS = {
    "chatter_frames": chatter_frames,
    "chatter_large_msg": chatter_large_msg,
    "eventer_register": eventer_register,
    "eventer_init": eventer_init,
    "eventer_query": eventer_query,
    "syncer_init": syncer_init,
    "syncer_events": syncer_events,
    "config_yaml": config_yaml,
    "bus_int": bus_int,
    "bus_syncstart": bus_syncstart,
    "bus_pub": bus_pub,
    "replication_frame": replication_frame,
    "replication_logged_in": replication_logged_in,
    "jetstream_frame": jetstream_frame,
    "jetstream_session": jetstream_session,
    "jetstream_scope_sync": jetstream_scope_sync,
    "jetstream_scope_fetch": jetstream_scope_fetch,
    "jetstream_built": jetstream_built,
}
# The targets that count (a key at 0 until the first input gets through).
for _name in (
    "replication_frame",
    "replication_logged_in",
    "jetstream_frame",
    "jetstream_session",
    "jetstream_scope_sync",
    "jetstream_scope_fetch",
    "jetstream_built",
):
    REACHED[_name] = 0
