"""Id assignment, group commit and fan-out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from eventfleet_server.common import codec
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import (
    Event,
    EventId,
    QueryParams,
    QueryResult,
    QueryServerParams,
    RegisterEvent,
    Status,
    check_register_event,
    registered_events,
    split_sessions,
    timestamp_from_us,
    timestamp_to_us,
)
from eventfleet_server.storage import SbsResult, Storage, StorageError, StorageFaultError
from eventfleet_server.storage.merge_rows import sessions as row_sessions

log = logging.getLogger(__name__)

Listener = Callable[[list[Event], bool], None]
"""Called with the events of one session and whether they are now persisted.

Listeners run synchronously on the event loop and must not block: they hand events
to their own bounded per-connection queues.
"""

SbsListener = Callable[[list[Event], list[bytes], bool], None]
"""A `Listener` that also gets each event's SBS ``Event`` bytes (the stored form,
aligned with the events): protocols that send SBS join them instead of encoding."""

Encoder = Callable[[list[Event]], list[bytes] | None]
"""Builds the SBS ``Event`` bytes of just-created events (a protocol that holds the
request's bytes splices them: `eventer.decode.event_elements`); None: encode them."""

StatusListener = Callable[[Status], None]

SequenceListener = Callable[[list[tuple[int, Event]]], None]
"""Called after every commit (own registrations and merges) with ``(seq, event)`` of the
inserted events: `seq` is the replica's local storage sequence number, strictly
increasing in commit order and never reused (the Event BUS sequence, Replication usn)."""

# meta: [session, instance, timestamp_us] of the last own event, written when the engine
# stops (and by releases before round 3 on every commit). Commits no longer write it: at
# start the newest own event in the store gives the same (one index seek), and the id
# itself is in `last_ids`, committed with the events; the key only matters when
# retention deleted every recent own event (then it keeps the timestamps monotonic).
_OWN_KEY = "own_last"


class EngineError(Exception):
    """Base class of engine errors."""


class NotOperationalError(EngineError):
    """Registration attempted while the engine is not operational."""


class RegisterError(EngineError):
    """A register request was rejected as a whole (the message names the bad event)."""


class StorageUnavailableError(EngineError):
    """Commits keep failing (disk full, I/O error): registrations are refused until a
    commit succeeds again."""


class Engine:
    """The replica's hub.

    Ids: ``instance`` strictly increases for every event this server id ever creates and
    ``session`` never decreases, across restarts. The last committed own id is stored in
    the same transaction as the events; at most `max_uncommitted` ids can be handed out
    beyond it (registration waits for the writer past that), so on restart the engine
    continues `max_uncommitted` + 1 above the stored id: ids that were shown to
    ``persisted=false`` subscribers but never committed are never reused.
    """

    def __init__(
        self,
        storage: Storage,
        server_id: int,
        *,
        max_uncommitted: int = 100_000,
        max_results_cap: int = 10_000,
        tasks: Tasks,
    ):
        if server_id < 1:
            raise ValueError(f"server_id must be >= 1, got {server_id}")
        self._storage = storage
        self._server_id = server_id
        self._max_uncommitted = max_uncommitted
        self._max_results_cap = max_results_cap
        self._status = Status.STANDBY
        self._listeners: list[Listener] = []
        self._sbs_listeners: list[SbsListener] = []
        self._status_listeners: list[StatusListener] = []
        self._session = 0
        self._instance = 0
        self._last_ts_us = 0
        self._pending: list[Event] = []
        self._pending_sbs: list[bytes] = []  # aligned with _pending
        self._pending_sessions: list[tuple[int, int]] = []  # (start index, end index) per session
        self._pending_futures: list[asyncio.Future] = []
        # Called right after the commit (True) or its failure (False), in the commit's
        # own loop iteration: a protocol's reply leaves without a future callback's turn.
        self._pending_done: list[Callable[[bool], None]] = []
        self._uncommitted = 0
        self._wakeup = asyncio.Event()
        # A commit on the loop's thread is scheduled (`_commit_now`), or the writer task
        # is inside a write: at most one commit runs at a time, in registration order.
        self._commit_scheduled = False
        self._writer_busy = False
        # Set (to the error text) when a commit failed, cleared by the next successful
        # write; while set the replica is not ready and registrations are refused.
        self._commit_failure: str | None = None  # the first failure's cause, kept
        self._commit_failure_latest: str | None = None  # the latest probe's, if other
        self._commit_failures = 0
        self._probe_interval = 1.0
        # The writer is critical: if it ever stops, nothing is committed any more, so its
        # exit stops the replica (through the owner's on_fatal).
        self._tasks = tasks.child("engine")
        self._writer_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set by `start`
        self._sequence_listeners: list[SequenceListener] = []
        self._last_future: asyncio.Future | None = None
        self._own_committed: Event | None = None  # the last own event committed since start
        self._commit_listeners: list[Callable[[int, float], None]] = []
        self._query_listeners: list[Callable[[QueryParams, float], None]] = []
        # Callbacks that raised, by kind (commit, done, query, status, sequence, event): a failing
        # callback (a metrics hook, a protocol's listener) is logged and counted here
        # (``eventfleet_engine_callback_failures_total``), never lets the exception into
        # the writer task or the query.
        self.callback_failures: dict[str, int] = {}

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def server_id(self) -> int:
        return self._server_id

    @property
    def status(self) -> Status:
        return self._status

    @property
    def storage(self) -> Storage:
        return self._storage

    @property
    def last_id(self) -> EventId:
        """The last id this engine handed out (or restored)."""
        return EventId(self._server_id, self._session, self._instance)

    @property
    def max_results_cap(self) -> int:
        return self._max_results_cap

    async def start(self, *, continue_after: EventId | None = None) -> None:
        """Restore id counters and start the writer; status becomes ``starting``.

        `continue_after` is the highest own id learned elsewhere (peers), if any.
        """
        self._set_status(Status.STARTING)
        # Kept: `asyncio.get_running_loop` makes a getpid system call each time (3.11),
        # and a register called it twice.
        self._loop = asyncio.get_running_loop()
        stored = await self._storage.get_meta(_OWN_KEY)
        session, instance, ts_us = stored if stored else (0, 0, 0)
        newest = await self._storage.newest_of_server(self._server_id)
        held = self._storage.last_ids.get(self._server_id)
        candidates = [EventId(self._server_id, session, instance)]
        if newest is not None:
            candidates.append(EventId(self._server_id, newest[0], newest[1]))
            ts_us = max(ts_us, newest[2])
        if held:
            candidates.append(held)
        if continue_after:
            candidates.append(continue_after)
        session = max(c.session for c in candidates)
        instance = max(c.instance for c in candidates)
        if stored or newest or held or continue_after:
            # Skip over ids that may have been handed out but never committed.
            session += self._max_uncommitted + 1
            instance += self._max_uncommitted + 1
        self._session, self._instance, self._last_ts_us = session, instance, ts_us
        log.info(
            "engine starting: server_id=%s next session=%s next instance=%s",
            self._server_id,
            session + 1,
            instance + 1,
        )
        # A store that cannot take writes at start (a restart on a full or read-only
        # volume) is not ready from the start, not only after the first refused
        # registration; the writer then probes it as after a failed commit.
        problem = await self._storage.room_problem()
        if problem is not None:
            self._commit_failed(StorageError(problem), "store not writable at start")
        self._writer_task = self._tasks.spawn("writer", self._writer_loop())

    def set_operational(self) -> None:
        self._set_status(Status.OPERATIONAL)

    async def stop(self) -> None:
        """Status ``stopping``, commit what is pending, stop the writer."""
        self._set_status(Status.STOPPING)
        await self.flush()
        await self._tasks.close()
        self._writer_task = None
        await self._save_own_last()

    async def _save_own_last(self) -> None:
        # Commits do not write it (see `_OWN_KEY`); a clean stop does, once.
        last = self._own_committed
        if last is None:
            return
        value = [last.id.session, last.id.instance, timestamp_to_us(last.timestamp)]
        try:
            await self._storage.write([], {_OWN_KEY: value})
        except Exception as e:
            # Not needed for correct ids (last_ids has them): logged, the stop goes on.
            log.warning("could not store the last own event id at stop: %s", e)

    async def flush(self) -> None:
        """Wait until everything registered so far is committed."""
        # The writer commits in registration order: the newest future is the last to finish.
        if self._last_future is not None:
            await asyncio.gather(self._last_future, return_exceptions=True)

    def _set_status(self, status: Status) -> None:
        if status == self._status:
            return
        log.info("status %s -> %s", self._status.value, status.value)
        self._status = status
        self._notify("status", list(self._status_listeners), status)

    # -- listeners -------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def add_sbs_listener(self, listener: SbsListener) -> Callable[[], None]:
        """Like `add_listener`, with each event's SBS bytes (see `SbsListener`)."""
        self._sbs_listeners.append(listener)
        return lambda: self._sbs_listeners.remove(listener)

    def add_status_listener(self, listener: StatusListener) -> Callable[[], None]:
        self._status_listeners.append(listener)
        return lambda: self._status_listeners.remove(listener)

    def add_sequence_listener(self, listener: SequenceListener) -> Callable[[], None]:
        """Called after each commit with ``(local seq, event)`` pairs (see `SequenceListener`)."""
        self._sequence_listeners.append(listener)
        return lambda: self._sequence_listeners.remove(listener)

    def _fan_out_sequenced(self, inserted: list[tuple[int, Event]]) -> None:
        if not inserted:
            return
        self._notify("sequence", self._sequence_listeners, inserted)

    def add_commit_listener(self, listener: Callable[[int, float], None]) -> Callable[[], None]:
        """Called after each commit with (event count, commit seconds); for metrics."""
        self._commit_listeners.append(listener)
        return lambda: self._commit_listeners.remove(listener)

    def add_query_listener(
        self, listener: Callable[[QueryParams, float], None]
    ) -> Callable[[], None]:
        """Called after each query (also a failed one) with (params, seconds); for metrics."""
        self._query_listeners.append(listener)
        return lambda: self._query_listeners.remove(listener)

    def _fan_out(self, events: list[Event], sbs: list[bytes], persisted: bool) -> None:
        for listener in self._listeners:
            try:
                listener(events, persisted)
            except Exception:
                self._callback_failed("event", listener)
        for sbs_listener in self._sbs_listeners:
            try:
                sbs_listener(events, sbs, persisted)
            except Exception:
                self._callback_failed("event", sbs_listener)

    def _notify(self, kind: str, callbacks: list[Callable[..., None]], *args: Any) -> None:
        """Call each of `callbacks` with `args`; one that raises is logged and counted
        (`callback_failures`) and the others still run."""
        for cb in callbacks:
            try:
                cb(*args)
            except Exception:
                self._callback_failed(kind, cb)

    def _callback_failed(self, kind: str, cb: Callable[..., None]) -> None:
        # Called from an except block: the log carries the traceback.
        self.callback_failures[kind] = self.callback_failures.get(kind, 0) + 1
        name = getattr(cb, "__qualname__", None) or repr(cb)
        log.exception("%s callback %s failed", kind, name)

    # -- registration ----------------------------------------------------------------------

    def register(
        self,
        events: Sequence[RegisterEvent],
        *,
        validated: bool = False,
        encode: Encoder | None = None,
        done: Callable[[bool], None] | None = None,
        timestamp_us: int | None = None,
        prepared: Sequence[Event] | None = None,
    ) -> tuple[list[Event], asyncio.Future]:
        """Create one session from `events`; returns the events and a commit future.

        Synchronous so that protocol handlers can keep reading while the commit runs. The
        request is atomic: it is validated as a whole before any id is assigned, and the
        commit future fails for all of its events or none. `persisted=false` listeners
        see the events before this returns. `validated`: the caller already ran
        `check_register_event` on every event (in chunks, off the hot loop turn).
        `encode`: builds the events' SBS bytes (see `Encoder`); each event is encoded
        once here otherwise. Those bytes are what is stored, notified and answered.
        `done`: called with True right after the commit that holds the events (after
        the ``persisted=true`` listeners), with False if it failed — in the commit's own
        loop iteration, where a callback on the future runs one iteration later.
        `timestamp_us`: the registration's time when the caller took it earlier
        (`next_registration`); never before the previous registration's.
        `prepared`: `events` as `registered_events` made them for that id and time, a
        slice at a time (a maximal request's 10,000 would hold the loop ~10-40 ms here);
        used when the registration got that id and time, else the events are made anew.

        Refused as a whole (`RegisterError`) when the batch would take the ids handed
        out but not committed beyond `max_uncommitted` (the restart id gap relies on
        it), and (`StorageUnavailableError`) while commits keep failing.
        """
        if self._status != Status.OPERATIONAL:
            raise NotOperationalError(f"server is {self._status.value}, not operational")
        if not events:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return [], fut
        if self._commit_failure is not None:
            raise StorageUnavailableError(
                f"storage is failing, registrations are refused: {self._commit_failure}"
            )
        if len(events) > self._max_uncommitted:
            raise RegisterError(
                f"{len(events)} events in one request exceed max_uncommitted "
                f"{self._max_uncommitted}"
            )
        if self._uncommitted + len(events) > self._max_uncommitted:
            raise RegisterError(
                f"too many uncommitted events ({self._uncommitted} + {len(events)} > "
                f"max_uncommitted {self._max_uncommitted}); retry later"
            )
        if not validated:
            for i, e in enumerate(events):
                _validate_register_event(i, e)
        now_us = time.time_ns() // 1000 if timestamp_us is None else timestamp_us
        ts_us = max(now_us, self._last_ts_us)
        self._last_ts_us = ts_us
        ts = timestamp_from_us(ts_us)
        self._session += 1
        session = self._session
        first = self._instance + 1
        self._instance += len(events)
        server = self._server_id
        head = prepared[0] if prepared and len(prepared) == len(events) else None
        if head is not None and head.id == (server, session, first) and head.timestamp == ts:
            created = list(prepared)  # type: ignore[arg-type]
        else:
            created = registered_events(events, EventId(server, session, first), ts)
        try:
            sbs = encode(created) if encode is not None else None
            if sbs is None:
                sbs = [codec.encode_event(e) for e in created]
        except UnicodeEncodeError as e:
            # Text that no UTF-8 can carry (a lone surrogate, which a JSON "\ud800"
            # escape gives) in a type or payload: the request is refused whole, before
            # anything is pending, and its session and ids are given back (no gap).
            self._session -= 1
            self._instance -= len(events)
            raise RegisterError(
                f"event not storable: its text is not valid Unicode ({e.reason}: "
                f"{e.object[e.start : e.end]!r})"
            ) from None
        start = len(self._pending)
        self._pending.extend(created)
        self._pending_sbs.extend(sbs)
        self._pending_sessions.append((start, len(self._pending)))
        fut = self._loop.create_future()  # type: ignore[union-attr]
        self._pending_futures.append(fut)
        if done is not None:
            self._pending_done.append(done)
        self._last_future = fut
        self._uncommitted += len(created)
        self._schedule_commit()
        self._fan_out(created, sbs, False)
        return created, fut

    def next_registration(self) -> tuple[EventId, int]:
        """The first event id and the timestamp (µs) that a `register` made now would
        give, for a caller that prepares a large registration's encoding ahead, a slice
        at a time, then registers with ``timestamp_us`` set to it. Another registration
        in between takes those ids: the caller's `encode` then sees other ids than it
        prepared for and encodes anew."""
        ts_us = max(time.time_ns() // 1000, self._last_ts_us)
        return EventId(self._server_id, self._session + 1, self._instance + 1), ts_us

    def _schedule_commit(self) -> None:
        """Commit what is pending soon. When the store commits on the loop's thread
        (`Storage.can_write_now`) the commit is a plain callback of the next loop
        iteration: everything registered in this iteration (other connections' requests
        included) goes into it, as with the writer task, but without the task's wake-up
        and without a further iteration for each reply. Otherwise the writer task."""
        if self._commit_scheduled:
            return
        if not self._writer_busy and self._storage.can_write_now(len(self._pending)):
            self._commit_scheduled = True
            self._loop.call_soon(self._commit_now)  # type: ignore[union-attr]
        else:
            self._wakeup.set()

    def _commit_now(self) -> None:
        self._commit_scheduled = False
        if not self._pending:
            return
        if (
            self._writer_busy
            or self._commit_failure is not None
            or not self._storage.can_write_now(len(self._pending))
        ):
            self._wakeup.set()  # the writer task takes it (and probes a failing store)
            return
        batch, batch_sbs, sessions, futures, dones, meta = self._take_pending()
        started = time.perf_counter()
        try:
            pairs = self._storage.write_now(batch, meta, encoded=batch_sbs)
        except Exception as e:
            self._write_failed(batch, futures, dones, e)
            # The writer task sleeps until woken: wake it so it probes the failing
            # store (as after a failed merge), or the replica never notices recovery.
            self._wakeup.set()
            return
        self._write_done(batch, batch_sbs, sessions, futures, dones, pairs, started)

    async def register_wait(self, events: Sequence[RegisterEvent]) -> list[Event]:
        """Register and wait until committed."""
        created, fut = self.register(events)
        await fut
        return created

    async def merge(
        self, events: Sequence[Event], encoded: Sequence[bytes] | None = None
    ) -> list[Event]:
        """Store events created elsewhere (replication); returns those that were new.

        `encoded`: their SBS bytes as received (aligned with `events`), stored and
        notified as they are; encoded here if None. Every listener is told after the
        commit, once with ``persisted=False`` and once with ``True``, one session at a
        time.
        """
        if encoded is None:
            encoded = []
            for i, e in enumerate(events):
                try:
                    encoded.append(codec.encode_event(e))
                except (TypeError, ValueError, OverflowError, AttributeError, KeyError) as err:
                    # As a refused write: the merger then retries stream by stream.
                    raise StorageError(f"event {i} {e!r:.300}: does not encode: {err}") from err
        try:
            pairs = await self._storage.write(events, encoded=encoded)
        except StorageFaultError as e:
            # Replicated events meet the same full or failing disk: not ready either, and
            # the writer (woken to notice) probes until the store takes commits again.
            self._commit_failed(e, "merge of replicated events failed")
            self._wakeup.set()
            raise
        inserted = [e for _, e in pairs]
        if len(inserted) == len(events):
            sbs = list(encoded)
        else:
            # `inserted` is a subsequence of `events` (the same objects): pick theirs.
            sbs, j = [], 0
            for e in inserted:
                while events[j] is not e:
                    j += 1
                sbs.append(encoded[j])
                j += 1
        start = 0
        for group in split_sessions(inserted):
            group_sbs = sbs[start : start + len(group)]
            start += len(group)
            self._fan_out(group, group_sbs, False)
            self._fan_out(group, group_sbs, True)
        self._fan_out_sequenced(pairs)
        return inserted

    async def merge_rows(self, rows: list[list]) -> list[Event]:
        """`merge` of events received as merge rows (`storage.merge_rows`, what the
        Syncer decodes a ``MsgEvents`` into): stored without a model object per event;
        the listeners get the events of the committed rows, one session at a time, after
        the commit, as `merge_rows.RowEvents` (a sequence built on first use). Returns
        the new events (a `RowEvents` too).
        """
        try:
            inserted = await self._storage.write_rows(rows)
        except StorageFaultError as e:
            self._commit_failed(e, "merge of replicated events failed")
            self._wakeup.set()
            raise
        if not inserted:
            return []
        events: Sequence[Event] = self._storage.merged_events(inserted)
        built = list(events) if self._sequence_listeners else None  # they take every event
        sbs = [r[10] for r in inserted]
        for start, end in row_sessions(inserted):
            # Otherwise built only if a listener looks past the first event (RowEvents).
            group = (
                built[start:end]
                if built is not None
                else self._storage.merged_events(inserted[start:end])
            )
            group_sbs = sbs[start:end]
            self._fan_out(group, group_sbs, False)  # type: ignore[arg-type]
            self._fan_out(group, group_sbs, True)  # type: ignore[arg-type]
        if built is not None:
            self._fan_out_sequenced([(r[0], e) for r, e in zip(inserted, built, strict=True)])
            return built
        return events  # type: ignore[return-value]

    async def _writer_loop(self) -> None:
        while True:
            if self._commit_failure is None:
                await self._wakeup.wait()
            else:
                # Failing: nothing new is accepted, so probe the store until it commits
                # again (the disk was freed, the I/O error went away).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), self._probe_interval)
                if not self._pending:
                    try:
                        await self._storage.probe_write()
                    except Exception as e:
                        self._commit_failed(e)
                    else:
                        self._commit_succeeded()
            self._wakeup.clear()
            if not self._pending:
                continue
            batch, batch_sbs, sessions, futures, dones, meta = self._take_pending()
            started = time.perf_counter()
            self._writer_busy = True
            try:
                pairs = await self._storage.write(batch, meta, encoded=batch_sbs)
            except Exception as e:
                self._write_failed(batch, futures, dones, e)
                continue
            finally:
                self._writer_busy = False
            self._write_done(batch, batch_sbs, sessions, futures, dones, pairs, started)

    def _take_pending(self) -> tuple:
        """Everything registered and not yet committed, and the own-id meta of its
        last event (stored in the same transaction)."""
        batch, self._pending = self._pending, []
        batch_sbs, self._pending_sbs = self._pending_sbs, []
        sessions, self._pending_sessions = self._pending_sessions, []
        futures, self._pending_futures = self._pending_futures, []
        dones, self._pending_done = self._pending_done, []
        # No meta: the own last id is in last_ids, committed with the events (a `meta`
        # upsert per commit was ~12 µs of a ~45 µs batch-1 transaction).
        return batch, batch_sbs, sessions, futures, dones, None

    def _write_failed(self, batch: list[Event], futures: list, dones: list, e: Exception) -> None:
        log.error("commit of %d events failed: %s", len(batch), e)
        self._commit_failed(e)
        for fut in futures:
            if not fut.done():
                fut.set_exception(EngineError(f"commit failed: {e}"))
        self._release(len(batch))
        self._call_done(dones, False)

    def _write_done(
        self,
        batch: list[Event],
        batch_sbs: list[bytes],
        sessions: list[tuple[int, int]],
        futures: list[asyncio.Future],
        dones: list[Callable[[bool], None]],
        pairs: list[tuple[int, Event]],
        started: float,
    ) -> None:
        elapsed = time.perf_counter() - started
        self._commit_succeeded()
        self._release(len(batch))
        self._own_committed = batch[-1]
        for fut in futures:
            if not fut.done():
                fut.set_result(None)
        for start, end in sessions:
            self._fan_out(batch[start:end], batch_sbs[start:end], True)
        # After the persisted=true listeners, as the future's callbacks ran before.
        self._call_done(dones, True)
        self._fan_out_sequenced(pairs)
        self._notify("commit", self._commit_listeners, len(batch), elapsed)

    def _call_done(self, dones: list[Callable[[bool], None]], ok: bool) -> None:
        self._notify("done", dones, ok)

    def _release(self, count: int) -> None:
        self._uncommitted -= count

    def health(self) -> str | None:
        """None while commits succeed, else why the replica is not ready."""
        if self._commit_failure is None:
            return None
        latest = self._commit_failure_latest
        untrusted = self._storage.untrusted
        if untrusted is not None:
            # No probe can pass (`Storage.untrusted`): say so instead of "retrying".
            return f"storage failing ({self._commit_failures} failed commit(s)): {untrusted}"
        return (
            f"storage failing ({self._commit_failures} failed commit(s), retrying every "
            f"{self._probe_interval:g} s): {self._commit_failure}"
            + ("" if latest is None else f"; latest probe: {latest}")
        )

    def _commit_failed(self, error: Exception, what: str = "commit failed") -> None:
        self._commit_failures += 1
        first = self._commit_failure is None
        cause = f"{type(error).__name__}: {error}"
        if not first:
            # The commit that failed names the fault; later probes (a test write next
            # to the store) may word the same fault differently: both are shown.
            self._commit_failure_latest = cause if cause != self._commit_failure else None
        else:
            self._commit_failure = cause
            log.error(
                "%s, refusing registrations until the storage works again: %s",
                what,
                self._commit_failure,
            )

    def _commit_succeeded(self) -> None:
        if self._commit_failure is not None:
            log.warning(
                "storage works again after %d failed commit(s); registrations accepted",
                self._commit_failures,
            )
        self._commit_failure = None
        self._commit_failure_latest = None
        self._commit_failures = 0

    # -- queries ---------------------------------------------------------------------------

    async def query(self, params: QueryParams) -> QueryResult:
        """Run a query; a `server` query with ``persisted=False`` includes uncommitted events."""
        started = time.perf_counter()
        try:
            return await self._query(params)
        finally:
            elapsed = time.perf_counter() - started
            self._notify("query", self._query_listeners, params, elapsed)

    async def query_sbs(self, params: QueryParams) -> SbsResult:
        """`query` answered with each event's stored SBS bytes (what Eventer sends)."""
        started = time.perf_counter()
        try:
            result = await self._storage.query_sbs(params, max_results_cap=self._max_results_cap)
            if self._wants_pending(params, result.more_follows):
                # Committed ones come first; the pending ones follow, above the last id
                # returned (ids grow with the pending list's order).
                after = params.last_event_id.instance if params.last_event_id else 0
                if result.events:
                    after = max(after, self._last_committed_instance(result))
                extra, more = self._pending_tail(params, len(result.events), after)
                result = SbsResult(result.events + [self._pending_sbs[i] for i in extra], more)
            return result
        finally:
            elapsed = time.perf_counter() - started
            self._notify("query", self._query_listeners, params, elapsed)

    def _wants_pending(self, params: QueryParams, more_follows: bool) -> bool:
        """A ``server`` query for this server's not-yet-persisted events that the store
        answered in full: the events still waiting for their commit follow."""
        return (
            isinstance(params, QueryServerParams)
            and not params.persisted
            and params.server_id == self._server_id
            and bool(self._pending)
            and not more_follows
        )

    def _pending_tail(
        self, params: QueryServerParams, returned: int, after: int
    ) -> tuple[list[int], bool]:
        """Indices of the pending events above instance `after` that fit beside the
        `returned` committed ones, and whether more follow."""
        limit = min(params.max_results or self._max_results_cap, self._max_results_cap)
        extra = [i for i, e in enumerate(self._pending) if e.id.instance > after]
        room = max(limit - returned, 0)
        return extra[:room], len(extra) > room

    @staticmethod
    def _last_committed_instance(result: SbsResult) -> int:
        return codec.repo.decode("HatEventer.Event", result.events[-1])["id"]["instance"]

    async def _query(self, params: QueryParams) -> QueryResult:
        result = await self._storage.query(params, max_results_cap=self._max_results_cap)
        if self._wants_pending(params, result.more_follows):
            after = result.events[-1].id.instance if result.events else 0
            if params.last_event_id:
                after = max(after, params.last_event_id.instance)
            extra, more = self._pending_tail(params, len(result.events), after)
            result = QueryResult(result.events + [self._pending[i] for i in extra], more)
        return result


def _validate_register_event(i: int, e: RegisterEvent) -> None:
    try:
        check_register_event(i, e)
    except ValueError as err:
        raise RegisterError(str(err)) from None
