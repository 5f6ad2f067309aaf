"""`python3 -m airlock.intake`: the airlock-intake service (airlock.intake.service.main)."""

import sys

from airlock.intake.service import main

sys.exit(main())
