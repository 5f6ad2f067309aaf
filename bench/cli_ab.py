"""`airlock run -- true` as installed, two trees side by side, runs alternating with `sudo -n true`.

    .venv/bin/python bench/cli_ab.py --before /work/main [--runs 100]

Each tree gets a copy of its package in a folder of its own and the console
script its .deb would install: ``packaging/debian/airlock-console`` when the
tree has one, else what pybuild writes (``#!/usr/bin/python3``, ``import re,
sys``).  Both send to one `airlock dev up` of this tree (the services are
the same for both: the figure is the client's start and request), in turn
with sudo (as root, with the bench's NOPASSWD user).  Prints the medians,
each against sudo, and after/before.  Not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from harness import REPO, BenchStack, bench_config, sudo_yardstick, time_subprocess

PYBUILD = (
    "#!/usr/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
    "sys.path.insert(0, {lib!r})\n"
    "from airlock.cli.quick import main\nif __name__ == '__main__':\n"
    "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
    "    sys.exit(main())\n"
)


def layout(tree: Path, into: Path) -> Path:
    """The tree's package and its console script under ``into``; the script's path."""
    lib = into / "dist-packages"
    shutil.copytree(tree / "services" / "airlock", lib / "airlock", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["/usr/bin/python3", "-m", "compileall", "-q", str(lib)], check=True)
    console = tree / "packaging" / "debian" / "airlock-console"
    if console.exists():
        text = console.read_text().replace('"/usr/lib/python3/dist-packages"', repr(str(lib)))
    else:
        text = PYBUILD.format(lib=str(lib))
    script = into / "airlock"
    script.write_text(text)
    script.chmod(0o755)
    os.chmod(into, 0o755)
    return script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True, type=Path, help="the checkout to compare with (its top folder)")
    parser.add_argument("--runs", type=int, default=100, help="runs of each (default 100)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="airlock-cli-ab-", dir="/var/tmp"))
    os.chmod(work, 0o755)
    try:
        scripts = {"before": layout(args.before.resolve(), work / "before"), "after": layout(REPO, work / "after")}
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        root = os.geteuid() == 0
        with sudo_yardstick() as user, BenchStack(bench_config(work / "bench.yaml", root=root)) as stack:
            tail = ["run", "--socket", stack.agent, *([] if root else ["--no-privilege"]), "--", "true"]
            runs: dict[str, list[float]] = {"before": [], "after": [], "sudo": []}
            for _ in range(args.runs):
                for name, script in scripts.items():
                    runs[name].append(time_subprocess([str(script), *tail], env=env) * 1000)
                if user is not None:
                    runs["sudo"].append(time_subprocess(["sudo", "-n", "/usr/bin/true"], user=user) * 1000)
        sudo = statistics.median(runs["sudo"]) if runs["sudo"] else None
        for name in ("before", "after"):
            value = statistics.median(runs[name])
            against = f"  {value / sudo:.2f}x sudo ({sudo:.2f} ms)" if sudo else ""
            print(f"{name:6} p50 {value:7.2f} ms{against}")
        after_before = statistics.median(runs["after"]) / statistics.median(runs["before"])
        print(f"after/before p50: {after_before:.3f}  (load average {os.getloadavg()[0]:.2f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
