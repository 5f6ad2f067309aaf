import sys

from airlock.runner.service import main

sys.exit(main())
