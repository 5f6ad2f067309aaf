import sys

from airlock.intake.service import main

sys.exit(main())
