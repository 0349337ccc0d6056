"""CURVE for the Event BUS: encryption and client authentication by public key.

ZeroMQ's PLAIN mechanism sends the token in clear text; CURVE (CurveZMQ, Curve25519 as
in NaCl) encrypts the whole session and authenticates the server by its public key,
which the client must know. This module holds everything CURVE needs and leaves the
sockets' data path to `server.py`, which calls four hooks: `configure` (before a
socket binds), `bind` (the listeners), `authorize` (each ZAP request) and `reload`.

Keys are read from files (Z85 text, 40 characters, or a ZeroMQ certificate file with
``secret-key = "..."``/``public-key = "..."`` lines): the server's secret key
(`secret_key_file`, its public key is derived) and the clients allowed in
(`allowed_keys`: one file or a directory of files, one public key per line). With
`tokens` on, a client may instead derive its key pair from a current client token
(`token_keypair`): the fleet token then authorises a CURVE client exactly as it
authorises an Eventer client, and a token rotation applies to it at the next handshake.

PLAIN stays available for the reference clients (micro-toolkit's, which know no CURVE)
only where configured: `plain_port` binds PLAIN listeners on the same sockets (ports
plain_port .. +2, ZAP domain ``eventfleet-plain``), optionally restricted to
`plain_networks`. Their token travels in clear text: use them only on networks where
that is acceptable.

Rotation without a restart: a new server key gets a new listener beside the old one on
each port, and new connections are steered to it while established sessions keep the old
key until they end (`bus.listeners`, which owns the listening sockets).
Allowed client keys and tokens are read at every handshake and need no rebind.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import pathlib
import re
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence

import zmq
import zmq.utils.z85

from eventfleet_server.bus.config import CurveConfig, CurveError
from eventfleet_server.bus.listeners import RotatingListeners

log = logging.getLogger(__name__)

CURVE_DOMAIN = b"eventfleet"
PLAIN_DOMAIN = b"eventfleet-plain"
_TOKEN_KEY_CONTEXT = b"eventfleet bus curve client key v1\0"
_Z85_KEY = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_CERT_LINE = re.compile(r'^\s*(public|secret)-key\s*=\s*"([^"]*)"\s*$')


# -- keys ---------------------------------------------------------------------------------


def _decode_key(text: str, where: str, what: str) -> bytes:
    """32 raw bytes from Z85 `text`; the error names `where` and, for a public key, the
    value (a secret is never echoed)."""
    shown = f" {text!r}" if what == "public key" else ""
    if not _Z85_KEY.match(text):
        raise CurveError(
            f"{where}: {what}{shown} is not a Z85 CURVE key (40 characters, got {len(text)})"
        )
    try:
        return zmq.utils.z85.decode(text.encode())
    except (ValueError, struct.error) as e:  # 40 Z85 digits beyond 2**256
        raise CurveError(f"{where}: {what}{shown} is not a Z85 CURVE key: {e}") from e


def read_secret_key(path: str, key: str = "bus.curve.secret_key_file") -> bytes:
    """The server's secret key (32 bytes) from `path`: Z85 text alone, or a ZeroMQ
    certificate file (its ``secret-key`` line)."""
    try:
        text = pathlib.Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CurveError(f"{key} {path}: cannot be read: {e}") from e
    if "-key" in text:  # a ZeroMQ certificate file
        found = [m[2] for m in map(_CERT_LINE.match, text.splitlines()) if m and m[1] == "secret"]
        if not found:
            raise CurveError(f"{key} {path}: a certificate file without a secret-key line")
        value = found[0]
    else:
        value = text.strip()
    return _decode_key(value, f"{key} {path}", "secret key")


def read_public_keys(path: str, key: str = "bus.curve.allowed_keys") -> frozenset[bytes]:
    """The client public keys allowed in: `path` is a file or a directory whose files
    (names starting with ``.`` skipped: a Kubernetes Secret volume's ``..data``) each
    hold one Z85 key per line (lines starting with ``#`` are comments) or ZeroMQ
    ``public-key`` lines."""
    p = pathlib.Path(path)
    try:
        files = (
            sorted(f for f in p.iterdir() if not f.name.startswith(".") and f.is_file())
            if p.is_dir()
            else [p]
        )
    except OSError as e:
        raise CurveError(f"{key} {path}: cannot be listed: {e}") from e
    keys: set[bytes] = set()
    for f in files:
        try:
            lines = f.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise CurveError(f"{key} {f}: cannot be read: {e}") from e
        for number, line in enumerate(lines, 1):
            m = _CERT_LINE.match(line)
            if m:
                if m[1] == "public":
                    keys.add(_decode_key(m[2], f"{key} {f}:{number}", "public key"))
                continue  # a certificate's secret-key line is not a client key
            # '#' is a Z85 digit (never the first of a 32-byte key): only a line
            # starting with it is a comment.
            text = line.strip()
            if not text or text.startswith("#") or text in ("curve", "metadata"):
                continue
            if " " in text:
                continue  # certificate file structure (sections, metadata)
            keys.add(_decode_key(text, f"{key} {f}:{number}", "public key"))
    return frozenset(keys)


def token_keypair(token: str) -> tuple[bytes, bytes]:
    """The CURVE key pair (public, secret; Z85) a client derives from a fleet token.

    The secret key is SHA-256 of a fixed context and the token: anyone holding the
    token can compute it, nobody can without it, and the server checks a client's
    public key against those of the current tokens at every handshake.
    """
    secret = zmq.utils.z85.encode(hashlib.sha256(_TOKEN_KEY_CONTEXT + token.encode()).digest())
    return zmq.curve_public(secret), secret


def _digest(paths: Iterable[str | None]) -> str:
    h = hashlib.sha256()
    for path in paths:
        if not path:
            continue
        p = pathlib.Path(path)
        try:
            items = (
                sorted(f for f in p.iterdir() if not f.name.startswith(".")) if p.is_dir() else [p]
            )
            for f in items:
                h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        except OSError:
            h.update(b"\0missing")
    return h.hexdigest()


class BusCurve:
    """The CURVE (and optional PLAIN) set-up of one Event BUS: keys, listeners, ZAP
    decisions and reload. `tokens()` returns the current client tokens (rotation)."""

    def __init__(self, config: CurveConfig, tokens: Callable[[], Sequence[str]] | None = None):
        self.config = config
        self._tokens = tokens or (lambda: ())
        self._secret = read_secret_key(config.secret_key_file or "")
        self.public_key = zmq.curve_public(zmq.utils.z85.encode(self._secret))
        self._allowed = (
            read_public_keys(config.allowed_keys) if config.allowed_keys else frozenset()
        )
        self._token_keys: tuple[tuple[str, ...], frozenset[bytes]] = ((), frozenset())
        self._networks = [ipaddress.ip_network(n, strict=False) for n in config.plain_networks]
        self._digests = self._file_digests()
        self._listeners = RotatingListeners()
        self.rotations = 0

    def _file_digests(self) -> tuple[str, str]:
        return _digest([self.config.secret_key_file]), _digest([self.config.allowed_keys])

    # -- socket hooks ----------------------------------------------------------------------

    @property
    def plain(self) -> bool:
        return self.config.plain_port is not None

    def configure(self, sock: zmq.Socket) -> None:
        """Make `sock`'s next listeners CURVE servers with the current key."""
        self._configure(sock, self._secret)

    @staticmethod
    def _configure(sock: zmq.Socket, secret: bytes) -> None:
        sock.curve_server = True
        sock.curve_secretkey = zmq.utils.z85.encode(secret)
        sock.zap_domain = CURVE_DOMAIN

    def bind(self, sock: zmq.Socket, host: str, port: int, *, rotating: bool = True) -> int:
        """Bind `sock` (configured) on `host`:`port` (0: a random port) through a
        listening socket of ours, so that a rotation can add one beside it; the port."""
        return self._listeners.bind(sock, host, port, rotating=rotating)

    def bind_all(self, sockets: Mapping[str, zmq.Socket], host: str, base: int) -> dict[str, int]:
        """Bind the three sockets (configured) as CURVE servers on `base` .. +2 (0:
        random ports), and as PLAIN servers on ``plain_port`` .. +2 when configured;
        the ports by socket name (PLAIN ones as ``plain-<name>``)."""
        ports: dict[str, int] = {}
        plain = self.config.plain_port
        for offset, name in enumerate(("snapshot", "publisher", "collector")):
            sock = sockets[name]
            port = base + offset if base else 0
            try:
                ports[name] = self.bind(sock, host, port)
            except OSError as e:
                raise OSError(f"event bus {name} socket cannot bind {host}:{port}: {e}") from e
            if plain is None:
                continue
            port = plain + offset if plain else 0
            sock.plain_server = True
            sock.zap_domain = PLAIN_DOMAIN
            try:
                ports[f"plain-{name}"] = self.bind(sock, host, port, rotating=False)
            except OSError as e:
                raise OSError(
                    f"event bus {name} socket cannot bind bus.curve.plain_port {host}:{port}: {e}"
                ) from e
            finally:
                self.configure(sock)  # later listeners (a rotation) are CURVE again
        return ports

    def close(self) -> None:
        """Forget the listeners (called once the sockets are closed)."""
        self._listeners.clear()

    # -- ZAP -------------------------------------------------------------------------------

    def authorize(
        self, domain: bytes, address: str, mechanism: bytes, credentials: Sequence[bytes]
    ) -> tuple[bytes | None, str]:
        """The ZAP decision for one handshake: (user id, "") when admitted, else (None,
        why). CURVE: the client's public key is allowed or a current token's; PLAIN (its
        own listeners only): the password is a current token, from an allowed network."""
        if domain == CURVE_DOMAIN and mechanism == b"CURVE" and len(credentials) == 1:
            key = credentials[0]
            if key in self._allowed or (self.config.tokens and key in self._current_token_keys()):
                return zmq.utils.z85.encode(key), ""
            return None, f"CURVE client key {zmq.utils.z85.encode(key).decode()} not allowed"
        if domain == PLAIN_DOMAIN and mechanism == b"PLAIN" and len(credentials) == 2:
            if self._networks and not self._on_allowed_network(address):
                return None, f"PLAIN from {address} (not in bus.curve.plain_networks)"
            if any(t and hmac.compare_digest(credentials[1], t.encode()) for t in self._tokens()):
                return credentials[0], ""
            return None, f"PLAIN credentials refused (user {credentials[0][:64]!r})"
        return None, f"{mechanism.decode(errors='replace')} not accepted here"

    def _current_token_keys(self) -> frozenset[bytes]:
        tokens = tuple(self._tokens())
        if tokens != self._token_keys[0]:
            keys = frozenset(zmq.utils.z85.decode(token_keypair(t)[0]) for t in tokens if t)
            self._token_keys = (tokens, keys)
        return self._token_keys[1]

    def _on_allowed_network(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self._networks)

    # -- reload ------------------------------------------------------------------------------

    def reload(self, reason: str) -> bool:
        """Re-read the key files if they changed; True when something was applied.

        Files that do not load (a Secret half-swapped) keep the current keys: refusing
        every client because of a bad rotation would be an outage. A new allowed-keys
        list applies at the next handshake; a new server key gets new listeners (module
        docstring), established sessions keep the old key until they end.
        """
        secret_digest, allowed_digest = self._file_digests()
        if (secret_digest, allowed_digest) == self._digests:
            return False
        try:
            secret = read_secret_key(self.config.secret_key_file or "")
            allowed = (
                read_public_keys(self.config.allowed_keys)
                if self.config.allowed_keys
                else frozenset()
            )
        except CurveError as e:
            log.error("bus curve reload (%s) ignored, keeping the current keys: %s", reason, e)
            self._digests = (secret_digest, allowed_digest)  # logged once per content
            return False
        self._digests = (secret_digest, allowed_digest)
        if allowed != self._allowed:
            self._allowed = allowed
            log.info(
                "bus curve: %d allowed client key(s) loaded (%s) from %s",
                len(allowed),
                reason,
                self.config.allowed_keys,
            )
        if secret != self._secret:
            try:
                self._rotate(secret)
            except (OSError, zmq.ZMQError) as e:
                log.error(
                    "bus curve: new server key from %s not applied (%s), keeping the current "
                    "one: %s",
                    self.config.secret_key_file,
                    reason,
                    e,
                )
                return False
            log.info(
                "bus curve: server key rotated (%s), public key %s; new connections use it",
                reason,
                self.public_key.decode(),
            )
        return True

    def _rotate(self, secret: bytes) -> None:
        """New listeners with `secret` beside the current ones, then every new
        connection steered to them. Raises (OSError, ZMQError) with the current key
        still serving every port when a port or the steering is not available."""
        old = self._secret
        self._listeners.rotate(
            configure=lambda sock: self._configure(sock, secret),
            restore=lambda sock: self._configure(sock, old),
        )
        self._secret = secret
        self.public_key = zmq.curve_public(zmq.utils.z85.encode(secret))
        self.rotations += 1

    def describe(self) -> dict:
        return {
            "public_key": self.public_key.decode(),
            "allowed_keys": len(self._allowed),
            "tokens": self.config.tokens,
            "plain_port": self.config.plain_port,
            "rotations": self.rotations,
        }
