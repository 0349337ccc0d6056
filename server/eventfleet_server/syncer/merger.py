"""One merge queue for every Syncer stream of a replica.

Why one queue: events of one server id can reach us on several streams (from the server
itself and relayed by other peers). Merging them one commit at a time, in arrival order,
keeps every server id's events in the store gap-free below its highest held id, which
is what makes resuming from `Storage.last_ids` correct. It also groups many small
messages into one transaction, which is where catch-up throughput comes from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import Event
from eventfleet_server.engine import Engine
from eventfleet_server.storage import StorageError

log = logging.getLogger(__name__)


class MergeOwner:
    """What a stream exposes to the merger: pending counts and failure."""

    def __init__(self, label: str):
        self.label = label
        self.pending = 0  # received, not yet committed
        self.committed = 0  # new events stored from this owner, ever
        self.error: Exception | None = None
        self.on_error: Callable[[Exception], None] | None = None

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
            if self.on_error:
                self.on_error(error)


class _Item:
    __slots__ = ("future", "owner", "rows")

    def __init__(self, owner: MergeOwner, rows: list[list] | None, future=None):
        self.owner = owner
        self.rows = rows  # merge rows (`storage.merge_rows`) of one MsgEvents; None: a barrier
        self.future = future


class Merger:
    """Serial, batched `Engine.merge_rows` of what the Syncer clients receive."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_queued_events: int = 100_000,
        max_batch_events: int = 20_000,
        committed_cb: Callable[[Sequence[Event]], None] | None = None,
    ):
        self._engine = engine
        self._max_queued = max_queued_events
        self._max_batch = max_batch_events
        self._committed_cb = committed_cb
        self._queue: deque[_Item] = deque()
        self._queued_events = 0
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._task: asyncio.Task | None = None

    @property
    def queued_events(self) -> int:
        return self._queued_events

    def start(self, tasks: Tasks) -> None:
        """Start the merge task (critical: if it ever stops, peers' events stop being
        committed, so its exit stops the replica through `tasks`' owner)."""
        if self._task is None:
            self._tasks = tasks.child("merger")
            self._task = self._tasks.spawn("merge", self._run())

    async def stop(self) -> None:
        """Commit what is queued, then stop."""
        if self._task is None:
            return
        with contextlib.suppress(Exception):
            await self.barrier(MergeOwner("stop"))
        await self._tasks.close()
        self._task = None
        for item in self._queue:
            if item.future is not None and not item.future.done():
                item.future.set_exception(ConnectionError("merger stopped"))
        self._queue.clear()

    async def put(self, owner: MergeOwner, rows: list[list]) -> None:
        """Queue the merge rows of one received session (`rows.decode_rows`) for
        merging; waits while the queue is full.

        Waiting here stops the stream from reading, so TCP pushes back on the peer.
        """
        while not self._room.is_set():
            await self._room.wait()
        self._queue.append(_Item(owner, rows))
        self._queued_events += len(rows)
        owner.pending += len(rows)
        if self._queued_events >= self._max_queued:
            self._room.clear()
        self._wakeup.set()

    def barrier(self, owner: MergeOwner) -> asyncio.Future:
        """A future that resolves once everything queued before it is committed.

        It fails if `owner`'s events could not be stored.
        """
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(_Item(owner, None, fut))
        self._wakeup.set()
        return fut

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                batch = self._take()
                await self._merge(batch)

    def _take(self) -> list[_Item]:
        batch: list[_Item] = []
        count = 0
        while self._queue and count < self._max_batch:
            item = self._queue.popleft()
            batch.append(item)
            if item.rows:
                count += len(item.rows)
        return batch

    async def _merge(self, batch: list[_Item]) -> None:
        items = [i for i in batch if i.rows and i.owner.error is None]
        rows = [r for i in items for r in i.rows]  # type: ignore[union-attr]
        try:
            try:
                inserted: Sequence[Event] = await self._engine.merge_rows(rows) if rows else []
                for item in items:
                    item.owner.committed += len(item.rows)  # type: ignore[arg-type] # dupes too
            except StorageError as e:
                # One stream's bad event must not fail the others: retry item by item (a
                # failed write leaves the rows as they were given).
                log.warning("merge of %d events failed (%s); retrying per stream", len(rows), e)
                retried: list[Event] = []
                for item in items:
                    try:
                        retried += await self._engine.merge_rows(item.rows)  # type: ignore[arg-type]
                    except StorageError as err:
                        item.owner.fail(err)
                inserted = retried
            if inserted and self._committed_cb:
                self._committed_cb(inserted)
        except Exception as e:
            log.exception("merge failed")
            for item in items:
                item.owner.fail(e)
        finally:
            for item in batch:
                if item.rows:
                    item.owner.pending -= len(item.rows)
                    self._queued_events -= len(item.rows)
                elif item.future is not None and not item.future.done():
                    if item.owner.error is not None:
                        item.future.set_exception(item.owner.error)
                    else:
                        item.future.set_result(None)
            if self._queued_events < self._max_queued:
                self._room.set()
