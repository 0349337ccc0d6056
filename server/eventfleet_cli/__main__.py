import sys

from eventfleet_cli import main

sys.exit(main())
