"""Transport-independent admission shared by every protocol: connection caps, message
size before and after init, token policy, one vocabulary of rejection reasons with
rate-limited logging, and guarded background tasks."""

from eventfleet_server.listener.admission import Admission, AdmissionLimits, Ticket
from eventfleet_server.listener.reasons import RejectReason
from eventfleet_server.listener.rejections import Rejections
from eventfleet_server.listener.tasks import TaskFailed, Tasks
from eventfleet_server.listener.tls import TlsError, TlsSettings, client_context
from eventfleet_server.listener.tokens import (
    Credentials,
    TokenPolicy,
    address_in,
    parse_networks,
    parse_tokens,
)

__all__ = [
    "Admission",
    "Credentials",
    "AdmissionLimits",
    "RejectReason",
    "Rejections",
    "TaskFailed",
    "Tasks",
    "Ticket",
    "TlsError",
    "TlsSettings",
    "TokenPolicy",
    "address_in",
    "client_context",
    "parse_networks",
    "parse_tokens",
]
