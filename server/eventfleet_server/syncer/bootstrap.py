"""Identity safety: learn this server id's highest id from peers before creating events.

Why the Syncer and not an Eventer ``server`` query: the peer list names only Syncer
endpoints, the token rule is the same, and a catch-up of our own server id does not
just report the highest id, it brings the events back (a wiped store recovers its own
history) through the same idempotent merge the mesh uses all the time.

Decision (logged as one ``identity:`` line):

- at least one peer answered: continue above the highest own id now held (``peers``);
- no peer answered within ``syncer.bootstrap_timeout`` but the store holds own events:
  continue above them (``local``; a warning, since a peer may hold newer ones);
- no peer answered and the store holds no own event: start only if
  ``allow_empty_start`` (``empty-start``: first boot of a new fleet), else keep trying
  and stay unready (``waiting``).

The engine always adds its crash margin (``storage.max_uncommitted`` + 1) above the
id it is given, so ids a lagging peer has not seen yet are not reused either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from eventfleet_server.common.model import EventId
from eventfleet_server.storage import Storage
from eventfleet_server.syncer.client import InitRefusedError, Peer, SyncStream
from eventfleet_server.syncer.mesh import Backoff
from eventfleet_server.syncer.wire import ProtocolError

log = logging.getLogger(__name__)


@dataclass
class IdentityDecision:
    source: str  # "peers" | "local" | "empty-start" | "standalone"
    server_id: int
    local_last: EventId | None  # highest own id held before the bootstrap
    learned_last: EventId | None  # highest own id held after it
    answered: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        def eid(i):
            return None if i is None else dict(i._asdict())

        return {
            "source": self.source,
            "server_id": self.server_id,
            "local_last": eid(self.local_last),
            "learned_last": eid(self.learned_last),
            "answered": list(self.answered),
            "unreachable": dict(self.unreachable),
            "seconds": round(self.seconds, 3),
        }


async def bootstrap_identity(
    *,
    server_id: int,
    storage: Storage,
    peers: Callable[[], list[Peer]],
    make_stream: Callable[[Peer, int], SyncStream],
    timeout: float,
    grace: float,
    allow_empty_start: bool,
    retry_delay: float = 1.0,
) -> IdentityDecision:
    """Run the own-id catch-up against every peer and decide (see the module doc).

    Returns only when starting is allowed; while it is not, retries every
    `retry_delay` seconds (cancel to give up).
    """
    local_last = storage.last_ids.get(server_id)
    while True:
        started = time.monotonic()
        current = peers()
        answered, unreachable = (
            await _ask_peers(current, server_id, make_stream, timeout, grace)
            if current
            else ([], {})
        )
        held = storage.last_ids.get(server_id)
        decision = IdentityDecision(
            source="",
            server_id=server_id,
            local_last=local_last,
            learned_last=held,
            answered=answered,
            unreachable=unreachable,
            seconds=time.monotonic() - started,
        )
        if answered:
            decision.source = "peers"
            log.info(
                "identity: server_id=%s learned from peers %s: highest own id %s "
                "(local store had %s)%s",
                server_id,
                answered,
                _fmt(held),
                _fmt(local_last),
                f"; unreachable: {unreachable}" if unreachable else "",
            )
            return decision
        if held is not None:
            decision.source = "local" if current else "standalone"
            log.log(
                logging.WARNING if current else logging.INFO,
                "identity: server_id=%s %s; continuing above the local store's highest own id %s%s",
                server_id,
                f"no peer answered within {timeout} s" if current else "no peers configured",
                _fmt(held),
                f" (unreachable: {unreachable})" if unreachable else "",
            )
            return decision
        if allow_empty_start:
            decision.source = "empty-start" if current else "standalone"
            log.info(
                "identity: server_id=%s holds no own event and %s; starting a new identity "
                "(allow_empty_start=true)%s",
                server_id,
                f"no peer answered within {timeout} s" if current else "no peers are configured",
                f" (unreachable: {unreachable})" if unreachable else "",
            )
            return decision
        log.error(
            "identity: server_id=%s holds no own event, %s and allow_empty_start=false: "
            "not starting; retrying in %.0f s%s",
            server_id,
            f"no peer answered within {timeout} s" if current else "no peers are configured",
            retry_delay,
            f" (unreachable: {unreachable})" if unreachable else "",
        )
        await asyncio.sleep(retry_delay)


async def _ask_peers(
    peers: list[Peer],
    server_id: int,
    make_stream: Callable[[Peer, int], SyncStream],
    timeout: float,
    grace: float,
) -> tuple[list[str], dict[str, str]]:
    """Catch up on `server_id` from every peer, retrying refused connections.

    Ends when every peer answered, `grace` seconds after the first answer, or at
    `timeout`. A peer "answers" when the catch-up completed or it refused the init
    (it holds none of our events); a refused TCP connection is retried, since peers
    of a fleet that starts at once open their ports at slightly different times.
    """
    answered: list[str] = []
    errors: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    first_answer = asyncio.Event()
    streams: dict[str, SyncStream] = {}

    async def ask(peer: Peer) -> None:
        backoff = Backoff(0.2, 2.0)
        stream = streams[peer.name] = make_stream(peer, server_id)
        while True:
            try:
                await stream.run(until_synced=True)
            except InitRefusedError as e:
                log.info("identity: peer=%s holds none of our events (%s)", peer.name, e)
            except (ConnectionError, OSError, TimeoutError, ProtocolError) as e:
                errors[peer.name] = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                if loop.time() >= deadline:
                    return
                await asyncio.sleep(min(backoff.next(), max(deadline - loop.time(), 0)))
                continue
            errors.pop(peer.name, None)
            answered.append(peer.name)
            first_answer.set()
            return

    tasks = {p.name: loop.create_task(ask(p)) for p in peers}
    try:
        all_done = loop.create_task(asyncio.wait(tasks.values()))
        answer = loop.create_task(first_answer.wait())
        await asyncio.wait({all_done, answer}, timeout=timeout, return_when="FIRST_COMPLETED")
        if not all_done.done() and first_answer.is_set():
            remaining = max(0.0, min(grace, deadline - loop.time()))
            await asyncio.wait({all_done}, timeout=remaining)
        all_done.cancel()
        answer.cancel()
        # A catch-up in progress is never cut short: the rest of our history may be in
        # it, and starting before it ends could reuse ids. Only idle retries are dropped.
        for name, task in tasks.items():
            if not task.done() and not streams[name].stats.connected:
                task.cancel()
        busy = [t for t in tasks.values() if not t.done()]
        if busy:
            log.info("identity: waiting for %d catch-up(s) in progress", len(busy))
            await asyncio.wait(busy)
    finally:
        for t in tasks.values():
            t.cancel()
        for t in tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    unreachable = {p.name: errors.get(p.name, "no answer") for p in peers if p.name not in answered}
    return answered, unreachable


def _fmt(i: EventId | None) -> str:
    return "none" if i is None else f"(session={i.session}, instance={i.instance})"
