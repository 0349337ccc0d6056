"""The Jetstream demo page in a real browser: two headless Chromium pages on two replicas
of an ``eventfleet fleet`` see each other's edits live.

Chromium is Debian's (scripts/tools/chromium.sh), driven by playwright-core from npm
(scripts/tools/jetstream.sh); the page uses the bundled reference client (jetstream-js).
The screenshots of both pages are kept in $EVENTFLEET_ARTIFACTS/jetstream (default
<repo>/.artifacts/jetstream), with the two side by side (``picture.png``). That picture
is the one docs/jetstream.md shows: ``EVENTFLEET_UPDATE_SCREENSHOTS=1`` writes it to
docs/img/jetstream-demo.png (review it, then commit it); otherwise the run checks that
the committed picture is there, is referenced by the page and shows what the browsers
were checked to show (both lists with their items, one ticked).
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from e2e.browser import artifacts, chromium, png_size, run_driver, updating_pictures
from e2e.fleet_helpers import FleetProc, free_block
from e2e.jetstream.refclient import ROOT, ensure_tools

pytestmark = pytest.mark.slow

BROWSER_JS = pathlib.Path(__file__).parent / "jetstream" / "browser.js"
DOC_PICTURE = ROOT / "docs" / "img" / "jetstream-demo.png"


async def test_two_browsers_on_two_replicas_see_each_others_edits(tmp_path):
    ensure_tools()
    chromium()  # installed before the fleet starts
    shots = artifacts("jetstream")
    fleet = FleetProc(tmp_path / "fleet", 2, base_port=free_block(2)).start()
    try:
        up = await fleet.wait_up()
        token = (tmp_path / "fleet" / "token").read_text().strip()
        names = sorted(up)
        pages = [f"{up[name]['jetstream_demo']}?token={token}&scope=browser" for name in names]
        captions = [f"browser {i + 1}: {n}" for i, n in enumerate(names)]
        picture = DOC_PICTURE if updating_pictures() else shots / "picture.png"
        picture.parent.mkdir(parents=True, exist_ok=True)
        result = await run_driver(
            BROWSER_JS,
            *pages,
            str(shots),
            str(picture),
            env={"PICTURE_CAPTIONS": json.dumps(captions)},
        )
        assert result["ok"], result
        assert result["steps"][-1] == "page one sees the tick made on page two"
        assert sorted(result["page1"]) == sorted(result["page2"]) and len(result["page1"]) == 2
        for shot in result["screenshots"]:
            assert os.path.getsize(shot) > 1000  # noqa: ASYNC240 - a stat after the run
        # What the picture shows was checked above in both browsers: the two items, the
        # first ticked. The committed one must be such a picture, and the one the page shows.
        assert result["page1"] == ["added on page one", "added on page two"], result
        assert png_size(picture)[0] > 1600, png_size(picture)  # two 800 px pages
        assert png_size(DOC_PICTURE)[0] > 1600, "docs/img/jetstream-demo.png: rerun with update"
        page = (ROOT / "docs" / "jetstream.md").read_text()
        assert "](img/jetstream-demo.png)" in page, "docs/jetstream.md does not show the picture"
    finally:
        fleet.stop()
