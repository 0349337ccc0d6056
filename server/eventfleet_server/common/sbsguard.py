"""A bounds check to run before the hat-sbs C decoder sees untrusted bytes.

Found by fuzzing (docs/security.md): hat-sbs 0.7.6's C decoder allocates an Array's
list from the announced element count before reading any element, and walks garbage
slowly. A 10-byte message announcing 10^8 elements costs ~1 s and 800 MB; 10^9 fails
with MemoryError or, with overcommit, takes the process down. This walk (the schema
decides the layout) refuses any Array whose count exceeds the bytes left — every
element of our schemas takes at least one byte — and any length past the end, before
the C decoder runs. It builds nothing, so it costs a few µs per element.
"""

from __future__ import annotations

from hat.sbs import common as sbs

from eventfleet_server.common.sbsint import SbsIntError, read_int


class SbsBoundsError(ValueError):
    """The data cannot be a value of the type (the message says where)."""


def check_bounds(repo, type_name: str, data: bytes, *, max_steps: int = 1_000_000) -> None:
    """Raise `SbsBoundsError` unless `data` walks cleanly as `type_name` of `repo`.

    `max_steps` bounds the walk itself (nested empty records cannot loop it forever).
    """
    module, _, name = type_name.rpartition(".")
    view = memoryview(data)
    budget = [max_steps]
    try:
        end = _walk(repo._refs, sbs.Ref(module or None, name), view, 0, budget)
    except SbsIntError as e:
        raise SbsBoundsError(f"{type_name}: {e}") from None
    if end > len(view):
        raise SbsBoundsError(f"{type_name}: runs past the end of the data")


def _walk(refs, t, data: memoryview, pos: int, budget: list[int]) -> int:
    budget[0] -= 1
    if budget[0] < 0:
        raise SbsBoundsError("too many elements to check")
    while isinstance(t, sbs.Ref):
        t = refs[t]
    if isinstance(t, sbs.NoneType):
        return pos
    if isinstance(t, sbs.BooleanType):
        return _need(data, pos, 1)
    if isinstance(t, sbs.IntegerType):
        return read_int(data, pos)[1]
    if isinstance(t, sbs.FloatType):
        return _need(data, pos, 8)
    if isinstance(t, sbs.StringType | sbs.BytesType):
        n, pos = read_int(data, pos)
        if n < 0:
            raise SbsBoundsError(f"negative length {n}")
        return _need(data, pos, n)
    if isinstance(t, sbs.ArrayType):
        n, pos = read_int(data, pos)
        if n < 0 or n > len(data) - pos:
            raise SbsBoundsError(f"an array of {n} elements in {len(data) - pos} bytes")
        item = _resolve(refs, t.t)
        if isinstance(item, sbs.StringType | sbs.BytesType):
            # Arrays of strings (event types) and arrays of those (subscriptions, query
            # type lists) are most of what clients send: walked inline, without a call
            # and a type dispatch per element.
            return _walk_strings(data, pos, n, budget)
        if isinstance(item, sbs.ArrayType) and isinstance(
            _resolve(refs, item.t), sbs.StringType | sbs.BytesType
        ):
            budget[0] -= n
            for _ in range(n):
                count, pos = read_int(data, pos)
                if count < 0 or count > len(data) - pos:
                    raise SbsBoundsError(f"an array of {count} elements in {len(data) - pos} bytes")
                pos = _walk_strings(data, pos, count, budget)
            return pos
        for _ in range(n):
            pos = _walk(refs, item, data, pos, budget)
        return pos
    if isinstance(t, sbs.RecordType):
        for _, entry in t.entries:
            pos = _walk(refs, entry, data, pos, budget)
        return pos
    if isinstance(t, sbs.ChoiceType):
        i, pos = read_int(data, pos)
        if not 0 <= i < len(t.entries):
            raise SbsBoundsError(f"choice index {i} of {len(t.entries)}")
        return _walk(refs, t.entries[i][1], data, pos, budget)
    raise SbsBoundsError(f"unknown SBS type {t!r}")


def _resolve(refs, t):
    while isinstance(t, sbs.Ref):
        t = refs[t]
    return t


def _walk_strings(data: memoryview, pos: int, n: int, budget: list[int]) -> int:
    """Past `n` Strings/Bytes at `pos` (each a length and that many bytes)."""
    budget[0] -= n
    if budget[0] < 0:
        raise SbsBoundsError("too many elements to check")
    end = len(data)
    for _ in range(n):
        b = data[pos] if pos < end else 0
        if b & 0xC0 == 0x80:  # a one-byte length (0..63): nearly always
            length = b & 0x3F
            pos += 1
        else:
            length, pos = read_int(data, pos)
            if length < 0:
                raise SbsBoundsError(f"negative length {length}")
        pos += length
        if pos > end:
            raise SbsBoundsError(f"{length} bytes needed at {pos - length}, fewer left")
    return pos


def _need(data: memoryview, pos: int, n: int) -> int:
    if pos + n > len(data):
        raise SbsBoundsError(f"{n} bytes needed at {pos}, {len(data) - pos} left")
    return pos + n
