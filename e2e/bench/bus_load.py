"""Load clients of the Event BUS benchmark (`e2e.bench.bus`), one process each.

Plain synchronous pyzmq, written from the RFC like `e2e.bus_client` but without asyncio:
the clients are the same program against eventfleet and against the reference BUS, and
they should cost the shared two cores as little as possible, so that what is measured
is the server. Each command prints one JSON line (`pub` first prints its start time),
with the client's own CPU time.

The hot loops call pyzmq's Cython socket methods (`zmq.backend.Socket.send`/`recv`)
frame by frame, as the replica's own BUS does: `send_multipart`/`recv_multipart` and a
`poll` per message go through pyzmq's Python wrappers, and measured 26-30 µs of client
CPU per PUB and 20-22 µs per BROADCAST received, against 7 and 9-12 µs this way. On two
shared cores, what the load costs is taken from the server under test.

    python -m e2e.bench.bus_load pub HOST PORT N RATE PREFIX   # RATE 0: as fast as it can
    python -m e2e.bench.bus_load sub HOST PORT N PREFIX WARMUP
    python -m e2e.bench.bus_load snap HOST PORT SUBTREES

Every PUB's data is msgpack ``[index, send time]`` (wall clock: the processes share the
machine's clock), so a subscriber measures BROADCAST latency = receive - send time.
Ports are a server's SNAPSHOT port P (P+1 publisher, P+2 collector).
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import sys
import time
import uuid

import msgpack
import zmq

_IDLE_TIMEOUT_MS = 10_000  # a subscriber or snapshot that hears nothing this long ends
_send = zmq.backend.Socket.send  # (socket, data, flags): no Python wrapper per frame
_recv = zmq.backend.Socket.recv  # (socket, flags, copy)
_MORE = int(zmq.SNDMORE)


def _recv_message(sock: zmq.Socket) -> list[bytes]:
    """One multipart message (raises zmq.Again after the socket's RCVTIMEO)."""
    frame = _recv(sock, 0, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(sock, 0, False)
        frames.append(frame.bytes)
    return frames


def _iso_now() -> bytes:
    # What the reference client sends: JavaScript's Date.toISOString (milliseconds, Z).
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.").encode() + b"%03dZ" % (now.microsecond // 1000)


def pub(host: str, port: int, n: int, rate: float, prefix: str) -> None:
    """N PUBs to the COLLECTOR, at `rate` per second (0: as fast as possible)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.sndhwm = 0
    sock.connect(f"tcp://{host}:{port + 2}")
    uuids = [str(uuid.uuid4()).encode() for _ in range(n)]  # made before the clock starts
    topics = [prefix.encode() + b"%d" % (i % 10) for i in range(10)]
    packb = msgpack.packb
    send, more = _send, _MORE
    time.sleep(0.3)  # the connection is up
    start = time.time()
    print(json.dumps({"start": start}), flush=True)
    ts = _iso_now()
    i = 0
    while i < n:
        if rate > 0:
            due = min(n, int((time.time() - start) * rate) + 1)
            if due <= i:
                time.sleep(0.0002)
                continue
        else:
            due = min(n, i + 1000)
        ts = _iso_now()
        for j in range(i, due):
            send(sock, topics[j % 10], more)
            send(sock, b"", more)
            send(sock, b"bench", more)
            send(sock, ts, more)
            send(sock, uuids[j], more)
            send(sock, packb([j, time.time()]), 0)
        i = due
    sent = time.time()
    sock.close(linger=-1)  # until every PUB is with the server's socket
    ctx.term()
    out = {"start": start, "sent": sent, "end": time.time(), "events": n}
    print(json.dumps(out | {"cpu_s": _cpu_s()}))


def _cpu_s() -> float:
    # The client's own CPU (start-up included), to tell what the load costs the machine.
    r = resource.getrusage(resource.RUSAGE_SELF)
    return round(r.ru_utime + r.ru_stime, 3)


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def sub(host: str, port: int, n: int, prefix: str, warmup: int) -> None:
    """Count BROADCASTs of `prefix` until N arrived (or none for a while); latency of
    those with index >= `warmup`; whether sequences only went up."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.rcvhwm = 0
    sock.rcvtimeo = _IDLE_TIMEOUT_MS
    sock.subscribe(prefix.encode())
    sock.connect(f"tcp://{host}:{port + 1}")
    time.sleep(0.5)  # the subscription reaches the server ("slow joiner")
    print(json.dumps({"ready": True}), flush=True)
    latencies: list[float] = []
    received = 0
    last_seq = -1
    out_of_order = 0
    first = last = None
    unpackb = msgpack.unpackb
    while received < n:
        try:
            frames = _recv_message(sock)
        except zmq.Again:
            break
        now = time.time()
        if first is None:
            first = now
        last = now
        received += 1
        seq = int(frames[1]) if frames[1].isdigit() else int.from_bytes(frames[1], "big")
        if seq <= last_seq:
            out_of_order += 1
        last_seq = seq
        index, sent = unpackb(frames[5])
        if index >= warmup:
            latencies.append((now - sent) * 1000)
    sock.close(linger=0)
    ctx.term()
    latencies.sort()
    out = {"received": received, "first": first, "last": last, "out_of_order": out_of_order}
    if latencies:
        out |= {
            "p50_ms": round(_percentile(latencies, 50), 3),
            "p99_ms": round(_percentile(latencies, 99), 3),
            "max_ms": round(latencies[-1], 3),
        }
    print(json.dumps(out | {"cpu_s": _cpu_s()}))


def snap(host: str, port: int, subtrees: str) -> None:
    """One snapshot: SYNCSTART `subtrees` 0, count SYNCs until SYNCEND, time it."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.rcvhwm = 0
    sock.rcvtimeo = _IDLE_TIMEOUT_MS
    # A printable identity: the reference routes its replies by the identity made into
    # a string, so libzmq's generated binary identity never gets an answer from it.
    sock.identity = b"bench-snapshot-%d" % os.getpid()
    sock.connect(f"tcp://{host}:{port}")
    time.sleep(0.1)
    started = time.perf_counter()
    sock.send_multipart([b"SYNCSTART", subtrees.encode(), b"0"])
    events = 0
    head = None
    while True:
        try:
            frames = _recv_message(sock)
        except zmq.Again:
            break
        if frames[0] == b"SYNC":
            events += 1
        elif frames[0] == b"SYNCEND":
            head = int(frames[2]) if frames[2].isdigit() else int.from_bytes(frames[2], "big")
            break
    seconds = time.perf_counter() - started
    sock.close(linger=0)
    ctx.term()
    out = {"events": events, "head": head, "seconds": round(seconds, 3)}
    print(json.dumps(out | {"cpu_s": _cpu_s()}))


def main(argv: list[str]) -> int:
    command, host, port, *rest = argv
    if command == "pub":
        pub(host, int(port), int(rest[0]), float(rest[1]), rest[2])
    elif command == "sub":
        sub(host, int(port), int(rest[0]), rest[1], int(rest[2]))
    elif command == "snap":
        snap(host, int(port), rest[0])
    else:
        raise SystemExit(f"unknown command {command!r} (pub, sub, snap)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
