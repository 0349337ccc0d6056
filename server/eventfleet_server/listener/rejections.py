"""Counting and rate-limited logging of refusals."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from eventfleet_server.listener.reasons import RejectReason

log = logging.getLogger(__name__)


class Rejections:
    """Counts refusals of one protocol by reason and logs them without flooding the log.

    The first refusal of a reason in an interval is logged at once, with its detail; the
    ones after it in the same interval are only counted, and summarised in one line
    ("N more ... in the last T s") when the next one arrives after the interval or when
    `flush` is called. A flood of bad connections therefore costs one or two log lines
    per reason per interval, whatever its size.
    """

    def __init__(
        self,
        protocol: str,
        *,
        log_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ):
        self.protocol = protocol
        self._interval = log_interval
        self._clock = clock
        self._log = logger
        self._counts: dict[str, int] = {}
        self._last: dict[str, str] = {}  # reason -> detail of its latest refusal
        # reason -> (start of the current log window, refusals suppressed in it)
        self._windows: dict[str, tuple[float, int]] = {}

    @property
    def counts(self) -> dict[str, int]:
        """Refusals so far by reason value (a copy)."""
        return dict(self._counts)

    def last(self, reason: RejectReason | str) -> str | None:
        """The detail of the latest refusal of `reason` (logged or not), None if none."""
        return self._last.get(RejectReason(reason).value)

    def reject(self, reason: RejectReason, detail: str, peer: str | None = None) -> None:
        """Count one refusal of `reason`; log it unless this reason was logged recently."""
        reason = RejectReason(reason)
        self._counts[reason.value] = self._counts.get(reason.value, 0) + 1
        self._last[reason.value] = detail
        now = self._clock()
        window = self._windows.get(reason.value)
        if window is not None and now - window[0] < self._interval:
            self._windows[reason.value] = (window[0], window[1] + 1)
            return
        if window is not None and window[1]:
            self._summarise(reason.value, window, now)
        self._windows[reason.value] = (now, 0)
        where = f" from {peer}" if peer else ""
        self._log.warning("%s refused%s (%s): %s", self.protocol, where, reason.value, detail)

    def flush(self) -> None:
        """Log the pending summaries now (e.g. at shutdown)."""
        now = self._clock()
        for reason, window in list(self._windows.items()):
            if window[1]:
                self._summarise(reason, window, now)
                self._windows[reason] = (now, 0)

    def _summarise(self, reason: str, window: tuple[float, int], now: float) -> None:
        self._log.warning(
            "%s refused %d more (%s) in the last %.0f s; total %d",
            self.protocol,
            window[1],
            reason,
            now - window[0],
            self._counts[reason],
        )
