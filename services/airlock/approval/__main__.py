"""`python3 -m airlock.approval`: the airlock-approval service (airlock.approval.service.main)."""

import sys

from airlock.approval.service import main

sys.exit(main())
