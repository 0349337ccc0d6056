"""Transport-independent admission shared by every protocol: connection caps, message
size before and after init, token policy, one vocabulary of rejection reasons with
rate-limited logging, and guarded background tasks."""

from eventfleet_server.listener.admission import Admission, AdmissionLimits, Ticket
from eventfleet_server.listener.reasons import RejectReason
from eventfleet_server.listener.rejections import Rejections
from eventfleet_server.listener.tasks import TaskFailed, Tasks
from eventfleet_server.listener.tokens import TokenPolicy

__all__ = [
    "Admission",
    "AdmissionLimits",
    "RejectReason",
    "Rejections",
    "TaskFailed",
    "Tasks",
    "Ticket",
    "TokenPolicy",
]
