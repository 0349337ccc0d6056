"""SBS Integer encoding by hand (hat-sbs 0.7 layout), for the places that walk or build
large messages piecewise instead of handing the whole message to the C codec: big-endian
7-bit groups, the last byte marked with 0x80, the sign in bit 0x40 of the first byte."""

from __future__ import annotations


class SbsIntError(ValueError):
    """Truncated data or an integer longer than 64 bits."""


def read_int(data: memoryview | bytes, pos: int) -> tuple[int, int]:
    """``(value, position after it)`` of the Integer at `pos`."""
    end = len(data)
    if pos >= end:
        raise SbsIntError("truncated (integer expected)")
    value = -1 if data[pos] & 0x40 else 0
    for i in range(pos, min(pos + 10, end)):
        b = data[i]
        value = (value << 7) | (b & 0x7F)
        if b & 0x80:
            return value, i + 1
    raise SbsIntError("truncated, or an integer longer than 64 bits")


def encode_int(n: int) -> bytes:
    """The encoding of a non-negative Integer."""
    if type(n) is int and 0 <= n < _SMALL_LIMIT:
        # Frame sizes, lengths, counts, message ids: a list lookup instead of the loop
        # (a batch-1 request encodes ~10 such integers).
        return _SMALL[n]
    return _encode(n)


def _encode(n: int) -> bytes:
    if n < 0:
        raise ValueError(f"{n} is negative")
    groups = [n & 0x7F]
    n >>= 7
    while n:
        groups.append(n & 0x7F)
        n >>= 7
    if groups[-1] & 0x40:
        groups.append(0)  # keep the sign bit of the first byte clear
    groups.reverse()
    groups[-1] |= 0x80
    return bytes(groups)


_SMALL_LIMIT = 1 << 13  # every Integer of one or two bytes (the sign bit stays clear)
_SMALL = [_encode(n) for n in range(_SMALL_LIMIT)]
