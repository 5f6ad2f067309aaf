import sys

from airlock.approval.service import main

sys.exit(main())
