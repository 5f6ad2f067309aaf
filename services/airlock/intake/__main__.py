"""`python3 -m airlock.intake`: the airlock-intake service (intake/wake.py, then airlock.intake.service.main)."""

import sys

from airlock.intake.wake import main

sys.exit(main())
