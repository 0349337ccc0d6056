"""``python -m eventfleet_operator`` runs the operator (same options as ``eventfleet operator``)."""

import sys

from eventfleet_operator.cli import main

sys.exit(main())
