"""The replica's collector settings (`gctune.settle`, called once started)."""

from __future__ import annotations

import gc

from eventfleet_server import gctune


def test_settle_freezes_start_up_objects_and_raises_gen0_threshold():
    before = gc.get_threshold()
    try:
        gctune.settle()
        assert gc.get_freeze_count() > 0  # start-up's objects: never walked again
        assert gc.get_threshold() == (gctune.GEN0_THRESHOLD, *before[1:])
        assert gc.isenabled()  # cycles are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
