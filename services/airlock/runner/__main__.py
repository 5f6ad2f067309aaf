"""`python3 -m airlock.runner`: the airlock-runner service (airlock.runner.service.main)."""

import sys

from airlock.runner.service import main

sys.exit(main())
