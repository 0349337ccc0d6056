"""Engine-free parts of Replication: codec, login, row index, configuration."""

from __future__ import annotations

import hashlib

import pytest
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Timestamp,
)
from eventfleet_server.replication import wire
from eventfleet_server.replication.config import ReplicationConfig
from eventfleet_server.replication.login import (
    Challenges,
    Credentials,
    FailedLogins,
    LoginError,
    check_login,
    digest,
)
from eventfleet_server.replication.table import Tables, dumps_row, encode_columns, row_key


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_digest_is_sha256_of_the_colon_joined_fields():
    fields = {"app": "a", "domain": "d", "sip": "s", "guid": "g", "dn": "n"}
    assert digest(fields, "c", "p") == hashlib.sha256(b"a:d:s:g:n:c:p").hexdigest()
    with_info = {**fields, "info": "i"}
    assert digest(with_info, "c", "p") == hashlib.sha256(b"a:d:s:g:n:i:c:p").hexdigest()
    as_object = {**fields, "info": {"x": 1}}
    assert digest(as_object, "c", "p") == hashlib.sha256(b'a:d:s:g:n:{"x":1}:c:p').hexdigest()


def test_challenges_are_single_use_and_expire():
    clock = Clock()
    ch = Challenges(5.0, clock)
    first = ch.issue()
    assert ch.take() == first
    with pytest.raises(LoginError, match="no outstanding challenge"):
        ch.take()
    ch.issue()
    clock.now += 5.1
    with pytest.raises(LoginError, match="expired"):
        ch.take()


def test_check_login_and_credentials():
    creds = Credentials({"alice": "pa"}, None)
    msg = {"app": "x", "domain": "", "sip": "alice", "guid": "", "dn": "A"}
    msg["digest"] = digest(msg, "ch", "pa")
    assert check_login(msg, "ch", creds) == "alice"
    with pytest.raises(LoginError, match="wrong digest"):
        check_login(msg, "other-challenge", creds)
    with pytest.raises(LoginError, match="wrong digest"):
        check_login({**msg, "sip": "bob"}, "ch", creds)
    with pytest.raises(LoginError, match="'digest'"):
        check_login({**msg, "digest": 5}, "ch", creds)
    assert "pa" not in repr(creds)
    assert Credentials(None, "tok").password("anyone") == "tok"


@pytest.mark.parametrize(
    "bad",
    [
        {"digest": "\u00e9" * 64},  # non-ASCII digest: hmac.compare_digest raised TypeError
        {"sip": "bob", "digest": "\u00e9"},  # the unknown-user path compares too
        {"dn": "\ud800"},  # lone surrogate in a field: digest() raised UnicodeEncodeError
        {"info": {"k": "\udfff"}},  # ... or in info
    ],
)
def test_check_login_refuses_undigestable_text_with_login_error(bad):
    # Found by fuzzing the AppWebsocket decoder + session (tests/fuzz): these escaped
    # PublisherSession.handle as exceptions instead of a counted login refusal.
    creds = Credentials({"alice": "pa"}, None)
    msg = {"app": "x", "domain": "", "sip": "alice", "guid": "", "dn": "A", "digest": "0" * 64}
    with pytest.raises(LoginError):
        check_login({**msg, **bad}, "ch", creds)


def test_failed_logins_block_then_release():
    clock = Clock()
    fl = FailedLogins(2, 10.0, clock)
    fl.failed("a")
    assert fl.blocked_for("a") == 0
    fl.failed("a")
    assert fl.blocked_for("a") == pytest.approx(10.0)
    assert fl.blocked_for("b") == 0
    clock.now += 10.5
    assert fl.blocked_for("a") == 0


def test_codec_errors_name_the_problem():
    with pytest.raises(wire.FrameError, match="not JSON"):
        wire.decode("{")
    with pytest.raises(wire.FrameError, match="JSON object"):
        wire.decode("3")
    with pytest.raises(wire.FrameError, match="'mt'"):
        wire.decode('{"mt": 1}')
    with pytest.raises(wire.FrameError, match="'api'"):
        wire.decode('{"mt": "x", "api": 1}')
    assert wire.parse_columns({"a": {}, "b": {"update": True}}) == {"a": False, "b": True}
    with pytest.raises(wire.FrameError, match=r"columns\.b\.update"):
        wire.parse_columns({"b": {"update": "yes"}})
    req = {"mt": "ReplicateNext", "api": "t", "src": "s1"}
    assert wire.error_reply(req, "no") == {
        "mt": "ReplicateNextResult",
        "api": "t",
        "src": "s1",
        "error": "no",
    }
    assert wire.error_reply(None, "bad") == {"mt": "Error", "error": "bad"}


@pytest.mark.parametrize(
    "request_",
    [
        {"mt": "ReplicateNext", "api": "t", "src": "next"},
        {"mt": "ReplicateNext", "api": "t"},
        {"mt": "ReplicateNext", "api": "t", "src": None},
        {"mt": "ReplicateNext", "api": "t", "src": 7},
        {"mt": "ReplicateNext", "api": "t", "src": True},  # not cached as the 1 above
        {"mt": "ReplicateNext", "api": "t", "src": 1},
        {"mt": "ReplicateNext", "api": "t", "src": {"n": [1, "ü"]}},  # not hashable
        {"mt": "ReplicateNext", "src": "s"},
    ],
)
def test_frames_with_a_stored_row_are_what_encode_makes(request_):
    columns = {"id": "k1", "name": 'ünï "q"', "n": 1.5, "x": None, "l": [1, {"a": 2}]}
    text = encode_columns(columns)
    for _ in range(2):  # the second time from the cached head
        assert wire.reply_with_row(request_, "ReplicateNextResult", 42, text) == wire.encode(
            wire.reply(request_, "ReplicateNextResult", usn=42, columns=columns)
        )
    assert wire.push_with_row("t", "ReplicateAdd", 9, text) == wire.encode(
        {"api": "t", "mt": "ReplicateAdd", "usn": 9, "columns": columns}
    )
    assert encode_columns(None) is None
    assert encode_columns({"bad": {1, 2}}) is None  # the session encodes (and reports) it


def ev(instance, key, payload, ts=None, server=1):
    return Event(
        EventId(server, instance, instance),
        ("replication", "users", key),
        Timestamp(ts if ts is not None else instance, 0),
        None,
        payload,
    )


def test_row_index_keeps_the_latest_event_per_row():
    tables = Tables(["replication"], [("users", "id")])
    users = tables["users"]
    changes = tables.apply(
        [
            (1, ev(1, "a", EventPayloadJson('{"id": "a", "n": 1}'))),
            (2, ev(2, "b", EventPayloadJson('{"n": 2}'))),  # key taken from the type
            (
                3,
                Event(EventId(1, 3, 3), ("other", "users", "x"), Timestamp(3, 0), None, None),
            ),
        ]
    )
    assert [(c.key, c.before, c.after) for c in changes] == [
        ("a", None, {"id": "a", "n": 1}),
        ("b", None, {"n": 2, "id": "b"}),
    ]
    # An older event stored later (a late merge from a peer) does not change the row.
    assert (
        tables.apply([(4, ev(9, "a", EventPayloadJson('{"id": "a", "n": 0}'), ts=0, server=2))])
        == []
    )
    assert users.rows["a"].seq == 1
    assert users.rows["a"].text == '{"id":"a","n":1}' == changes[0].after_text
    # Tombstone and a payload that is not a JSON object both delete the row.
    [c] = tables.apply([(5, ev(10, "a", None))])
    assert c.before == {"id": "a", "n": 1} and c.after is None
    [c] = tables.apply([(6, ev(11, "b", EventPayloadBinary("x", b"1")))])
    assert c.after is None
    assert users.snapshot() == {}
    assert users.changed_since(4) == [(5, "a"), (6, "b")]


def test_rows_written_here_keep_the_text_they_were_stored_with():
    tables = Tables(["replication"], [("users", "id")])
    columns = {"id": "a", "name": "ü"}
    text = dumps_row(columns)
    event = ev(1, "a", EventPayloadJson(text))
    [change] = tables.apply([(1, event)], lambda event_id: (columns, text))
    assert change.after_text is text and tables["users"].rows["a"].text is text
    # Without the key column the row is completed, and so encoded again.
    [change] = tables.apply([(2, ev(2, "a", None))], lambda event_id: ({"name": "x"}, "{}"))
    assert change.after_text == '{"name":"x","id":"a"}'


def test_row_key():
    assert row_key("a") == "a" and row_key(7) == "7"
    for bad in ("", "*", "?", True, 1.5, None, ["x"]):
        with pytest.raises(ValueError):
            row_key(bad)


def test_config_defaults_and_errors():
    cfg = ReplicationConfig.from_mapping({"enabled": True, "tables": [{"name": "t"}]})
    assert cfg.path == "/replication" and cfg.type_prefix == ("replication",)
    assert cfg.tables[0].key == "id" and cfg.tables[0].columns is None
    with pytest.raises(ValueError, match=r"replication\.tables\.0"):
        ReplicationConfig.from_mapping({"tables": [{"key": "id"}]})
    with pytest.raises(ValueError, match="listed twice"):
        ReplicationConfig.from_mapping({"tables": [{"name": "t"}, {"name": "t"}]})
    with pytest.raises(ValueError, match="local table 'u' is not in"):
        ReplicationConfig.from_mapping(
            {
                "tables": [{"name": "t"}],
                "upstreams": [{"name": "x", "url": "ws://h/", "table": "u"}],
            }
        )
    with pytest.raises(ValueError, match="url"):
        ReplicationConfig.from_mapping(
            {
                "tables": [{"name": "t"}],
                "upstreams": [{"name": "x", "url": "http://h/", "table": "t"}],
            }
        )


def test_user_list_is_reloaded_when_the_file_changes(tmp_path):
    import os

    users = tmp_path / "users.yaml"
    users.write_text("alice: one\n")
    creds = Credentials.load(str(users), None, "token")
    assert creds.password("alice") == "one" and creds.password("bob") is None
    users.write_text("alice: two\nbob: three\n")
    os.utime(users, (1, 1))  # a different mtime, whatever the clock's resolution
    assert creds.password("alice") == "two" and creds.password("bob") == "three"
    users.write_text("not: [a, mapping of strings]\n")
    os.utime(users, (2, 2))
    assert creds.password("alice") == "two"  # the last good list stays


def test_own_writes_are_taken_once_and_bounded():
    from eventfleet_server.replication.table import OwnWrites

    own = OwnWrites(limit=4)
    own.update([1, 2, 3])
    assert own.take(2) and not own.take(2) and not own.take(9)
    own.update([4, 5, 6])  # 5 ids > 4: the oldest half goes
    assert len(own) <= 4 and not own.take(1) and own.take(6)
