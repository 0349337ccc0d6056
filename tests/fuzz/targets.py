"""Fuzz targets: every decoder that sees bytes from the network or text from an
operator, wrapped so that the only acceptable outcomes are a value or the decoder's own
documented error. Shared by the Hypothesis tests (bounded, in CI) and the atheris
driver (``scripts/fuzz``, long runs; docs/security.md records them)."""

from __future__ import annotations

import asyncio
import logging
import pathlib
import shutil
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
)
from eventfleet_server.common.sbsguard import SbsBoundsError, check_bounds
from eventfleet_server.common.subscription import InvalidSubscriptionError, Subscription
from eventfleet_server.engine import Engine
from eventfleet_server.eventer.wire import (
    BadRequest,
    MalformedRequest,
    RegisterLimits,
    RequestRefused,
    decode_init_req,
    decode_query_req,
    decode_register,
)
from eventfleet_server.jetstream import wire as jetstream_wire
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


class _Transport:
    def get_write_buffer_size(self) -> int:
        return 0

    def abort(self) -> None:
        pass


class _Writer:
    """Enough of a StreamWriter for `Connection` to read (nothing is ever written)."""

    transport = _Transport()

    def get_extra_info(self, name):
        return ("127.0.0.1", 1)

    def write(self, data) -> None:
        pass

    def close(self) -> None:
        pass

    async def drain(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


async def _read_frames(data: bytes) -> int:
    reader = asyncio.StreamReader(limit=1 << 20)
    reader.feed_data(data)
    reader.feed_eof()
    conn = chatter_connection.Connection(reader, _Writer(), max_msg_size=64 * 1024, ping_delay=None)
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
    """The hand parser of HatChatter.Msg bodies."""
    try:
        chatter_connection.parse_msg(data)
    except (ValueError, UnicodeDecodeError):
        pass


def eventer_register(data: bytes) -> None:
    """MsgRegisterReq: the bounded, sliced decoder."""
    limits = RegisterLimits(max_events=1000, max_payload_bytes=4096)
    try:
        asyncio.run(decode_register(data, limits))
    except (MalformedRequest, RequestRefused, ValueError):
        pass


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


class _Replica:
    """A real store, engine and replication backend (EngineBackend) on a private event
    loop, in a temp dir; rebuilt once the fuzzer's writes make it large (bounded time per
    input: each session's ReplicateStart walks every row)."""

    MAX_SEQ = 2000

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.fatal: list[str] = []  # the engine's writer stopped: a failure of the target
        self.tasks = Tasks("fuzz", self.fatal.append)
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="eventfleet-fuzz-replica-"))
        config = ReplicationConfig.from_mapping(
            {"tables": [{"name": n, **t} for n, t in REPLICATION_TABLES.items()]}
        )
        self.storage = self.loop.run_until_complete(
            Storage.open(self.dir / "e.sqlite", synchronous="OFF")
        )
        self.engine = Engine(self.storage, 1, tasks=self.tasks)
        self.loop.run_until_complete(self.engine.start())
        self.engine.set_operational()
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
        self.loop.run_until_complete(self.engine.stop())
        self.loop.run_until_complete(self.storage.close())
        self.loop.run_until_complete(self.tasks.close(5.0))
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)


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
}
