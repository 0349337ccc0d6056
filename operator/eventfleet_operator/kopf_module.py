"""For ``kopf run -m eventfleet_operator.kopf_module [--namespace NS | --all-namespaces]``.

Kopf's own CLI owns the options here, so the operator's settings come from the
``EVENTFLEET_OPERATOR_*`` environment variables (see :mod:`eventfleet_operator.config`).
Importing this module registers the handlers into Kopf's default registry.
"""

import kopf

from eventfleet_operator import handlers
from eventfleet_operator.config import OperatorConfig

handlers.register(kopf.get_default_registry(), OperatorConfig.from_env())
