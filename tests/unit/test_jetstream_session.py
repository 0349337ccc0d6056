"""The engine-free Jetstream layer: scope validation, index counters, Ping/resend, fan-out.

A small in-memory backend stands in for the engine here (the protocol is written against
callbacks); the same protocol runs against real replicas in e2e/test_jetstream_*.py.
"""

from __future__ import annotations

import pytest
from eventfleet_server.jetstream.models import ModelSchema, SchemaError
from eventfleet_server.jetstream.scope import ModelRecord, Scope, root_uuid
from eventfleet_server.jetstream.session import JetstreamProtocol

CLASSES = {
    "List": {"title": "string", "items": ["Item"]},
    "Item": {"text": "string", "done": "boolean", "created": "date"},
}
SCHEMA = ModelSchema.parse(CLASSES, "List")
ROOT = root_uuid((), "s")


def add_item(uid: str, text: str = "x", **props) -> dict:
    return {"type": "add", "clsName": "Item", "uuid": uid, "properties": {"text": text, **props}}


def set_items(*uids: str) -> dict:
    return {"type": "change", "clsName": "List", "uuid": ROOT, "properties": {"items": list(uids)}}


class MemoryBackend:
    """Applies writes to the scope at once, as the engine listener would."""

    def __init__(self):
        self.scopes: dict[str, Scope] = {}
        self.batches: list[list] = []
        self.sink = None
        self.fail = False
        self._key = 0

    def scope(self, name):
        return self.scopes.get(name)

    async def open_scope(self, name):
        return self.scopes.setdefault(name, Scope(name, root_uuid((), name), SCHEMA))

    def close_scope(self, name):
        pass

    async def store(self, scope, writes, origin):
        if self.fail:
            raise RuntimeError("disk full")
        self.batches.append(writes)
        self._key += 1
        frags = scope.apply(
            [ModelRecord(w.cls_name, w.uuid, w.properties, (self._key,)) for w in writes]
        )
        self.sink(scope.name, frags, origin)


class Outlet:
    def __init__(self):
        self.sent: list[dict] = []
        self.closed = None

    def send(self, messages):
        self.sent.extend(messages)

    def close(self, code, reason):
        self.closed = (code, reason)

    def take(self):
        out, self.sent = self.sent, []
        return out


def make_protocol(backend=None, **kw):
    backend = backend or MemoryBackend()
    rejected = []
    proto = JetstreamProtocol(
        backend,
        authenticate=lambda tok: None if tok in (None, "secret") else "invalid client token",
        reject=lambda reason, detail: rejected.append(reason),
        scope_pattern=r"^[a-z0-9]{1,20}$",
        max_fragments=kw.get("max_fragments", 100),
        resend_buffer=kw.get("resend_buffer", 100),
        session_expiry=kw.get("session_expiry", 60.0),
    )
    backend.sink = proto.broadcast
    return proto, backend, rejected


async def new_session(proto, scope="s"):
    out = Outlet()
    session = proto.create_session({"type": "SessionCreate", "version": "0.1.0"}, out)
    await proto.handle(session, {"type": "ScopeFetch", "index": 1, "name": scope, "params": {}})
    return session, out


# -- schema and scope ---------------------------------------------------------------------


def test_schema_names_the_bad_type():
    with pytest.raises(SchemaError, match=r"'Shape'.*'size'"):
        ModelSchema.parse({"Shape": {"size": "integer"}}, "Shape")
    with pytest.raises(SchemaError, match="root_class 'Canvas'"):
        ModelSchema.parse(CLASSES, "Canvas")


def test_root_uuid_is_stable_and_scoped():
    assert root_uuid((), "s") == root_uuid((), "s")
    assert root_uuid((), "s") != root_uuid((), "t")
    assert root_uuid(("site",), "s") != root_uuid((), "s")


def test_sync_accepts_an_add_with_its_parent_and_merges_changes():
    scope = Scope("s", ROOT, SCHEMA)
    plan = scope.plan_sync([add_item("a1", "milk"), set_items("a1")], atomic=False)
    assert plan.replies == [{}, {}]
    assert {w.uuid: w.properties for w in plan.writes} == {
        "a1": {"text": "milk"},
        ROOT: {"items": ["a1"]},
    }
    scope.apply([ModelRecord(w.cls_name, w.uuid, w.properties, (1,)) for w in plan.writes])
    plan = scope.plan_sync(
        [{"type": "change", "clsName": "Item", "uuid": "a1", "properties": {"done": True}}], False
    )
    assert plan.writes[0].properties == {"text": "milk", "done": True}


@pytest.mark.parametrize(
    ("fragment", "kind"),
    [
        ({"type": "add", "clsName": "Nope", "uuid": "b1", "properties": {}}, "unknown-class"),
        (add_item("b1", text=5), "invalid-property"),
        (add_item("b1", done="yes"), "invalid-property"),
        (add_item("b1", created="not a date"), "invalid-property"),
        (
            {"type": "add", "clsName": "Item", "uuid": "b1", "properties": {"x": 1}},
            "invalid-property",
        ),
        ({"type": "remove", "clsName": "Item", "uuid": "b1"}, "remove-not-supported"),
        ({"type": "change", "clsName": "Item", "uuid": "zz", "properties": {}}, "model-not-found"),
        ({"type": "add", "clsName": "Item", "uuid": "a/b", "properties": {}}, "invalid-uuid"),
        ({"type": "change", "clsName": "Item", "uuid": ROOT, "properties": {}}, "class-mismatch"),
        ("not an object", "invalid-fragment"),
    ],
)
def test_bad_fragment_is_refused_with_a_typed_error(fragment, kind):
    scope = Scope("s", ROOT, SCHEMA)
    plan = scope.plan_sync([fragment, set_items("b1")], atomic=False)
    assert plan.replies[0]["error"]["type"] == kind
    assert set(plan.replies[0]["error"]) == {"message", "type"}


def test_non_atomic_applies_the_good_fragments_only():
    scope = Scope("s", ROOT, SCHEMA)
    plan = scope.plan_sync(
        [add_item("a1"), add_item("a2", text=1), set_items("a1", "a2")], atomic=False
    )
    # a2 is bad, so the parent's reference to it is bad too; a1 then has no parent.
    kinds = [r.get("error", {}).get("type") for r in plan.replies]
    assert kinds == ["no-parent", "invalid-property", "invalid-reference"]
    assert plan.writes == []
    plan = scope.plan_sync(
        [add_item("a1"), set_items("a1"), {"type": "change", "clsName": "Item", "uuid": "q"}],
        atomic=False,
    )
    assert [bool(r) for r in plan.replies] == [False, False, True]
    assert [w.uuid for w in plan.writes] == ["a1", ROOT]


def test_atomic_sync_with_one_bad_fragment_writes_nothing():
    scope = Scope("s", ROOT, SCHEMA)
    plan = scope.plan_sync(
        [add_item("a1"), set_items("a1"), {"type": "add", "clsName": "Nope", "uuid": "c"}],
        atomic=True,
    )
    assert plan.writes == []
    assert [r["error"]["type"] for r in plan.replies] == [
        "atomic-sync-rejected",
        "atomic-sync-rejected",
        "unknown-class",
    ]
    assert "fragment 2" in plan.replies[0]["error"]["message"]


def test_reference_to_a_model_of_another_class_is_refused():
    scope = Scope("s", ROOT, SCHEMA)
    plan = scope.plan_sync([set_items(ROOT)], atomic=False)
    assert plan.replies[0]["error"]["type"] == "invalid-reference"


def test_latest_wins_and_state_holds_only_reachable_models():
    scope = Scope("s", ROOT, SCHEMA)
    frags = scope.apply(
        [
            ModelRecord("Item", "a1", {"text": "new"}, (5,)),
            ModelRecord("Item", "a1", {"text": "old"}, (3,)),  # older, arrives later
            ModelRecord("Item", "a2", {"text": "orphan"}, (4,)),
            ModelRecord("List", ROOT, {"items": ["a1"]}, (6,)),
        ]
    )
    assert [f["type"] for f in frags][:2] == ["add", "add"] and frags[-1]["type"] == "change"
    state = scope.state_fragments()
    assert [f["uuid"] for f in state] == [ROOT, "a1"]
    assert state[1]["properties"] == {"text": "new"}
    assert all(f["type"] == "add" for f in state)


def test_empty_scope_state_is_the_root_alone():
    state = Scope("s", ROOT, SCHEMA).state_fragments()
    assert state == [{"type": "add", "uuid": ROOT, "clsName": "List", "properties": {}}]


# -- protocol -----------------------------------------------------------------------------


async def test_session_create_fetch_and_indexes():
    proto, _, _ = make_protocol()
    session, out = await new_session(proto)
    reply, fetch_reply, state = out.take()
    assert reply["type"] == "SessionCreateReply" and reply["index"] == 0
    assert reply["sessionToken"] == session.token
    assert fetch_reply == {"type": "ScopeFetchReply", "replyTo": 1, "scopeIndex": 0, "index": 1}
    assert state["type"] == "ScopeState" and state["index"] == 2 and state["rootUUID"] == ROOT


async def test_wrong_token_is_an_auth_error_and_counted():
    proto, _, rejected = make_protocol()
    out = Outlet()
    msg = {"type": "SessionCreate", "version": "0.1.0", "params": {"token": "nope"}}
    assert proto.create_session(msg, out) is None
    assert out.sent[0]["error"]["type"] == "auth-error"
    assert rejected == ["bad_token"] and not proto.sessions


async def test_duplicate_client_index_is_dropped():
    proto, backend, _ = make_protocol()
    session, out = await new_session(proto)
    out.take()
    sync = {
        "type": "ScopeSync",
        "index": 2,
        "scopeIndex": 0,
        "fragments": [add_item("a1"), set_items("a1")],
    }
    await proto.handle(session, sync)
    await proto.handle(session, dict(sync))  # a resend after reconnect
    assert len(backend.batches) == 1
    assert [m["type"] for m in out.take()] == ["ScopeSyncReply"]


async def test_changes_reach_other_sessions_not_the_origin():
    proto, _, _ = make_protocol()
    a, out_a = await new_session(proto)
    _b, out_b = await new_session(proto)
    out_a.take()
    out_b.take()
    await proto.handle(
        a,
        {
            "type": "ScopeSync",
            "index": 2,
            "scopeIndex": 0,
            "fragments": [add_item("a1"), set_items("a1")],
        },
    )
    assert [m["type"] for m in out_a.take()] == ["ScopeSyncReply"]
    (sync,) = out_b.take()
    assert sync["type"] == "ScopeSync" and sync["index"] == 3
    assert {(f["type"], f["uuid"]) for f in sync["fragments"]} == {("add", "a1"), ("change", ROOT)}


async def test_unknown_scope_index_and_bad_scope_name():
    proto, _, rejected = make_protocol()
    session, out = await new_session(proto)
    out.take()
    await proto.handle(
        session, {"type": "ScopeSync", "index": 2, "scopeIndex": 7, "fragments": [{}]}
    )
    (reply,) = out.take()
    assert reply["fragmentReplies"][0]["error"]["type"] == "scope-index-not-found"
    await proto.handle(session, {"type": "ScopeFetch", "index": 3, "name": "../x"})
    (reply,) = out.take()
    assert reply["type"] == "ScopeFetchReply" and reply["error"]["type"] == "invalid-scope-name"
    await proto.handle(session, {"type": "Bogus", "index": 4})
    assert rejected == ["bad_scope", "bad_scope", "unexpected_message"]


async def test_failed_store_answers_errors_and_keeps_serving():
    proto, backend, _ = make_protocol()
    session, out = await new_session(proto)
    out.take()
    backend.fail = True
    frags = [add_item("a1"), set_items("a1")]
    await proto.handle(
        session, {"type": "ScopeSync", "index": 2, "scopeIndex": 0, "fragments": frags}
    )
    (reply,) = out.take()
    assert all(
        r["error"]["type"] == "could-not-apply-sync-message" for r in reply["fragmentReplies"]
    )
    backend.fail = False
    await proto.handle(
        session, {"type": "ScopeSync", "index": 3, "scopeIndex": 0, "fragments": frags}
    )
    assert out.take()[0]["fragmentReplies"] == [{}, {}]


async def test_resend_missing_after_reconnect():
    proto, _, _ = make_protocol()
    a, _out_a = await new_session(proto)
    b, out_b = await new_session(proto)
    proto.detach(b, out_b)  # b's connection dropped
    for i in range(3):
        frags = [add_item(f"a{i}"), set_items(*[f"a{j}" for j in range(i + 1)])]
        await proto.handle(
            a, {"type": "ScopeSync", "index": 2 + i, "scopeIndex": 0, "fragments": frags}
        )
    out_b.take()
    new_out = Outlet()
    assert proto.resume(b.token, new_out) is b
    await proto.handle(b, {"type": "Ping", "index": 0, "ack": 2, "resendMissing": True})
    sent = new_out.take()
    assert sent[0] == {"type": "Ping", "index": 0, "ack": b.client_index, "resendMissing": True}
    assert [m["index"] for m in sent[1:]] == [3, 4, 5]
    # Acknowledged messages leave the buffer.
    await proto.handle(b, {"type": "Ping", "index": 0, "ack": 5, "resendMissing": False})
    assert not b.buffer


async def test_resend_beyond_the_buffer_sends_fresh_state_with_contiguous_indexes():
    proto, _, _ = make_protocol(resend_buffer=2)
    a, _ = await new_session(proto)
    b, out_b = await new_session(proto)
    proto.detach(b, out_b)
    for i in range(4):
        frags = [add_item(f"a{i}"), set_items(*[f"a{j}" for j in range(i + 1)])]
        await proto.handle(
            a, {"type": "ScopeSync", "index": 2 + i, "scopeIndex": 0, "fragments": frags}
        )
    new_out = Outlet()
    proto.resume(b.token, new_out)
    await proto.handle(b, {"type": "Ping", "index": 0, "ack": 2, "resendMissing": True})
    ping, state = new_out.take()
    assert ping["type"] == "Ping"
    assert state["type"] == "ScopeState" and state["index"] == 3
    assert len(state["fragments"]) == 5  # root + 4 items


async def test_unknown_token_does_not_resume_and_idle_sessions_expire():
    proto, _, _ = make_protocol(session_expiry=10.0)
    session, out = await new_session(proto)
    assert proto.resume("nope", Outlet()) is None
    assert proto.expire_idle(now=session.last_activity + 5) == 0
    assert proto.expire_idle(now=session.last_activity + 11) == 1
    assert out.closed is not None and proto.resume(session.token, Outlet()) is None


# -- configuration ------------------------------------------------------------------------


def test_config_section_defaults_and_checks(tmp_path):
    from eventfleet_server import config
    from eventfleet_server.config.typed import build
    from eventfleet_server.jetstream.config import JetstreamConfig

    conf = config.load(None, environ={})
    js = build(JetstreamConfig, conf["jetstream"])
    assert js.enabled and js.path == "/jetstream" and js.root_class == "List"
    assert js.admission.init_timeout == 10.0 and js.type_prefix == ()
    path = tmp_path / "c.yaml"
    path.write_text("jetstream:\n  classes:\n    Canvas: {shapes: [Shape]}\n  root_class: Canvas\n")
    with pytest.raises(ValueError, match=r"jetstream\.classes: class 'Canvas'.*'shapes'"):
        build(JetstreamConfig, config.load(path, environ={})["jetstream"])
    path.write_text("jetstream:\n  max_fragments: 0\n")
    with pytest.raises(config.ConfigError, match=r"jetstream\.max_fragments"):
        config.load(path, environ={})


def test_pre_encoded_fragments_give_the_same_frame():
    import json

    from eventfleet_server.jetstream import wire

    frags = [{"type": "add", "uuid": "a1", "clsName": "Item", "properties": {"text": 'é"x'}}]
    plain = wire.scope_sync(3, frags)
    pre = wire.scope_sync(3, frags, wire.dumps(frags))
    plain["index"] = pre["index"] = 7
    assert json.loads(wire.encode([pre, plain])) == [plain, plain]


def test_state_encoding_is_cached_until_the_scope_changes():
    scope = Scope("s", ROOT, SCHEMA)
    first = scope.state()
    assert scope.state()[1] is first[1]
    scope.apply([ModelRecord("List", ROOT, {"title": "t"}, (1,))])
    assert scope.state()[1] != first[1] and '"title":"t"' in scope.state()[1]


# -- found by fuzzing (tests/fuzz: jetstream_scope_sync, docs/security.md) -------------------


@pytest.mark.parametrize("big", [10**400, -(10**309)], ids=["1e400", "-1e309"])
def test_a_number_beyond_a_double_is_a_refused_property_not_an_exception(big):
    # JSON text may carry an integer of hundreds of digits: math.isfinite raised
    # OverflowError out of the sync, the connection ended without a reply.
    scope = Scope("s", ROOT, SCHEMA)
    plan = scope.plan_sync([add_item("b1", created=big), set_items("b1")], atomic=False)
    assert plan.replies[0]["error"]["type"] == "invalid-property"
    assert "finite date" in plan.replies[0]["error"]["message"]
    number = ModelSchema.parse({"R": {"n": "number"}}, "R")
    assert "finite number" in number.check_properties("R", {"n": big})
    assert number.check_properties("R", {"n": 2**53}) is None


def test_an_integer_beyond_a_double_under_any_is_a_refused_property():
    # The shared payload rule (common.model): the frame decoder refuses NaN, Infinity
    # and 1e400; an integer of 400 digits is JSON text, but stored under "any" it would
    # make a payload every protocol refuses at registration (a could-not-apply).
    schema = ModelSchema.parse({"R": {"v": "any"}}, "R")
    why = schema.check_properties("R", {"v": {"deep": [1, 10**400]}})
    assert "the number 100000000000... (401 characters) is not a finite double" in why
    assert schema.check_properties("R", {"v": {"deep": [1, 2**1000, 1.5e308, "NaN"]}}) is None


@pytest.mark.parametrize(
    ("constant", "why"),
    [
        ("NaN", "NaN is not JSON"),
        ("Infinity", "Infinity is not JSON"),
        ("-Infinity", "-Infinity is not JSON"),
        ("1e4001", "number 1e4001 is beyond a double"),  # JSON, but read as inf
        ("-1.5E400", "number -1.5E400 is beyond a double"),
    ],
)
def test_nan_and_infinity_are_not_json(constant, why):
    # Python's json reads them; stored under an "any" property, every frame carrying the
    # model would be unreadable for a client's JSON.parse (Python writes inf as Infinity).
    from eventfleet_server.jetstream import wire

    frame = '{"type":"ScopeSync","index":2,"scopeIndex":0,"fragments":[{"x":' + constant + "}]}"
    with pytest.raises(wire.WireError, match=why) as e:
        wire.decode(frame)
    assert e.value.type == "invalid-json"
    assert wire.decode(frame.replace(constant, "1.5e300"))[0]["fragments"] == [{"x": 1.5e300}]


def test_lone_surrogates_are_sent_as_json_escapes():
    # JSON can carry "\ud800" (a client's sync, an Eventer event's payload); a text frame
    # must be UTF-8: the fan-out and every later ScopeState of the scope raised
    # UnicodeEncodeError.
    import json

    from eventfleet_server.jetstream import wire

    frags = [{"type": "add", "uuid": "a1", "clsName": "Item", "properties": {"text": "é\ud800"}}]
    for message in (wire.scope_sync(1, frags), wire.scope_sync(1, frags, wire.dumps(frags))):
        message["index"] = 3
        sent = json.loads(wire.encode([message]).encode("utf-8"))
        assert sent[0]["fragments"] == frags
    assert wire.dumps({"t": "é"}) == '{"t":"é"}'  # other non-ASCII text stays as it is


def test_upper_case_references_are_stored_as_the_uuids_they_name():
    # Found by the jetstream_built fuzz target: references resolve case-blind, model uuids
    # are stored lower-case; a reference kept as sent ("A2") hid its model from ScopeState.
    scope = Scope("s", ROOT, SCHEMA)
    plan = scope.plan_sync([add_item("A2", "milk"), set_items("A2")], atomic=False)
    assert plan.replies == [{}, {}]
    assert {w.uuid: w.properties for w in plan.writes}[ROOT] == {"items": ["a2"]}
    scope.apply([ModelRecord(w.cls_name, w.uuid, w.properties, (1,)) for w in plan.writes])
    assert [f["uuid"] for f in scope.state_fragments()] == [ROOT, "a2"]
