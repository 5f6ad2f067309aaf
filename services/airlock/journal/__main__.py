"""`python3 -m airlock.journal`: the airlock-journal service (airlock.journal.service.main)."""

import sys

from airlock.journal.service import main

sys.exit(main())
