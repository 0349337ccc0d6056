"""The follow-up timer: which statuses the operator re-checks within seconds."""

from __future__ import annotations

import kopf
import pytest
from eventfleet_operator import followup, handlers
from eventfleet_operator.config import OperatorConfig


def conditions(**by_type):
    """Conditions from ``Type=(status, reason)``."""
    return {
        "conditions": [
            {"type": t, "status": s, "reason": r} for t, (s, r) in sorted(by_type.items())
        ]
    }


READY = ("True", "AllReplicasReady")
DONE = ("False", "RolloutComplete")


@pytest.mark.parametrize(
    "status, needed",
    [
        (None, False),  # never reconciled: the create handler runs the pass
        (conditions(Ready=READY, Progressing=DONE), False),  # idle: the resync alone
        (
            conditions(Ready=("False", "RolloutInProgress"), Progressing=("True", "RollingOut")),
            True,
        ),
        # A rollout's tail: Ready may already say something else; Progressing decides.
        (conditions(Ready=("False", "ApplyFailed"), Progressing=("True", "RollingOut")), True),
        (conditions(Ready=("False", "ReplicasNotReady"), Progressing=DONE), True),  # starting
        (conditions(Ready=("False", "StatefulSetStatusStale"), Progressing=DONE), True),
        # What only a spec change, a Secret or an operator ends: no polling.
        (conditions(Ready=("False", "InvalidSpec"), Progressing=DONE), False),
        (conditions(Ready=("False", "TokenSecretNotFound"), Progressing=DONE), False),
        # The token reload it took over from the tokens-settling timer.
        (conditions(Ready=READY, TokensLoaded=("False", "TokensReloading")), True),
        ({**conditions(Ready=READY), "peerTokenRotation": {"step": "Swapping"}}, True),
        # A volume growth: the claims' capacity and the StatefulSet's recreation.
        (conditions(Ready=READY, StorageResizing=("True", "Resizing")), True),
        (conditions(Ready=READY, StorageResizing=("False", "Resized")), False),
    ],
)
def test_which_statuses_are_followed_up(status, needed):
    assert followup.needed(status) is needed


def test_one_follow_up_timer_filtered_by_followup_needed_at_most_every_resync():
    def timers(resync):
        registry = kopf.OperatorRegistry()
        handlers.register(registry, OperatorConfig(namespaces=("ns",), resync_seconds=resync))
        return {h.id: h for h in registry._spawning.get_all_handlers()}

    found = timers(30)
    assert sorted(found) == ["backup-retry", "follow-up", "resync"]
    timer = found["follow-up"]
    assert timer.interval == timer.initial_delay == handlers.FOLLOW_UP_SECONDS
    rolling = conditions(Progressing=("True", "RollingOut"))
    assert timer.when(status=rolling, spec={}, body={"status": rolling}) is True
    idle = conditions(Ready=READY, Progressing=DONE)
    assert timer.when(status=idle, spec={}, body={"status": idle}) is False
    assert timers(2)["follow-up"].interval == 2  # never slower than the resync


def test_a_deleted_fleets_timers_are_checked_for_exit_every_second():
    """Deleting an EventServer while its follow-up or resync timer runs a pass waits for
    that pass; Kopf re-checks a stopping timer every `cancellation_polling` seconds, 60 by
    default, which made `kubectl delete` take a minute (seen on the real cluster). The
    operator's settings check at least as often as its fastest timer runs."""
    defaults = kopf.OperatorSettings()
    assert defaults.background.cancellation_polling == 60  # what the operator overrides
    settings = kopf.OperatorSettings()
    handlers.configure_settings(settings, OperatorConfig(namespaces=("ns",)))
    assert settings.background.cancellation_polling == handlers.TIMER_EXIT_POLL_SECONDS
    assert handlers.TIMER_EXIT_POLL_SECONDS <= handlers.FOLLOW_UP_SECONDS
