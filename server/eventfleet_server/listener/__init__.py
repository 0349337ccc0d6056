"""Transport-independent admission shared by every protocol: connection caps, message
size before and after init, token policy, one vocabulary of rejection reasons with
rate-limited logging, and the websocket receive loop. (Guarded background tasks:
`eventfleet_server.common.aiotasks`.)"""

from eventfleet_server.listener.admission import Admission, AdmissionLimits, Ticket
from eventfleet_server.listener.reasons import RejectReason
from eventfleet_server.listener.rejections import Rejections
from eventfleet_server.listener.tls import TlsError, TlsSettings, client_context
from eventfleet_server.listener.tokens import (
    Credentials,
    TokenPolicy,
    address_in,
    parse_networks,
    parse_tokens,
)
from eventfleet_server.listener.websocket import receive_text_frames

__all__ = [
    "Admission",
    "Credentials",
    "AdmissionLimits",
    "RejectReason",
    "Rejections",
    "Ticket",
    "TlsError",
    "TlsSettings",
    "TokenPolicy",
    "address_in",
    "client_context",
    "parse_networks",
    "parse_tokens",
    "receive_text_frames",
]
