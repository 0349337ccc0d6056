"""The stored bytes of registered events, spliced from the register request
(`eventer.wire.event_elements`), are exactly their SBS encoding."""

from __future__ import annotations

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    RegisterEvent,
    Timestamp,
)
from eventfleet_server.eventer.wire import RegisterLimits, event_elements, slices


def _request(n: int) -> tuple[bytes, list[RegisterEvent], list[tuple[int, int, int]]]:
    regs = [
        RegisterEvent(
            ("a", "b" * (i % 70), str(i)),
            Timestamp(i << 20, i % 1_000_000) if i % 2 else None,
            [None, EventPayloadJson(f'{{"x": {i}}}'), EventPayloadBinary("t", bytes(i % 300))][
                i % 3
            ],
        )
        for i in range(n)
    ]
    data = codec.repo.encode(
        "HatEventer.MsgRegisterReq", [codec.register_event_to_sbs(r) for r in regs]
    )
    spans: list[tuple[int, int, int]] = []
    for _ in slices(data, RegisterLimits(), spans):
        pass
    return data, regs, spans


# First instances at and around the 7-bit group boundaries (and the sign-pad byte).
@pytest.mark.parametrize("first", [1, 63, 64, 127, 128, 129, 8191, 8192, 16383, 16384, 2**62])
def test_event_elements_equal_each_events_encoding(first):
    data, regs, spans = _request(300)
    ts = Timestamp(1_764_000_000, 999_999)
    created = [
        Event(EventId(7, 2**33, first + i), r.type, ts, r.source_timestamp, r.payload)
        for i, r in enumerate(regs)
    ]
    assert event_elements(data, spans, created) == [codec.encode_event(e) for e in created]


def test_event_elements_refuse_what_is_not_one_registration():
    data, regs, spans = _request(3)
    ts = Timestamp(5, 0)
    created = [Event(EventId(1, 1, 1 + i), r.type, ts, None, r.payload) for i, r in enumerate(regs)]
    mixed = [created[0], created[1]._replace(id=EventId(1, 2, 2)), created[2]]
    assert event_elements(data, spans, mixed) is None
    assert event_elements(data, spans, created[:2]) is None
