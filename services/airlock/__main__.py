import sys

from airlock.cli.main import main

sys.exit(main())
