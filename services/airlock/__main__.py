"""`python3 -m airlock`: the `airlock` command (airlock.cli.main.main)."""

import sys

from airlock.cli.main import main

sys.exit(main())
