"""The replica's garbage-collector settings, applied once it has started.

Why: CPython's cyclic collector walks every tracked container of a generation when it
collects it. A started replica holds a few hundred thousand long-lived objects (the
imported modules: aiohttp, hat, zmq, the SBS repository, ...) that never become garbage,
and every full collection walked them all again: 160 ms each, 1.9 s of the event loop's
CPU in one 100,000-PUB Event BUS run (`gc.callbacks` timing, docs/performance.md). The
hot paths allocate a few short-lived tuples per event, so at the default gen-0
threshold (700) the collector ran every ~70 events and promoted in-flight objects (a
commit's pending events) into the older generations that full collections walk.

`settle` moves everything alive after start-up into the permanent generation
(`gc.freeze`: never walked again, never freed — it is never garbage) and raises the
gen-0 threshold so young collections run ~15 times less often. Cycles are still
collected; garbage that is only cyclic lives a little longer (at most ~10,000
allocations), which the memory soak bounds.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

GEN0_THRESHOLD = 10_000


def settle() -> None:
    """Freeze what start-up built and set the collection thresholds (call once, after
    the replica has started)."""
    gc.collect()  # start-up's own garbage, not frozen with the rest
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    log.debug("gc: %d objects frozen, thresholds %s", gc.get_freeze_count(), gc.get_threshold())
