"""`make bench-system`: cold start under real socket activation, in the system tests' Debian 12 container.

Boots the container (tests/system/nspawn.py), installs the .deb named by
AIRLOCK_DEB, adds an agent user and a rule that allows ``/usr/bin/true``,
then, round after round: stops every airlock service (the sockets stay
listening, as after an idle exit), and times the first ``airlock run
--no-privilege -- true`` typed by the agent, from process start to exit --
systemd starts intake, approval, runner and journal on demand.  Then the
same command with every service running (warm), in the same rounds.

    AIRLOCK_DEB=dist/airlock_*.deb .venv/bin/python bench/cold_container.py [--rounds N] [--json FILE]

Prints one line per figure; with ``--json`` writes them for airlock_bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "system"))

from nspawn import booted  # noqa: E402

POLICY = """\
rules:
  - name: bench-true
    decision: allow
    groups: [airlock]
    privileged: false
    commands:
      - [/usr/bin/true]
"""

# Runs inside the container as root; prints one JSON object.
INNER = r"""
import grp, json, os, statistics, subprocess, sys, time
SERVICES = ["airlock-intake.service", "airlock-approval.service", "airlock-runner.service", "airlock-journal.service"]
rounds, warm_runs = int(sys.argv[1]), int(sys.argv[2])
gid = grp.getgrnam("airlock").gr_gid
env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/home/agent1"}

def run():
    start = time.perf_counter()
    r = subprocess.run(["/usr/bin/airlock", "run", "--no-privilege", "--", "true"], user="agent1", group="agent1",
                       extra_groups=[gid], env=env, stdin=subprocess.DEVNULL, capture_output=True)
    took = (time.perf_counter() - start) * 1000
    if r.returncode != 0:
        # What the services said, so a failed cold start can be understood from the bench's output.
        logs = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "-n", "60", "-u", "airlock-*"],
                              capture_output=True, text=True).stdout
        raise SystemExit(f"airlock run failed ({r.returncode}): {r.stderr.decode()[-500:]}\n{logs}")
    return took

def all_stopped():
    subprocess.run(["systemctl", "stop", *SERVICES], check=True)
    # Rounds start each service more often than StartLimitBurst allows in StartLimitIntervalSec
    # (5 in 10 s): an operator would never; reset the counter so the bench measures start-up.
    subprocess.run(["systemctl", "reset-failed", *SERVICES], check=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = subprocess.run(["systemctl", "is-active", *SERVICES], capture_output=True, text=True).stdout.split()
        if all(s in ("inactive", "failed") for s in states):
            return
        time.sleep(0.05)
    raise SystemExit(f"services did not stop: {states}")

run()  # first start after install: not counted (migrations, caches)
cold, warm = [], []
for _ in range(rounds):
    all_stopped()
    time.sleep(0.5)
    cold.append(run())
    warm += [run() for _ in range(warm_runs)]
bare = []
for _ in range(rounds * warm_runs):
    start = time.perf_counter()
    subprocess.run(["/usr/bin/true"], user="agent1")
    bare.append((time.perf_counter() - start) * 1000)
print(json.dumps({"cold": cold, "warm": warm, "bare": bare,
                  "loadavg": os.getloadavg(), "python": sys.version.split()[0]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warm", type=int, default=10, help="warm runs per round")
    parser.add_argument("--json", help="write the samples here")
    args = parser.parse_args()
    deb = Path(os.environ["AIRLOCK_DEB"]).resolve()
    with booted() as c:
        shutil.copy(deb, c.root / "root" / deb.name)
        r = c.run(
            ["apt-get", "install", "-y", "--no-install-recommends", f"/root/{deb.name}"], check=False, timeout=300
        )
        if r.returncode != 0:
            c.run(["apt-get", "update", "-qq"], timeout=300)
            c.run(["apt-get", "install", "-y", "--no-install-recommends", f"/root/{deb.name}"], timeout=300)
        c.run(["useradd", "--create-home", "--groups", "airlock", "agent1"])
        c.write("/etc/airlock/policy.d/50-bench.yaml", POLICY)
        c.run(["systemctl", "reload-or-restart", "airlock-approval.service"], check=False)
        c.write("/root/cold_inner.py", INNER)
        r = c.run(["python3", "/root/cold_inner.py", str(args.rounds), str(args.warm)], check=False, timeout=1800)
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-3000:], file=sys.stderr)
            return r.returncode
        result = json.loads(r.stdout.strip().splitlines()[-1])
    for name in ("cold", "warm", "bare"):
        samples = sorted(result[name])
        print(
            f"{name:5} p50 {samples[len(samples) // 2]:7.1f} ms  min {samples[0]:7.1f}  max {samples[-1]:7.1f}  "
            f"(n={len(samples)})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
