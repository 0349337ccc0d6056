"""The storage's write path in-process: CPU per event of committing registrations.

Run from the repository root::

    .venv/bin/python -m e2e.bench.storage_write                 # ~1 min
    .venv/bin/python -m e2e.bench.storage_write --batches 100 --events 200000 --types 1000
    .venv/bin/python -m e2e.bench.storage_write --payload-bytes 1600   # large events

No protocol, no client, no other process: `Storage.write_now` (the engine's inline
commit) is called for request after request of `--batch` events over `--types` event
types, yielding to the event loop after each, so the background work a running replica
does meanwhile (WAL checkpoints, the per-type index fold) runs as it would and its CPU
is counted (`time.process_time`: every thread of this process). After the last write
whatever the background had not done yet (the rest of the fold) is done and counted
too, so that deferred work is not left out of the figure. The bytes this process hands
to `write` system calls (`wchar` of /proc/self/io: the WAL's frames and the checkpoints'
copies into the database file) are counted the same way, per event. Each batch size runs
`--repeat` times on a fresh store in /tmp; the median is printed.

The Eventer side-by-side (`e2e.bench.eventer`) measures the whole replica against the
reference; this one isolates the storage, whose share is hard to see there through the
±15 % run-to-run noise of short server runs on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import tempfile
import time

from eventfleet_server.common import codec
from eventfleet_server.common.model import Event, EventId, EventPayloadJson, Timestamp
from eventfleet_server.storage import Storage, schema


def _requests(
    batch: int, total: int, types: int, payload_bytes: int
) -> list[tuple[list[Event], list[bytes]]]:
    out = []
    pad = "x" * max(0, payload_bytes - 30)
    instance = 0
    for session in range(1, total // batch + 1):
        events = []
        for _ in range(batch):
            instance += 1
            events.append(
                Event(
                    EventId(1, session, instance),
                    ("bench", "write", str(instance % types)),
                    Timestamp(1_700_000_000 + instance // 1000, instance % 1000),
                    None,
                    EventPayloadJson(
                        f'{{"value": {instance}, "pad": "{pad}"}}'
                        if pad
                        else f'{{"value": {instance}}}'
                    ),
                )
            )
        out.append((events, [codec.encode_event(e) for e in events]))
    return out


def _written_bytes() -> int:
    """Bytes this process has passed to write system calls so far."""
    for line in pathlib.Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


async def _run_once(
    batch: int, total: int, types: int, synchronous: str, payload_bytes: int
) -> dict:
    requests = _requests(batch, total, types, payload_bytes)
    with tempfile.TemporaryDirectory(prefix="eventfleet-storage-bench-") as folder:
        storage = await Storage.open(
            pathlib.Path(folder) / "events.sqlite", synchronous=synchronous
        )
        try:
            cpu0, wall0, wchar0 = time.process_time(), time.perf_counter(), _written_bytes()
            for events, encoded in requests:
                if storage.can_write_now(len(events)):
                    storage.write_now(events, encoded=encoded)
                    await asyncio.sleep(0)  # the loop turn a replica's commit ends with
                else:
                    await storage.write(events, encoded=encoded)
            cpu1, wall1 = time.process_time(), time.perf_counter()
            fold = getattr(storage, "fold", None) or getattr(storage, "fold_types", None)
            if fold is not None:
                await fold()  # deferred work, counted
            cpu2, wchar2 = time.process_time(), _written_bytes()
        finally:
            await storage.close()
    written = len(requests) * batch
    return {
        "write_us": 1e6 * (cpu1 - cpu0) / written,
        "rest_us": 1e6 * (cpu2 - cpu1) / written,
        "total_us": 1e6 * (cpu2 - cpu0) / written,
        "events_per_s": written / (wall1 - wall0),
        "written_bytes": (wchar2 - wchar0) / written,
    }


async def _main(args: argparse.Namespace) -> None:
    print(
        f"storage write path, schema version {schema.SCHEMA_VERSION}, synchronous "
        f"{args.synchronous}, {args.types} types, payload ~{args.payload_bytes} bytes, "
        f"median of {args.repeat}"
    )
    print(
        "| batch | events | CPU µs/event (writes + background) | deferred rest | total "
        "| events/s | bytes written/event |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        total = args.events if batch > 1 else min(args.events, args.events_batch1)
        runs = []
        for i in range(args.repeat):
            runs.append(
                await _run_once(batch, total, args.types, args.synchronous, args.payload_bytes)
            )
            print(f"  batch {batch} run {i + 1}/{args.repeat}: {runs[-1]['total_us']:.1f} µs/event")
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {batch} | {total:,} | {med['write_us']:.1f} | {med['rest_us']:.2f} | "
            f"{med['total_us']:.1f} | {med['events_per_s']:,.0f} | {med['written_bytes']:,.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 100]
    )
    parser.add_argument("--events", type=int, default=100_000, help="events per run")
    parser.add_argument(
        "--events-batch1", type=int, default=30_000, help="events per run at batch 1 (at most)"
    )
    parser.add_argument("--types", type=int, default=100, help="distinct event types")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--synchronous", default="NORMAL", help="storage.synchronous")
    parser.add_argument(
        "--payload-bytes", type=int, default=0, help="pad each JSON payload to about this size"
    )
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
