import sys

from airlock.journal.service import main

sys.exit(main())
