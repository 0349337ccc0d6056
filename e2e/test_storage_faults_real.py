"""Real storage faults under a real ``eventfleet server`` process: its data directory on
a file system of its own that the test mounts (we run as root, as CI does; a mount that
fails fails the test, never skips). Faults, each met through real Eventer registrations:

* ENOSPC: a 2-3 MB tmpfs filled up; space returns by growing it or deleting a filler;
* EIO: ext4 on a loop device whose sparse image lives on a small tmpfs (a thinly
  provisioned disk running out): the device fails writes, the store's fsync gets EIO;
  the backing grows, yet what the kernel dropped meanwhile is not on the device;
* read-only: the kernel turns ext4 read-only itself after an error (errors=remount-ro).

Asserted for each: the log names the cause (ENOSPC / EIO / EROFS) and the store's path;
/readyz answers 503 naming it, and stays so while the fault lasts (the replica's own
probes fail); registrations are refused (failure answer, counted, logged with the
cause); every event the client got a success for is readable. ENOSPC recovers WITHOUT
a restart: Ready again, new registrations taken. EIO does not: pages whose write-back
failed are marked clean in memory but are not on the device (with the file system's own
metadata), so once evicted they read back as zeros; the replica stops writing, stays not
ready after the device works again, and recovery is a stop, fsck, mount and start, as
for the emergency read-only, which cannot be undone while mounted (docs/runbook.md).

Every mount and loop device is undone in a `finally` (the replica is stopped first: a
busy file system cannot be unmounted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import re
import shutil
import subprocess

import aiohttp
import pytest
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import EventPayloadJson, RegisterEvent

from e2e.fleet_helpers import ReplicaProc, eventually, free_block, mesh_peers, read_all
from tests import parts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOOLS = ("mount", "umount", "losetup", "mkfs.ext4", "e2fsck")


@pytest.fixture(autouse=True)
def can_mount() -> None:
    """Root and the mount tools, or the test fails (parts: a developer may allow it)."""
    if os.geteuid() != 0:
        parts.skip_missing("mounts", "not root: cannot mount", "run the tests as root (CI does)")
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        parts.skip_missing(
            "mounts", f"{', '.join(absent)} not found", "apt-get install util-linux e2fsprogs"
        )


BLOB = EventPayloadJson('"' + "x" * 4000 + '"')


def run(*argv: str) -> str:
    """Run a mount command; its failure (or absence) fails the test with its own words."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        pytest.fail(f"{argv[0]} is not installed (e2fsprogs, util-linux): {e}")
    if result.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def unmount(mountpoint: pathlib.Path) -> None:
    """Unmount; if that fails (busy), detach it lazily so that no mount outlives the
    test, and fail it."""
    result = subprocess.run(["umount", str(mountpoint)], capture_output=True, text=True)
    if result.returncode != 0:
        subprocess.run(["umount", "--lazy", str(mountpoint)], capture_output=True)
        pytest.fail(f"umount {mountpoint} failed: {result.stderr.strip()} (detached lazily)")


@contextlib.contextmanager
def tmpfs(mountpoint: pathlib.Path, size: str):
    """A tmpfs of `size` at `mountpoint`, unmounted when the block ends."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    run(
        "mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "eventfleet-faults", str(mountpoint)
    )
    try:
        yield mountpoint
    finally:
        unmount(mountpoint)


@contextlib.contextmanager
def loop_ext4(workdir: pathlib.Path, *, backing: str, journal: bool, errors: str):
    """An ext4 file system on a loop device whose 64 MB image file is sparse on a tmpfs
    of `backing` size: a thinly provisioned disk. Once the tmpfs is full the device's
    writes fail (the kernel logs "critical space allocation error"): the ext4 above
    has free space and the store's writes meet real I/O errors. Yields (mount point,
    loop device, backing tmpfs); everything is undone when the block ends."""
    with tmpfs(workdir / "backing", backing) as back:
        image = back / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(64 << 20)
        features = [] if journal else ["-O", "^has_journal"]
        run("mkfs.ext4", "-q", "-F", *features, str(image))
        device = run("losetup", "--find", "--show", str(image)).strip()
        try:
            mnt = workdir / "fs"
            mnt.mkdir()
            run("mount", "-t", "ext4", "-o", f"errors={errors}", device, str(mnt))
            try:
                yield mnt, device, back
            finally:
                unmount(mnt)
        finally:
            run("losetup", "--detach", device)


def repair(mnt: pathlib.Path, device: str) -> None:
    """Unmount, `e2fsck -fy` (exit 1: errors corrected) and mount `device` again."""
    run("umount", str(mnt))
    fsck = subprocess.run(["e2fsck", "-fy", device], capture_output=True, text=True, timeout=120)
    assert fsck.returncode in (0, 1), fsck.stdout + fsck.stderr
    run("mount", "-t", "ext4", "-o", "errors=remount-ro", device, str(mnt))


async def readyz(replica: ReplicaProc) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        http.get(replica.http + "/readyz") as res,
    ):
        return res.status, await res.json(content_type=None)


async def metrics(replica: ReplicaProc) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        http.get(replica.http + "/metrics") as res,
    ):
        return await res.text()


async def wait_ready_again(replica: ReplicaProc) -> None:
    """Bounded wait for /readyz 200 (the replica probes the store on its own)."""
    async with asyncio.timeout(60):
        while True:
            if (await readyz(replica))[0] == 200:
                return
            await asyncio.sleep(0.2)


async def probes_keep_failing(replica: ReplicaProc, cause: str, probes: int = 3) -> None:
    """Bounded wait until the replica has probed the failing store `probes` more times,
    /readyz answering 503 naming `cause` at every look."""
    first = None
    async with asyncio.timeout(60):
        while True:
            status, body = await readyz(replica)
            assert status == 503 and cause in body["reason"], body
            failed = int(re.search(r"\((\d+) failed commit", body["reason"]).group(1))
            first = failed if first is None else first
            if failed >= first + probes:
                return
            await asyncio.sleep(0.2)


async def fill_until_refused(client) -> dict[tuple[int, int], object]:
    """Register 10 x 4 kB events per request until a request fails; every event of an
    acknowledged request, by (server, instance)."""
    acked = {}
    for n in range(2000):
        created = await client.register(
            [RegisterEvent(("fill", str(n), str(i)), None, BLOB) for i in range(10)], True
        )
        if created is None:
            return acked
        acked.update({(e.id.server, e.id.instance): e for e in created})
    pytest.fail("the file system never filled up")


def fill_file(path: pathlib.Path) -> None:
    """Write zeros to `path` until the file system is full (ENOSPC)."""
    with contextlib.suppress(OSError), open(path, "wb") as f:
        while True:
            f.write(b"\0" * 65536)


def cause_lines(replica: ReplicaProc, words: str) -> list[str]:
    return [line for line in replica.log().splitlines() if words in line]


async def assert_failing_then_recovers(
    replica, client, acked, cause: str, recover, failed_line: str = "commit failed"
) -> None:
    """The common part: not ready naming `cause`, refusals, `recover()`, Ready again,
    new registrations taken, every acknowledged event readable."""
    await assert_failing(replica, client, acked, cause, failed_line)
    recover()
    await wait_ready_again(replica)
    assert cause_lines(replica, "storage works again")
    later = await client.register([RegisterEvent(("after", "recovery"), None, BLOB)], True)
    assert later is not None and len(later) == 1
    held = await read_all(replica.eventer, {replica.server_id})
    missing = set(acked) - set(held)
    assert not missing, f"{len(missing)} acknowledged events lost, e.g. {sorted(missing)[:5]}"
    for key, event in acked.items():
        assert held[key] == tuple(event)
    assert (later[0].id.server, later[0].id.instance) in held
    assert "Traceback" not in replica.log(), replica.log()[-3000:]  # expected, named faults


async def assert_failing(replica, client, acked, cause: str, failed_line: str) -> None:
    """Not ready naming `cause` (also after more probes), registrations refused (counted,
    logged with the cause), every acknowledged event readable."""
    store = str(replica.data_dir / "events.sqlite")
    lines = cause_lines(replica, failed_line)
    assert lines and cause in lines[0] and store in lines[0], replica.log()[-3000:]
    status, body = await readyz(replica)
    assert status == 503 and cause in body["reason"], body
    # Refused at once while failing; counted, and the log says why.
    assert await client.register([RegisterEvent(("refused",), None, None)], True) is None
    text = await metrics(replica)
    assert 'eventfleet_rejected_total{protocol="eventer",reason="register_failed"}' in text
    refusals = cause_lines(replica, "registrations are refused")
    assert refusals and cause in refusals[-1], replica.log()[-3000:]
    # Reads still work while writes fail, and return everything acknowledged.
    held = await read_all(replica.eventer, {replica.server_id})
    assert set(acked) <= set(held)

    # Still full: the replica's own probes keep failing, and it stays not ready (a tiny
    # probe commit fits into the WAL space the failed commit left: it must not count).
    await probes_keep_failing(replica, cause)


@contextlib.asynccontextmanager
async def replica_on(tmp_path: pathlib.Path, data_dir: pathlib.Path, synchronous: str = "FULL"):
    """A replica whose config and log stay on the test's own disk and whose data
    directory is `data_dir`; stopped when the block ends (before any unmount)."""
    extra = {"data_dir": str(data_dir), "storage": {"synchronous": synchronous}}
    replica = ReplicaProc(tmp_path, "r1", 1, free_block(1), extra=extra)
    replica.data_dir = data_dir
    replica.write_config()
    replica.start()
    try:
        await replica.wait_ready()
        client = await connect(*replica.eventer, "filler", timeout=10)
        try:
            yield replica, client
        finally:
            await client.close()
    finally:
        replica.stop()


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_enospc_on_a_full_tmpfs_and_recovery_when_it_grows(tmp_path, synchronous):
    """FULL (the default) commits on the writer thread; NORMAL commits small batches
    inline and checkpoints from a task: both paths meet the full disk."""
    mnt = tmp_path / "fs"
    with tmpfs(mnt, "2m"):
        async with replica_on(tmp_path, mnt / "data", synchronous) as (replica, client):
            acked = await fill_until_refused(client)
            assert acked

            def grow():
                run("mount", "-o", "remount,size=16m", str(mnt))

            await assert_failing_then_recovers(
                replica, client, acked, "no space left on device (ENOSPC)", grow
            )


async def test_enospc_recovers_when_a_filler_file_is_deleted(tmp_path):
    """The operator's way: something else filled the volume; deleting it is enough."""
    mnt = tmp_path / "fs"
    with tmpfs(mnt, "3m"):
        async with replica_on(tmp_path, mnt / "data") as (replica, client):
            filler = mnt / "filler"
            fill_file(filler)
            acked = await fill_until_refused(client)
            await assert_failing_then_recovers(
                replica, client, acked, "no space left on device (ENOSPC)", filler.unlink
            )


EIO = "I/O error (EIO)"
UNTRUSTED = "no longer trusted"  # the replica's words for a store after an I/O error


async def test_eio_on_a_thin_disk_is_not_ready_until_a_restart_after_fsck(tmp_path):
    """EIO: the block device under the store fails its writes (its backing store is
    full). The store's fsync fails with an I/O error; the replica stops writing to it
    and stays not ready even once the backing grows and the device works again (what the
    kernel dropped meanwhile is not on the device: a tiny probe that passes proves
    nothing). Recovery is a stop, fsck and start: every acknowledged event is there, or
    the start is refused naming the damage (restore from a peer).
    (ext4 without a journal, errors=continue: a journal would be aborted by the failed
    writes and the file system turned read-only, see below.)"""
    with loop_ext4(tmp_path, backing="8m", journal=False, errors="continue") as (mnt, dev, back):
        async with replica_on(tmp_path, mnt / "data") as (replica, client):
            acked = await fill_until_refused(client)
            assert acked
            await assert_failing(replica, client, acked, EIO, "commit failed")
            await assert_untrusted_after_the_device_recovers(replica, client, back)
        repair(mnt, dev)
        await assert_all_there_or_refused_after_a_restart(tmp_path, mnt, acked)


async def assert_untrusted_after_the_device_recovers(replica, client, back) -> None:
    """The backing grows: still not ready, registrations refused, the log says why
    (restart, fsck) and never that the storage works again."""
    lines = cause_lines(replica, UNTRUSTED)
    assert lines and EIO in lines[0] and "fsck" in lines[0], replica.log()[-3000:]
    run("mount", "-o", "remount,size=256m", str(back))
    await probes_keep_failing(replica, UNTRUSTED)
    assert await client.register([RegisterEvent(("refused",), None, None)], True) is None
    assert not cause_lines(replica, "storage works again after")
    assert "Traceback" not in replica.log(), replica.log()[-3000:]
    # The reason says a restart is needed, not that the replica keeps retrying.
    status, body = await readyz(replica)
    assert status == 503 and "until a restart" in body["reason"], body
    assert "retrying every" not in body["reason"], body


async def assert_all_there_or_refused_after_a_restart(tmp_path, mnt, acked) -> None:
    """The same data directory, after fsck: either Ready with every acknowledged event
    as it was acknowledged and new registrations taken, or (the device lost data that
    fsync had reported written: the kernel's "potential data loss") the start refused,
    naming the damaged file and the restore from a peer. Never a damaged store served."""
    replica = ReplicaProc(tmp_path, "r2", 1, free_block(1), extra={"data_dir": str(mnt / "data")})
    replica.start()
    try:
        for _ in range(300):  # 60 s
            if await replica_status(replica) is not None:
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail(f"r2 neither ready nor exited:\n{replica.log()[-3000:]}")
        if replica.proc.poll() is not None:
            lines = cause_lines(replica, "cannot start")
            assert lines and "is damaged" in lines[0] and "from a peer" in lines[0], lines
            return
        client = await connect(*replica.eventer, "after", timeout=10)
        try:
            held = await read_all(replica.eventer, {replica.server_id})
            missing = set(acked) - set(held)
            assert not missing, (
                f"{len(missing)} acknowledged events lost, e.g. {sorted(missing)[:5]}"
            )
            for key, event in acked.items():
                assert held[key] == tuple(event)
            assert await client.register([RegisterEvent(("after", "fsck"), None, BLOB)], True)
        finally:
            await client.close()
    finally:
        replica.stop()


async def replica_status(replica: ReplicaProc) -> str | None:
    """ "exited" once the process ended, "ready" once /readyz answers 200, else None."""
    if replica.proc.poll() is not None:
        return "exited"
    with contextlib.suppress(aiohttp.ClientError, OSError):
        if (await readyz(replica))[0] == 200:
            return "ready"
    return None


async def test_read_only_after_a_file_system_error_and_recovery_by_a_restart(tmp_path):
    """The kernel turns an ext4 file system read-only itself after an error
    (errors=remount-ro, the usual fstab setting; a journal aborted by failed writes does
    the same), triggered here through ext4's own /sys/fs/ext4/<dev>/trigger_fs_error.
    A read-only remount cannot be forced on a file system with files open for writing
    (EBUSY), and this emergency one cannot be undone while mounted (`mount -o
    remount,rw` keeps it read-only): recovery is a stop, fsck and mount, as on a node.
    Asserted: the cause (EROFS) and the path are logged, the replica is not ready and
    refuses registrations, and after the restart
    on the repaired file system every acknowledged event is there."""
    with loop_ext4(tmp_path, backing="256m", journal=True, errors="remount-ro") as (mnt, dev, _):
        cause = "file system is read-only (EROFS)"
        async with replica_on(tmp_path, mnt / "data") as (replica, client):
            acked = {}
            for n in range(20):
                events = [RegisterEvent(("ro", str(n), str(i)), None, BLOB) for i in range(10)]
                created = await client.register(events, True)
                assert created is not None
                acked.update({(e.id.server, e.id.instance): e for e in created})
            trigger = pathlib.Path("/sys/fs/ext4") / pathlib.Path(dev).name / "trigger_fs_error"
            trigger.write_text("eventfleet storage fault test")
            assert await client.register([RegisterEvent(("ro",), None, BLOB)], True) is None
            store = str(replica.data_dir / "events.sqlite")
            lines = cause_lines(replica, "commit failed")
            assert lines and cause in lines[0] and store in lines[0], replica.log()[-3000:]
            await probes_keep_failing(replica, cause)
            assert await client.register([RegisterEvent(("refused",), None, None)], True) is None
            refusals = cause_lines(replica, "registrations are refused")
            assert refusals and cause in refusals[-1], replica.log()[-3000:]
            held = await read_all(replica.eventer, {replica.server_id})
            assert set(acked) <= set(held)
        # Repair as on a node: unmount, fsck, mount; the same replica starts again.
        repair(mnt, dev)
        async with replica_on(tmp_path, mnt / "data") as (replica, client):
            held = await read_all(replica.eventer, {replica.server_id})
            missing = set(acked) - set(held)
            assert not missing, f"{len(missing)} acknowledged events lost"
            for key, event in acked.items():
                assert held[key] == tuple(event)
            assert await client.register([RegisterEvent(("after", "fsck"), None, BLOB)], True)


async def test_restart_on_a_full_disk_is_not_ready_until_space_returns(tmp_path):
    """A replica (re)started on a full volume (a pod rescheduled, a crash) serves what it
    holds but is not ready and refuses registrations from the start, naming ENOSPC;
    it turns Ready by itself when space returns."""
    mnt = tmp_path / "fs"
    cause = "no space left on device (ENOSPC)"
    with tmpfs(mnt, "2m"):
        async with replica_on(tmp_path, mnt / "data") as (_, client):
            acked = await fill_until_refused(client)
        replica = ReplicaProc(
            tmp_path, "r2", 1, free_block(1), extra={"data_dir": str(mnt / "data")}
        )
        replica.data_dir = mnt / "data"
        replica.start()
        try:
            lines = []
            async with asyncio.timeout(60):
                while not lines:
                    assert replica.proc.poll() is None, replica.log()[-3000:]
                    lines = cause_lines(replica, "store not writable at start")
                    await asyncio.sleep(0.2)
            assert cause in lines[0] and str(replica.data_dir) in lines[0], lines[0]
            client = await connect(*replica.eventer, "filler", timeout=10)
            try:
                await assert_failing_then_recovers(
                    replica,
                    client,
                    acked,
                    cause,
                    lambda: run("mount", "-o", "remount,size=16m", str(mnt)),
                    failed_line="store not writable at start",
                )
            finally:
                await client.close()
        finally:
            replica.stop()


async def test_a_peer_on_a_full_disk_is_not_ready_and_catches_up_when_space_returns(tmp_path):
    """Replica b's volume fills with events replicated from a (registered there, a has
    room): b's merges fail, b turns not ready naming ENOSPC (it used to stay Ready: only
    the Eventer's own commits counted) and refuses registrations; a keeps taking them.
    Once b's volume grows, b is Ready again and holds everything a acknowledged."""
    mnt = tmp_path / "fs"
    cause = "no space left on device (ENOSPC)"
    with tmpfs(mnt, "2m"):
        base = free_block(2)
        a = ReplicaProc(tmp_path, "a", 1, base)
        b = ReplicaProc(tmp_path, "b", 2, base + 10, extra={"data_dir": str(mnt / "data")})
        b.data_dir = mnt / "data"
        try:
            for p in (a, b):
                p.write_config(mesh_peers([a, b]))
                p.start()
            await asyncio.gather(a.wait_ready(), b.wait_ready())
            on_a = await connect(*a.eventer, "filler", timeout=10)
            on_b = await connect(*b.eventer, "refused", timeout=10)
            try:
                acked = {}
                for n in range(2000):
                    events = [
                        RegisterEvent(("peer", str(n), str(i)), None, BLOB) for i in range(10)
                    ]
                    created = await on_a.register(events, True)
                    assert created is not None, a.log()[-3000:]  # a has room
                    acked.update({(e.id.server, e.id.instance): e for e in created})
                    status, body = await readyz(b)
                    if status == 503 and "storage failing" in body["reason"]:
                        break
                else:
                    pytest.fail("b never reported its storage failing")
                assert cause in body["reason"], body
                lines = cause_lines(b, "merge of replicated events failed")
                store = str(b.data_dir / "events.sqlite")
                assert lines and cause in lines[0] and store in lines[0], b.log()[-3000:]
                assert await on_b.register([RegisterEvent(("no",), None, None)], True) is None
                await probes_keep_failing(b, cause)

                run("mount", "-o", "remount,size=32m", str(mnt))
                await wait_ready_again(b)

                async def caught_up():
                    held = await read_all(b.eventer, {a.server_id})
                    return set(acked) <= set(held) and held

                held = await eventually(caught_up, "b holding every event a acknowledged", 120)
                assert "Traceback" not in b.log(), b.log()[-3000:]
                for key, event in acked.items():
                    assert held[key] == tuple(event)
                assert await on_b.register([RegisterEvent(("yes",), None, None)], True)
            finally:
                await on_a.close()
                await on_b.close()
        finally:
            a.stop()
            b.stop()


def drop_caches() -> None:
    """Write back what can be, then evict the clean page cache: pages whose writeback
    failed are clean but not on the device, so what is read next comes from the device
    (what a busy node's memory pressure does at any time)."""
    os.sync()
    pathlib.Path("/proc/sys/vm/drop_caches").write_text("3")


async def test_eio_with_the_page_cache_evicted_never_turns_ready_nor_reads_malformed(
    tmp_path,
):
    """The EIO test with the page cache evicted while the device fails (what a busy
    node's memory pressure does at any time): pages whose write-back failed then read
    back from the device, as zeros. Before the fix a read met "database disk image is
    malformed" at once (a traceback; the client's connection closed) and the replica
    could call itself ready again. Now: never ready in place, registrations refused, a
    read either answers every acknowledged event or fails naming the earlier I/O error,
    and the log has no traceback."""
    with loop_ext4(tmp_path, backing="8m", journal=False, errors="continue") as (mnt, _, back):
        async with replica_on(tmp_path, mnt / "data") as (replica, client):
            acked = await fill_until_refused(client)
            assert acked
            for _ in range(3):
                drop_caches()
                await read_all_or_untrusted(replica, acked)
                await probes_keep_failing(replica, EIO, probes=1)
            await assert_untrusted_after_the_device_recovers(replica, client, back)
            drop_caches()
            await read_all_or_untrusted(replica, acked)
            status, body = await readyz(replica)
            assert status == 503 and UNTRUSTED in body["reason"], body
            assert "Traceback" not in replica.log(), replica.log()[-3000:]


async def read_all_or_untrusted(replica, acked) -> None:
    """Every acknowledged event, or a query refused with the cause in the log."""
    try:
        held = await read_all(replica.eventer, {replica.server_id})
    except ConnectionError:
        failed = cause_lines(replica, "failed: ")
        assert failed and UNTRUSTED in failed[-1], replica.log()[-3000:]
    else:
        assert set(acked) <= set(held)
