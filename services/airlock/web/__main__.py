"""`python3 -m airlock.web`: airlock-web, the browser console (airlock.web.service.main)."""

import sys

from airlock.web.service import main

sys.exit(main())
