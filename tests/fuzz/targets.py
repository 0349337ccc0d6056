"""Fuzz targets: every decoder that sees bytes from the network or text from an
operator, wrapped so that the only acceptable outcomes are a value or the decoder's own
documented error. Shared by the Hypothesis tests (bounded, in CI) and the atheris
driver (``scripts/fuzz``, long runs; docs/security.md records them)."""

from __future__ import annotations

import asyncio
import pathlib
import tempfile

from eventfleet_server import config
from eventfleet_server.chatter import connection as chatter_connection
from eventfleet_server.common import codec
from eventfleet_server.common.sbsguard import SbsBoundsError, check_bounds
from eventfleet_server.eventer.decode import (
    MalformedRequest,
    RegisterLimits,
    RequestRefused,
    decode_register,
)
from eventfleet_server.eventer.server import _check_query
from eventfleet_server.syncer import protocol as syncer_protocol


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
    """The hand parser of large HatChatter.Msg bodies."""
    try:
        chatter_connection._parse_large(data)
    except (ValueError, UnicodeDecodeError):
        pass


def eventer_register(data: bytes) -> None:
    """MsgRegisterReq: the bounded, sliced decoder."""
    limits = RegisterLimits(max_events=1000, max_payload_bytes=4096)
    try:
        asyncio.run(decode_register(data, limits))
    except (MalformedRequest, RequestRefused, ValueError):
        pass


def _guarded(type_name: str, data: bytes):
    check_bounds(codec.repo, type_name, data)
    return codec.repo.decode(type_name, data)


def eventer_init(data: bytes) -> None:
    """MsgInitReq as the Eventer server reads it (bounds, then the C decoder)."""
    try:
        req = _guarded("HatEventer.MsgInitReq", data)
    except SbsBoundsError:
        return
    except Exception:
        return  # the C decoder's own refusal (SystemError/ValueError); the server closes
    assert isinstance(req, dict)


def eventer_query(data: bytes) -> None:
    """MsgQueryReq: bounds, decode, model conversion, the server's checks."""
    try:
        params = codec.query_params_from_sbs(_guarded("HatEventer.MsgQueryReq", data))
        _check_query(params)
    except SbsBoundsError:
        return
    except Exception:
        return  # refused as bad_query by the server


def syncer_init(data: bytes) -> None:
    try:
        syncer_protocol.decode_init_req(data)
    except syncer_protocol.ProtocolError:
        pass


def syncer_events(data: bytes) -> None:
    """MsgEvents from an authenticated peer (no bounds walk: see docs/security.md)."""
    try:
        check_bounds(codec.repo, syncer_protocol.EVENTS, data)
    except SbsBoundsError:
        return
    try:
        syncer_protocol.decode_events(data, 2)
    except syncer_protocol.ProtocolError:
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
    config.ReplicaConfig.from_mapping(conf)


TARGETS = {
    "chatter_frames": chatter_frames,
    "chatter_large_msg": chatter_large_msg,
    "eventer_register": eventer_register,
    "eventer_init": eventer_init,
    "eventer_query": eventer_query,
    "syncer_init": syncer_init,
    "syncer_events": syncer_events,
    "config_yaml": config_yaml,
}
