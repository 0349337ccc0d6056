"""docs/operator.md shows ``kubectl eventfleet status`` as it really prints.

The status is written by real reconciliation passes (``reconcile.reconcile`` against the
in-memory API, three ready replicas reporting their sync state and loaded tokens) and
printed by the plugin's own command, parsed from the documented command line. The
page's ``console`` block must be that output, byte for byte: a change of the status or
of the renderer fails here until the page is updated (run this module with
``EVENTFLEET_UPDATE_DOCS=1`` to rewrite the block, then review the diff).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import pathlib
import re
import shlex

from eventfleet_operator import plugin, tokens
from op_fakes import status_doc
from test_op_rollout import Fleet

PAGE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "operator.md"
BLOCK = re.compile(r"^```console\n\$ (kubectl eventfleet .*? status \S+)\n(.*?)^```\n", re.M | re.S)
# What each replica holds: (session, instance) of the last event of every server.
LAST_IDS = {1: (2, 40), 2: (1, 35), 3: (1, 12)}


def _tokens(fleet: Fleet, secret: str) -> tuple[str, ...]:
    data = fleet.h.kube.obj("Secret", secret)["data"]["token"]
    return tokens.parse(base64.b64decode(data).decode())


def _replicas_report(fleet: Fleet) -> None:
    """Every replica in sync with the others, holding every event, its tokens loaded."""
    client, peer = _tokens(fleet, "demo-token"), _tokens(fleet, "demo-peer-token")
    links = [
        {"name": f"demo-{j}", "server_id": j + 1, "state": "synced", "last_event_id": None,
         "lag_events": 0, "lag_seconds": 0.0}
        for j in range(3)
    ]  # fmt: skip
    for i in range(3):
        doc = status_doc(i + 1, LAST_IDS, peers=[p for p in links if p["server_id"] != i + 1])
        doc["storage"]["events"] = 87
        doc["credentials"] = {
            "client": [tokens.fingerprint(t) for t in client],
            "peer": [tokens.fingerprint(t) for t in peer],
        }
        fleet.h.replicas.docs[i] = doc


def running_fleet() -> dict:
    """The EventServer ``demo`` after the passes that bring three replicas up."""

    async def passes() -> dict:
        fleet = Fleet(3)
        await fleet.run()  # children created, the pods start
        _replicas_report(fleet)
        await fleet.run()
        await fleet.run()
        return copy.deepcopy(fleet.h.body)

    return asyncio.run(passes())


class OneFleetApi:
    """The API as the plugin sees it: one EventServer, in the namespace asked for."""

    def __init__(self, es: dict) -> None:
        self.es = es
        self.default_namespace = "default"

    def get(self, namespace: str, name: str) -> dict:
        assert name == self.es["metadata"]["name"], name
        found = copy.deepcopy(self.es)
        found["metadata"]["namespace"] = namespace
        return found


def printed(command: str, es: dict) -> str:
    """What ``command`` (``kubectl eventfleet ...``) prints for ``es``."""
    argv = shlex.split(command)[2:]
    args = plugin.parser().parse_args(argv)
    api = OneFleetApi(es)
    args.namespace = args.namespace or api.default_namespace
    return plugin.COMMANDS[args.command][0](api, args) + "\n"


def test_the_documented_status_output_is_what_the_plugin_prints():
    text = PAGE.read_text()
    (match,) = BLOCK.finditer(text)
    command, shown = match.group(1), match.group(2)
    out = printed(command, running_fleet())
    if os.environ.get("EVENTFLEET_UPDATE_DOCS") == "1" and out != shown:
        PAGE.write_text(text[: match.start(2)] + out + text[match.end(2) :])
        shown = out
    assert shown == out, f"docs/operator.md's status block is stale; the plugin prints:\n{out}"


def test_the_fleet_behind_the_sample_is_healthy():
    """The sample shows what a user sees on a good day, not a half-built fleet."""
    status = running_fleet()["status"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert status["phase"] == "Running"
    assert conditions["Ready"] == conditions["PeersSynced"] == conditions["TokensLoaded"] == "True"
    assert conditions["Progressing"] == "False"
