"""Model, subscriptions and SBS round trips."""

from __future__ import annotations

import json

import pytest
from eventfleet_server.common import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    InvalidSubscriptionError,
    Order,
    OrderBy,
    QueryLatestParams,
    QueryServerParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Subscription,
    Timestamp,
    codec,
    timestamp_from_us,
    timestamp_to_us,
)
from hat.event import common as hat
from hat.event.common import encoder as hat_encoder
from hypothesis import given
from hypothesis import strategies as st

segments = st.sampled_from(["a", "b", "c", "?", "*"])
plain = st.sampled_from(["a", "b", "c", "d"])
types = st.lists(plain, max_size=4).map(tuple)


def reference_match(pattern, event_type) -> bool:
    """Straightforward recursive definition of hat-event 0.9 matching."""
    if not pattern:
        return not event_type
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        return True
    if not event_type:
        return False
    return (head == "?" or head == event_type[0]) and reference_match(rest, event_type[1:])


def valid_pattern():
    return st.tuples(
        st.lists(st.sampled_from(["a", "b", "c", "?"]), max_size=3), st.booleans()
    ).map(lambda x: tuple(x[0]) + (("*",) if x[1] else ()))


@given(st.lists(valid_pattern(), max_size=4), types)
def test_subscription_matches_like_the_definition(patterns, event_type):
    expected = any(reference_match(p, event_type) for p in patterns)
    assert Subscription(patterns).matches(event_type) == expected


@given(st.lists(valid_pattern(), max_size=4), st.lists(types, max_size=20))
def test_subscription_remembers_answers_without_changing_them(patterns, event_types):
    # Asked twice (the second answer from the memo), also past a cleared memo.
    subscription = Subscription(patterns)
    for event_type in [*event_types, *event_types]:
        expected = any(reference_match(p, event_type) for p in patterns)
        assert subscription.matches(event_type) == expected
    filler = Subscription(patterns)
    for i in range(1500):
        filler.matches(("x", str(i)))
    assert len(filler._memo) <= 1024  # bounded: a session's memory does not grow with types
    for event_type in event_types:
        assert filler.matches(event_type) == any(reference_match(p, event_type) for p in patterns)


@given(st.lists(valid_pattern(), max_size=4), types)
def test_subscription_agrees_with_hat_event(patterns, event_type):
    assert Subscription(patterns).matches(event_type) == hat.create_subscription(patterns).matches(
        event_type
    )


@pytest.mark.parametrize("pattern", [("*", "a"), ("a", "*", "*"), ("*", "?")])
def test_star_only_last(pattern):
    with pytest.raises(InvalidSubscriptionError, match="only valid as the last"):
        Subscription([pattern])


def test_empty_subscription_matches_nothing():
    assert not Subscription([]).matches(("a",))
    assert Subscription([("*",)]).matches(())


timestamps = st.builds(Timestamp, st.integers(-(2**40), 2**40), st.integers(0, 999_999))


@given(timestamps)
def test_timestamp_us_round_trip_and_order(t):
    assert timestamp_from_us(timestamp_to_us(t)) == t


@given(timestamps, timestamps)
def test_timestamp_us_preserves_order(a, b):
    assert (a < b) == (timestamp_to_us(a) < timestamp_to_us(b))


@pytest.mark.parametrize("t", [Timestamp(0, -1), Timestamp(0, 1_000_000), Timestamp(2**62, 0)])
def test_timestamp_out_of_range(t):
    with pytest.raises(ValueError, match="timestamp"):
        timestamp_to_us(t)


payloads = st.one_of(
    st.none(),
    st.builds(EventPayloadJson, st.text(max_size=20)),
    st.builds(EventPayloadBinary, st.text(max_size=5), st.binary(max_size=20)),
)
events = st.builds(
    Event,
    st.builds(EventId, st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**40)),
    types,
    timestamps,
    st.one_of(st.none(), timestamps),
    payloads,
)


@given(events)
def test_event_sbs_round_trip(event):
    data = codec.repo.encode("HatEventer.Event", codec.event_to_sbs(event))
    assert codec.event_from_sbs(codec.repo.decode("HatEventer.Event", data)) == event


json_texts = st.one_of(st.integers(), st.text(max_size=5), st.lists(st.booleans(), max_size=3)).map(
    json.dumps
)


@given(
    events.filter(lambda e: not isinstance(e.payload, EventPayloadJson))
    | events.flatmap(lambda e: json_texts.map(lambda t: e._replace(payload=EventPayloadJson(t))))
)
def test_event_bytes_are_what_hat_event_decodes(event):
    """Our encoding is read back by hat-event's own decoder with the same meaning."""
    data = codec.repo.encode("HatEventer.Event", codec.event_to_sbs(event))
    theirs = hat_encoder.event_from_sbs(hat.sbs_repo.decode("HatEventer.Event", data))
    assert theirs.id == tuple(event.id)
    assert theirs.type == event.type
    assert tuple(theirs.timestamp) == tuple(event.timestamp)
    if isinstance(event.payload, EventPayloadBinary):
        assert theirs.payload == hat.EventPayloadBinary(event.payload.type, event.payload.data)
    if isinstance(event.payload, EventPayloadJson):
        assert theirs.payload.data == json.loads(event.payload.data)


@given(st.builds(RegisterEvent, types, st.one_of(st.none(), timestamps), payloads))
def test_register_event_round_trip(event):
    data = codec.repo.encode("HatEventer.RegisterEvent", codec.register_event_to_sbs(event))
    assert (
        codec.register_event_from_sbs(codec.repo.decode("HatEventer.RegisterEvent", data)) == event
    )


@pytest.mark.parametrize(
    "params",
    [
        QueryLatestParams(),
        QueryLatestParams([("a", "*")]),
        QueryTimeseriesParams(),
        QueryTimeseriesParams(
            [("a",)],
            Timestamp(1, 2),
            Timestamp(3, 4),
            Timestamp(5, 6),
            Timestamp(7, 8),
            Order.ASCENDING,
            OrderBy.SOURCE_TIMESTAMP,
            10,
            EventId(1, 2, 3),
        ),
        QueryServerParams(3, True, 5, EventId(3, 1, 1)),
    ],
)
def test_query_params_round_trip(params):
    data = codec.repo.encode("HatEventer.QueryParams", codec.query_params_to_sbs(params))
    assert codec.query_params_from_sbs(codec.repo.decode("HatEventer.QueryParams", data)) == params


def _ev(server, session, instance):
    return Event(EventId(server, session, instance), ("a",), Timestamp(1, 0), None, None)


def test_split_sessions_keeps_order_and_splits_runs():
    from eventfleet_server.common.model import split_sessions

    a1, a2 = _ev(1, 1, 1), _ev(1, 1, 2)
    b = _ev(1, 3, 3)
    other_server = _ev(2, 3, 1)  # same session number, another server: another run
    a3 = _ev(1, 1, 4)  # session 1 again after others: a run of its own, order kept
    events = [a1, a2, b, other_server, a3]
    assert split_sessions(events) == [[a1, a2], [b], [other_server], [a3]]
    assert split_sessions([]) == []
    assert split_sessions(iter([a1, a2])) == [[a1, a2]]


# -- the shared JSON payload rule: numbers a JSON reader holds ------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("NaN", "NaN"),
        ('{"a": [1, Infinity]}', "Infinity"),
        ("[-Infinity]", "-Infinity"),
        ('{"a": 1e400}', "1e400"),
        ("-1.5E+309", "-1.5E+309"),
        ('{"a": ' + "1" * 320 + "}", "111111111111... (320 characters)"),
        ("[-" + "9" * 309 + "]", "-99999999999... (310 characters)"),
    ],
)
def test_json_payloads_with_numbers_no_reader_holds_are_invalid_events(text, named):
    from eventfleet_server.common.model import (
        InvalidEvent,
        check_register_event,
        json_payload_error,
        json_value_error,
    )

    expected = f"JSON payload: the number {named} is not a finite double"
    assert json_payload_error(text).startswith(expected)
    with pytest.raises(InvalidEvent, match=r"^event 3: JSON payload: the number") as e:
        check_register_event(3, RegisterEvent(("a",), None, EventPayloadJson(text)))
    assert isinstance(e.value, ValueError)  # callers catching ValueError still do
    # The same words for a value already decoded (Replication's rows, Jetstream's "any").
    if "e" not in named.lower():  # 1e400 decodes to inf: named as Infinity there
        assert (
            json_value_error(json.loads(text)) == json_payload_error(text)[len("JSON payload: ") :]
        )


@pytest.mark.parametrize(
    "text",
    [
        "[1.7976931348623157e308, -1.7976931348623157e308, 5e-324, 1e-400]",  # the edges
        "1" + "0" * 308,  # 1e308 as an integer: 309 digits, a double
        '{"NaN": "Infinity", "e": "1e400", "n": "' + "9" * 400 + '"}',  # text, not numbers
        json.dumps(list(range(400))),  # many digits, none beyond a double
        '{"deep": [[[{"x": 2.5}]]], "t": true, "f": false, "z": null}',
    ],
)
def test_json_payloads_of_finite_numbers_pass(text):
    from eventfleet_server.common.model import encoded_json_error, json_payload_error

    assert json_payload_error(text) is None
    assert encoded_json_error(text) is None


def test_json_payloads_that_are_not_json_are_named():
    from eventfleet_server.common.model import encoded_json_error, json_payload_error

    assert json_payload_error("{bad").startswith("JSON payload is not valid JSON: Expecting")
    # Nesting beyond the decoder's recursion limit: a refusal, not a RecursionError out
    # of the check (it used to escape; the strict eventer_register target fails on it).
    assert "maximum recursion depth" in json_payload_error("[" * 3000)
    assert json_payload_error(b"1") == "JSON payload must be text"
    # Text this server encoded (allow_nan=False) is parsed only where an integer beyond
    # a double can hide: 309 digits or more.
    assert encoded_json_error("[" + "9" * 309 + "]") is not None
