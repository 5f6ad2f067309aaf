import sys

from airlock.relay.service import main

sys.exit(main())
