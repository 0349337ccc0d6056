"""Kubelet probes stay out of the operator's log at INFO.

Kopf serves the liveness endpoint (``--liveness``) with aiohttp's default access log, so
every kubelet probe (every few seconds, per probe) wrote an INFO line such as
``GET /healthz HTTP/1.1" 200 ... "kube-probe/1.34"``: what an operator reads at 3 a.m.
should be the reconciliations, not the probes. Successful probe requests are demoted to
DEBUG (shown with ``--verbose``); a failing probe and every other request keep their
INFO access line.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterable

ACCESS_LOGGER = "aiohttp.access"
PROBE_AGENT = "kube-probe/"  # the kubelet's User-Agent: kube-probe/<major>.<minor>


class ProbeAccessFilter(logging.Filter):
    """Demotes the access line of a successful probe request to DEBUG.

    A probe request is a GET of one of `paths` or any request from the kubelet's
    prober (its User-Agent); successful means a status below 400.
    """

    def __init__(self, paths: Iterable[str] = ()):
        super().__init__()
        self.paths = frozenset(paths)

    def is_probe(self, record: logging.LogRecord) -> bool:
        # aiohttp's AccessLogger passes the parts of the line as `extra` attributes.
        agent = (getattr(record, "request_header", None) or {}).get("User-Agent") or ""
        method, _, rest = str(getattr(record, "first_request_line", "")).partition(" ")
        path = urllib.parse.urlsplit(rest.rpartition(" ")[0] or rest).path
        return agent.startswith(PROBE_AGENT) or (method == "GET" and path in self.paths)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not self.is_probe(record):
            return True
        try:
            status = int(getattr(record, "response_status", 0))
        except (TypeError, ValueError):
            status = 0
        if not 100 <= status < 400:
            return True  # a failing probe is worth a line
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def install(liveness_endpoint: str | None) -> ProbeAccessFilter:
    """Put the filter on aiohttp's access logger (once), for the liveness path of
    `liveness_endpoint` (``http://0.0.0.0:8080/healthz``) and kubelet requests."""
    logger = logging.getLogger(ACCESS_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, ProbeAccessFilter):
            logger.removeFilter(existing)
    path = urllib.parse.urlsplit(liveness_endpoint).path if liveness_endpoint else ""
    probe_filter = ProbeAccessFilter([path] if path else [])
    logger.addFilter(probe_filter)
    return probe_filter
