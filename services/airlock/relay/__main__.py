"""`python3 -m airlock.relay`: airlock-notify, the relay (airlock.relay.service.main)."""

import sys

from airlock.relay.service import main

sys.exit(main())
