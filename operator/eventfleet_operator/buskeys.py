"""The Event BUS CURVE server key pair the operator issues (``spec.protocols.bus.curve``).

CurveZMQ keys are Curve25519 (X25519) keys, 32 bytes, written as Z85 text (ZeroMQ
RFC 32: 40 characters). The operator makes them with ``cryptography`` (no ZeroMQ in the
operator): the secret key is X25519's raw private key, the public key its raw public
key, exactly the pair libzmq's ``zmq_curve_keypair`` would give for that secret.

No I/O here: the reconciler reads and writes the Secret.
"""

from __future__ import annotations

import dataclasses

from cryptography.hazmat.primitives.asymmetric import x25519

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


class BusKeyError(ValueError):
    """Stored key text that cannot be used (the message says why; never the secret)."""


@dataclasses.dataclass(frozen=True)
class KeyPair:
    secret_z85: str
    public_z85: str


def z85_encode(data: bytes) -> str:
    """Z85 text of `data` (a multiple of 4 bytes)."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes multiples of 4 bytes, got {len(data)}")
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(_Z85[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 `text` (a multiple of 5 characters)."""
    if len(text) % 5:
        raise BusKeyError(f"Z85 text has a multiple of 5 characters, got {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            if c not in _Z85_INDEX:
                raise BusKeyError(f"{c!r} is not a Z85 character")
            value = value * 85 + _Z85_INDEX[c]
        if value >= 1 << 32:
            raise BusKeyError("Z85 group beyond 32 bits")
        out += value.to_bytes(4, "big")
    return bytes(out)


def new_keypair() -> KeyPair:
    """A fresh server key pair."""
    return _pair(x25519.X25519PrivateKey.generate())


def from_secret(secret_z85: str) -> KeyPair:
    """The pair of a stored secret key (40 Z85 characters); raises BusKeyError."""
    text = secret_z85.strip()
    if len(text) != 40:
        raise BusKeyError(f"a CURVE secret key is 40 Z85 characters, got {len(text)}")
    return _pair(x25519.X25519PrivateKey.from_private_bytes(z85_decode(text)))


def _pair(key: x25519.X25519PrivateKey) -> KeyPair:
    return KeyPair(
        secret_z85=z85_encode(key.private_bytes_raw()),
        public_z85=z85_encode(key.public_key().public_bytes_raw()),
    )
