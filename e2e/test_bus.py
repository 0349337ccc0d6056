"""The Event BUS against a real replica process, with clients written from the RFC
(e2e/bus_client.py) in both integer encodings: snapshots of subtrees, sequence filters,
live order, PUB -> event (seen through Eventer), UUID dedup (also across a restart), the
persistent sequence, every bad input, the PUB high-water mark, a SYNCSTART flood, ZAP
PLAIN authentication, and the snapshot race."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import uuid as uuidlib

import aiohttp
import msgpack
import pytest
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import EventPayloadJson, RegisterEvent
from prometheus_client.parser import text_string_to_metric_families

from e2e.bus_client import BusClient, wait_live
from e2e.fleet_helpers import ReplicaProc, free_block, read_all, serving, status

ENCODINGS = ["reference", "rfc"]


def bus_port(replica: ReplicaProc) -> int:
    return replica.ports["bus"]


@contextlib.asynccontextmanager
async def running(tmp_path, name="r1", *, token_file=None, bus=None):
    replica = ReplicaProc(
        tmp_path,
        name,
        1,
        free_block(1),
        token_file=token_file,
        extra={"bus": {"enabled": True, **(bus or {})}},
    )
    async with serving(replica):
        yield replica


async def rejected(replica: ReplicaProc) -> dict[str, float]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(replica.http + "/metrics") as resp,
    ):
        text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "eventfleet_rejected_total" and sample.labels["protocol"] == "bus":
                out[sample.labels["reason"]] = sample.value
    return out


async def wait_rejected(replica, reason: str, at_least: float, timeout: float = 10.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        counts = await rejected(replica)
        if counts.get(reason, 0) >= at_least:
            return counts
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{reason} not counted {at_least} times: {counts}")
        await asyncio.sleep(0.1)


async def syncstart_retrying(port: int, subtrees: str, attempts: int, timeout: float):
    """SYNCSTART from a fresh client per attempt (no stale reply can mix in)."""
    for attempt in range(attempts):
        client = BusClient(port)
        try:
            return await client.syncstart(subtrees, timeout=timeout)
        except TimeoutError:
            if attempt == attempts - 1:
                raise
        finally:
            client.close()
    raise AssertionError("unreachable")


async def publish_and_wait(client: BusClient, items: list[tuple[str, object]]) -> list:
    """Publish and wait until every one is broadcast (client must be subscribed)."""
    uuids = [await client.publish(topic, data) for topic, data in items]
    got = {}
    while not all(u in got for u in uuids):
        event = await client.recv()
        got[event.uuid] = event
    return [got[u] for u in uuids]


# -- snapshots, sequences, order -------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_publish_broadcast_snapshot_of_subtrees_and_sequence_filter(tmp_path, encoding):
    async with running(tmp_path, bus={"integer_encoding": encoding}) as replica:
        client = BusClient(bus_port(replica), encoding=encoding)
        try:
            client.subscribe("")
            await wait_live(client, client, "/probe/live")
            items = [(f"/plant/{area}/{i}", {"i": i, "area": area}) for i in range(10)
                     for area in ("a", "b", "c")]  # fmt: skip
            live = await publish_and_wait(client, items)
            # Live order: strictly increasing, one per event, data and topic as sent.
            seqs = [e.sequence for e in live]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
            assert [(e.topic, e.data) for e in live] == items
            assert all(e.producer == "e2e" for e in live)

            # Subtrees with both separators: exactly the events under /plant/a/ and /plant/c/.
            for sep in (",", ";"):
                client.separator = sep
                events, end = await client.syncstart(["/plant/a/", "/plant/c/"])
                want = [e for e in live if e.topic.startswith(("/plant/a/", "/plant/c/"))]
                assert [(e.sequence, e.topic, e.uuid, e.data) for e in events] == [
                    (e.sequence, e.topic, e.uuid, e.data) for e in want
                ]
                assert end == live[-1].sequence  # SYNCEND: the head the snapshot covers

            # Sequence filter: only events above the given sequence.
            cut = live[14].sequence
            events, end = await client.syncstart("", cut)
            assert [e.uuid for e in events] == [e.uuid for e in live[15:]]
            assert end == live[-1].sequence
            # Above the head: nothing, and SYNCEND still names the head.
            events, end = await client.syncstart("/plant/", live[-1].sequence + 100)
            assert events == [] and end == live[-1].sequence
            # The empty subtree is everything (probes included).
            events, _ = await client.syncstart("")
            assert {e.uuid for e in live} <= {e.uuid for e in events}
        finally:
            client.close()


async def test_pub_becomes_an_event_and_eventer_events_reach_the_bus(tmp_path):
    async with running(tmp_path) as replica:
        client = BusClient(bus_port(replica))
        try:
            client.subscribe("/")
            await wait_live(client, client, "/probe")
            [json_event] = await publish_and_wait(client, [("/m/json", {"v": [1, 2.5, "x"]})])
            uuid_bin = await client.publish(
                "/m/bin", b"\x00\x01raw", timestamp="2024-05-01T10:00:00Z"
            )
            ext = msgpack.packb(msgpack.ExtType(5, b"xy"))
            uuid_ext = await client.publish("/m/ext", raw_data=ext)
            uuid_nil = await client.publish("/m/nil", raw_data=b"")  # reference clients: empty
            got = {e.uuid: e for e in [await client.recv() for _ in range(3)]}
            assert got[uuid_bin].data == b"\x00\x01raw"
            assert got[uuid_bin].timestamp.startswith("2024-05-01T10:00:00")
            assert msgpack.packb(msgpack.ExtType(5, b"xy")) == ext and got[uuid_ext].data == (
                msgpack.ExtType(5, b"xy")
            )
            assert got[uuid_nil].data is None

            # Stored as events (seen through Eventer): type from the topic, payload envelope.
            held = await read_all(replica.eventer, [1])
            by_type = {e[1]: e for e in held.values()}
            payload = by_type[("m", "json")][4]
            assert json.loads(payload.data) == {
                "$bus": {"uuid": json_event.uuid, "producer": "e2e"},
                "data": {"v": [1, 2.5, "x"]},
            }
            assert by_type[("m", "bin")][3] is not None  # producer timestamp -> sourceTimestamp
            assert by_type[("m", "bin")][4].type == "eventfleet.bus"

            # An Eventer registration is broadcast with a derived UUID and its JSON as data.
            eventer = await connect(*replica.eventer, "e2e/bus")
            try:
                [created] = await eventer.register(
                    [RegisterEvent(("from", "eventer"), None, EventPayloadJson('{"k": 1}'))], True
                )
            finally:
                await eventer.close()
            event = await client.recv()
            assert (event.topic, event.data) == ("/from/eventer", {"k": 1})
            assert event.producer == "eventfleet/1"
            assert event.uuid == str(
                uuidlib.uuid5(
                    uuidlib.UUID("6c1b0f0e-3f55-4d0c-9a43-0d6f3e2b9a51"),
                    f"{created.id.server}/{created.id.session}/{created.id.instance}",
                )
            )
            # ... and the snapshot shows it identically.
            events, _ = await client.syncstart("/from/")
            assert [(e.uuid, e.sequence, e.data) for e in events] == [
                (event.uuid, event.sequence, event.data)
            ]
        finally:
            client.close()


async def broadcast_count(replica: ReplicaProc) -> int:
    return (await status(replica.http))["protocols"]["bus"]["broadcast"]


async def register_types(replica: ReplicaProc, types: list[tuple[str, ...]]) -> None:
    eventer = await connect(*replica.eventer, "e2e/bus-idle")
    try:
        await eventer.register([RegisterEvent(t, None, EventPayloadJson("1")) for t in types], True)
    finally:
        await eventer.close()


async def test_broadcasts_are_built_only_while_someone_subscribes(tmp_path):
    """Nobody subscribed: commits build no BROADCASTs (the replica spends nothing on the
    BUS), yet nothing is lost — the snapshot has every event, and a subscriber gets the
    live ones from its first subscription on; after it leaves, building stops again."""
    async with running(tmp_path) as replica:
        await register_types(replica, [("idle", str(i)) for i in range(50)])
        assert await broadcast_count(replica) == 0

        client = BusClient(bus_port(replica))
        try:
            client.subscribe("/")
            await wait_live(client, client, "/probe")
            await register_types(replica, [("live", "x")])
            while (await client.recv()).topic != "/live/x":
                pass
            events, _ = await client.syncstart("/idle/")
            assert sorted(e.topic for e in events) == sorted(f"/idle/{i}" for i in range(50))
            assert await broadcast_count(replica) > 0
        finally:
            client.close()

        # The unsubscription reaches the server asynchronously: bounded wait until a
        # commit no longer builds a BROADCAST, then the following ones do not either.
        for _ in range(100):
            before = await broadcast_count(replica)
            await register_types(replica, [("gone", "probe")])
            if await broadcast_count(replica) == before:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("BROADCASTs still built 10 s after the last subscriber left")
        before = await broadcast_count(replica)
        await register_types(replica, [("gone", str(i)) for i in range(20)])
        assert await broadcast_count(replica) == before


async def test_uuid_dedup_and_sequence_survive_a_restart(tmp_path):
    replica = ReplicaProc(tmp_path, "r1", 1, free_block(1), extra={"bus": {"enabled": True}})
    replica.write_config()
    replica.start()
    try:
        await replica.wait_ready()
        client = BusClient(bus_port(replica))
        client.subscribe("/d/")
        await wait_live(client, client, "/d/probe")
        fixed = str(uuidlib.uuid4())
        for _ in range(3):  # a client retrying after a timeout
            await client.publish("/d/x", 1, uuid=fixed)
        [after] = await publish_and_wait(client, [("/d/y", 2)])
        events, head = await client.syncstart("/d/")
        assert [e.uuid for e in events].count(fixed) == 1
        client.close()
        assert replica.stop() == 0

        replica.start()
        await replica.wait_ready()
        client = BusClient(bus_port(replica))
        client.subscribe("/d/")
        await asyncio.sleep(0.3)
        await client.publish("/d/x", 1, uuid=fixed)  # the same retry after a restart
        [later] = await publish_and_wait(client, [("/d/z", 3)])
        assert later.sequence > head  # persistent sequence: never backwards
        events, _ = await client.syncstart("/d/")
        assert [e.uuid for e in events].count(fixed) == 1
        assert after.uuid in {e.uuid for e in events}
        client.close()
    finally:
        assert replica.stop() == 0, replica.log()


# -- bad input -------------------------------------------------------------------------


async def test_every_bad_input_is_refused_counted_and_the_replica_serves_on(tmp_path):
    async with running(tmp_path, bus={"max_message_size": 4096}) as replica:
        port = bus_port(replica)
        client = BusClient(port)
        good = BusClient(port, encoding="reference")
        try:
            good.subscribe("/ok/")
            await wait_live(good, good, "/ok/probe")
            u = lambda: str(uuidlib.uuid4()).encode()  # noqa: E731
            ts = b"2024-01-01T00:00:00Z"
            pubs = {
                "bad_frame": [b"/t", b"", b"p", ts, u()],  # 5 frames
                "bad_topic": [b"no/slash", b"", b"p", ts, u(), msgpack.packb(1)],
                "bad_topic_wild": [b"/a/*", b"", b"p", ts, u(), msgpack.packb(1)],
                "bad_topic_escape": [b"/a%41", b"", b"p", ts, u(), msgpack.packb(1)],
                "bad_seq": [b"/t", b"12x", b"p", ts, u(), msgpack.packb(1)],
                "bad_seq_range": [b"/t", b"99999999999999999999", b"p", ts, u(), b"\xc0"],
                "bad_ts": [b"/t", b"", b"p", b"yesterday", u(), msgpack.packb(1)],
                "bad_uuid": [b"/t", b"", b"p", ts, b"not-a-uuid", msgpack.packb(1)],
                "bad_msgpack": [b"/t", b"", b"p", ts, u(), b"\xc1"],
                "truncated_msgpack": [b"/t", b"", b"p", ts, u(), b"\x92\x01"],
                "bad_utf8_topic": [b"/\xff", b"", b"p", ts, u(), b"\xc0"],
                "too_large": [b"/t", b"", b"p", ts, u(), msgpack.packb("x" * 5000)],
            }
            for frames in pubs.values():
                await client.send_raw(2, frames)
            snaps = [
                [b"SYNCSTART", b"/a/"],  # short
                [b"SYNCSTART", b"/a/", b"abc"],  # non-numeric
                [b"SYNCSTART", b"/a/", b"\x01\x02\x03"],  # neither encoding
                [b"SYNCSTART", b"no-slash/", b"0"],  # subtree not a path
                [b"HELLO", b"/a/", b"0"],  # unknown command
                [b"SYNCSTART", b"/" + b"a" * 5000, b"0"],  # oversize
            ]
            for frames in snaps:
                await client.send_raw(0, frames)
            await wait_rejected(replica, "bad_topic", 4)
            counts = await wait_rejected(replica, "bad_message", 8)
            assert counts == {
                "bad_frame": 2,  # short PUB, short SYNCSTART
                "bad_topic": 4,  # no slash, wildcard, bad escape, not UTF-8
                # PUB: sequence x2, timestamp, uuid, msgpack x2; SYNCSTART: sequence x2
                "bad_message": 8,
                "bad_subscription": 1,
                "bad_command": 1,
                "message_too_large": 2,
            }
            # Nothing half-stored: only the probe events exist; the replica serves on.
            [ok] = await publish_and_wait(good, [("/ok/after", "fine")])
            events, _ = await good.syncstart("")
            assert {e.topic for e in events} <= {"/ok/probe", "/ok/after"}
            assert ok.data == "fine"
            # No reply to the refused SYNCSTARTs; the good client's own snapshot still works.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.snapshot_socket.recv_multipart(), 0.5)
        finally:
            client.close()
            good.close()


async def test_slow_subscriber_loses_messages_and_sees_a_gap_others_get_everything(tmp_path):
    """PUB high-water mark: a subscriber that never reads costs bounded memory; it loses
    messages and notices by the sequence gap. Others get every event, in order."""
    # Bursts (one commit is broadcast at once) stay below the mark: max_batch < pub_hwm.
    async with running(tmp_path, bus={"pub_hwm": 1000, "max_batch": 200}) as replica:
        port = bus_port(replica)
        slow = BusClient(port, rcvhwm=50)
        fast = BusClient(port)
        try:
            slow.subscribe("/s/")
            fast.subscribe("/s/")
            await wait_live(fast, fast, "/s/probe")
            await wait_live(slow, fast, "/s/probe")
            fast.pending()
            n = 8000
            blob = "x" * 4000  # big enough that socket buffers cannot hide the drops

            got: list = []
            progress = asyncio.Event()

            async def read_fast() -> list:
                while len(got) < n:
                    try:
                        event = await fast.recv()
                    except TimeoutError:
                        raise AssertionError(
                            f"fast subscriber got {len(got)} of {n}, last "
                            f"{got[-1].data[0] if got else None}"
                        ) from None
                    if event.topic == "/s/x":
                        got.append(event)
                        progress.set()
                return got

            reader = asyncio.create_task(read_fast())
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            for i in range(n):
                # "Others get everything" holds for a subscriber that keeps up: publish
                # at most 500 ahead of what the fast one has read (its queues hold 1000
                # each way), so a loaded machine slows the test instead of filling them.
                while i - len(got) > 500 and loop.time() < deadline and not reader.done():
                    progress.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(progress.wait(), max(deadline - loop.time(), 0.01))
                await fast.publish("/s/x", [i, blob])
            got = await asyncio.wait_for(reader, max(deadline - loop.time(), 1))
            assert [e.data[0] for e in got] == list(range(n))
            seqs = [e.sequence for e in got]
            assert all(b == a + 1 for a, b in itertools.pairwise(seqs))
            # The slow one lost messages beyond the high-water marks. Reading again, it
            # notices by the sequence gap before the next event (nothing else is sent to
            # this subtree meanwhile, so any jump is a loss).
            seen = []
            with contextlib.suppress(TimeoutError):
                while True:
                    seen.append(await slow.recv(timeout=1.0))
            await fast.publish("/s/marker", "end")
            while not seen or seen[-1].topic != "/s/marker":
                seen.append(await slow.recv())
            seen = [e for e in seen if e.topic != "/s/probe"]
            assert len(seen) < n
            seqs = [e.sequence for e in seen]
            gaps = [(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1]
            assert gaps, f"the slow subscriber got {len(seen)} of {n} without a gap"
            # A snapshot above its last sequence before the gap fills it.
            events, _ = await slow.syncstart("/s/", gaps[0][0])
            assert [e.sequence for e in events][: gaps[0][1] - gaps[0][0] - 1] == list(
                range(gaps[0][0] + 1, gaps[0][1])
            )
        finally:
            slow.close()
            fast.close()


async def test_syncstart_flood_is_refused_and_counted_others_still_served(tmp_path):
    async with running(
        tmp_path, bus={"max_pending_snapshots": 4, "max_concurrent_snapshots": 1}
    ) as replica:
        port = bus_port(replica)
        pub = BusClient(port)
        try:
            for i in range(2000):
                await pub.publish(f"/f/{i % 7}", i)
            pub.subscribe("/f/")
            await wait_live(pub, pub, "/f/probe")
            flooders = [BusClient(port) for _ in range(20)]
            try:
                for _ in range(5):
                    for f in flooders:
                        await f.send_raw(0, [b"SYNCSTART", b"", b"0"])
                await wait_rejected(replica, "rate_limited", 10)
            finally:
                for f in flooders:
                    f.close()
            # The flooders' queued requests are still drained (each until the server
            # notices its client is gone); a request that meets a full queue is refused
            # without a reply (the RFC has none), so a client retries, as real ones do.
            events, end = await syncstart_retrying(port, "/f/3", attempts=10, timeout=3.0)
            assert len(events) == len([i for i in range(2000) if i % 7 == 3]) and end > 0
        finally:
            pub.close()


async def test_token_requires_zap_plain_credentials(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    async with running(tmp_path, token_file=token_file) as replica:
        port = bus_port(replica)
        good = BusClient(port, plain=("anyone", "s3cret"))
        wrong = BusClient(port, plain=("anyone", "nope"))
        anonymous = BusClient(port)
        try:
            good.subscribe("/z/")
            await wait_live(good, good, "/z/probe")
            events, _ = await good.syncstart("/z/")
            assert events
            for client, topic in ((wrong, "/z/wrong"), (anonymous, "/z/anon")):
                # Once libzmq has dropped a refused connection the DEALER has no pipe
                # and a send waits for one: that wait is what a refused client sees.
                with contextlib.suppress(TimeoutError):
                    await client.publish(topic, 1, timeout=2.0)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(wrong.syncstart("/z/", timeout=1.0), 3.0)
            await wait_rejected(replica, "bad_token", 2)
            events, _ = await good.syncstart("/z/")
            assert {e.topic for e in events} == {"/z/probe"}
        finally:
            for c in (good, wrong, anonymous):
                c.close()


# -- the snapshot race -------------------------------------------------------------------


async def test_snapshot_race_every_client_ends_with_exactly_the_replicas_events(tmp_path):
    """A publisher at full speed while clients keep joining: subscribe, wait until the
    subscription is live, SYNCSTART, then apply BROADCASTs above SYNCEND. Every client's
    final state must be exactly the replica's events of its subtree: none missing, none
    twice."""
    async with running(tmp_path) as replica:
        port = bus_port(replica)
        publisher = BusClient(port)
        minimum = 4000
        joiners = 9
        subtrees = ["", "/r/1/", "/r/2/,/r/3/"]
        done = asyncio.Event()
        synced: list[int] = []
        states: list[tuple[str, dict[int, str]]] = []
        published = 0

        async def publish() -> None:
            # Full speed until every client has joined (and at least `minimum` events).
            nonlocal published
            # Bounded: a joiner that fails also counts as joined (its error is raised).
            while (published < minimum or len(synced) < joiners) and published < 40_000:
                await publisher.publish(f"/r/{published % 5}/x", published)
                published += 1
                if published % 20 == 0:
                    # As fast as the test process can while leaving its clients CPU to
                    # read (they share this one process and the machine's 2 cores).
                    await asyncio.sleep(0.002)
            done.set()

        async def join(subtree: str, delay: float, encoding: str) -> None:
            await asyncio.sleep(delay)
            client = BusClient(port, encoding=encoding, server_encoding="reference")
            try:
                prefixes = [p for p in subtree.split(",") if p] or [""]
                client.subscribe(*prefixes)
                try:
                    first = await client.recv(timeout=20)  # the subscription is live
                    buffered = [first]
                    snapshot, end = await client.syncstart(subtree, timeout=90)
                finally:
                    synced.append(1)
                state: dict[int, str] = {}
                for e in snapshot:
                    assert e.sequence not in state, f"snapshot repeats {e.sequence}"
                    state[e.sequence] = e.uuid
                last = end
                while True:
                    buffered += client.pending()
                    for e in buffered:
                        if e.sequence <= last:
                            continue  # RFC: discard not strictly greater
                        assert e.sequence not in state
                        state[e.sequence] = e.uuid
                        last = e.sequence
                    buffered = []
                    if done.is_set():
                        await asyncio.sleep(1.0)  # the last broadcasts in flight
                        buffered += client.pending()
                        if not buffered:
                            break
                    else:
                        with contextlib.suppress(TimeoutError):
                            buffered.append(await client.recv(timeout=0.2))
                states.append((subtree, state))
            finally:
                client.close()

        try:
            # Start the publisher; clients join at random moments while it runs.
            random.seed(11)
            joins = [
                join(subtrees[i % 3], random.uniform(0.05, 2.0), ENCODINGS[i % 2])
                for i in range(joiners)
            ]
            async with asyncio.TaskGroup() as group:  # a failure cancels the others
                group.create_task(publish())
                for j in joins:
                    group.create_task(j)
            await asyncio.sleep(0.5)
            auditor = BusClient(port)
            try:
                everything, _head = await auditor.syncstart("")
            finally:
                auditor.close()
            truth = {e.sequence: (e.topic, e.uuid) for e in everything}
            # The server's own view agrees with the store (seen through Eventer).
            assert len(truth) == len(await read_all(replica.eventer, [1])) == published
            for subtree, state in states:
                prefixes = tuple(p for p in subtree.split(",") if p)
                want = {
                    seq: u
                    for seq, (topic, u) in truth.items()
                    if not prefixes or topic.startswith(prefixes)
                }
                missing = sorted(set(want) - set(state))
                extra = sorted(set(state) - set(want))
                assert not missing and not extra, (
                    f"client {subtree!r}: {len(missing)} missing (first {missing[:5]}), "
                    f"{len(extra)} extra"
                )
                assert state == want
        finally:
            publisher.close()
