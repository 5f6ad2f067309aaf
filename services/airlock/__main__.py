"""`python3 -m airlock`: the `airlock` command (airlock.cli.quick.main, as the console script)."""

import sys

from airlock.cli.quick import main

sys.exit(main())
