"""`make bench-units`: bench/units_bench.py inside a booted Debian 12 container.

Boots the system tests' container (tests/system/nspawn.py), installs the
.deb named by AIRLOCK_DEB and runs the benchmark there, where systemd is PID 1.
Extra arguments go to units_bench.py (e.g. ``--jobs 50``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "system"))

from nspawn import booted  # noqa: E402


def main() -> int:
    deb = Path(os.environ["AIRLOCK_DEB"]).resolve()
    with booted() as c:
        shutil.copy(deb, c.root / "root" / deb.name)
        shutil.copy(HERE / "units_bench.py", c.root / "root" / "units_bench.py")
        r = c.run(
            ["apt-get", "install", "-y", "--no-install-recommends", f"/root/{deb.name}"], check=False, timeout=300
        )
        if r.returncode != 0:
            c.run(["apt-get", "update", "-qq"], timeout=300)
            c.run(["apt-get", "install", "-y", "--no-install-recommends", f"/root/{deb.name}"], timeout=300)
        r = c.run(["python3", "/root/units_bench.py", *sys.argv[1:]], check=False, timeout=1800)
        print("\n".join(line for line in r.stdout.splitlines() if "[debug" not in line))
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
        return r.returncode


if __name__ == "__main__":
    sys.exit(main())
