"""The container rows of `make bench` for two .debs side by side: two booted containers, steps alternating.

    AIRLOCK_DEB=dist/airlock_*.deb .venv/bin/python bench/container_ab.py --before OLD.deb [--rounds N] [--json FILE]

`make bench-ab-system BEFORE=<commit>` builds that commit's .deb and runs this
(as root): the "no row regresses by more than 5% against the tree before (A/B
in one run)" rule of issue 50 for the rows that need systemd as PID 1, which
`make bench-ab`'s two `dev up` stacks cannot give. Each tree gets a container
of its own (the system tests' Debian 12 root, its .deb installed as
cold_container.py installs it); both stay booted, and round after round each
in turn (the order swapped every round) takes a cold start (every airlock
service stopped, the sockets listening, then the agent's first `airlock run
--no-privilege -- true`) and warm runs of `airlock run -- true` alternating
run by run with `systemd-run --wait --pipe -q true` and `sudo -n true` in the
same container. Not a test: nothing is asserted beyond every command succeeding.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from cold_container import install
from nspawn import Container, booted

# Runs inside a container as root: one step, one JSON object on stdout.
STEP = r"""
import grp, json, subprocess, sys, time
SERVICES = ["airlock-intake.service", "airlock-approval.service", "airlock-runner.service",
            "airlock-journal.service"]
step, count = sys.argv[1], int(sys.argv[2])
gid = grp.getgrnam("airlock").gr_gid
env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/home/agent1"}

def timed(argv, agent=True):
    extra = {"user": "agent1", "group": "agent1", "extra_groups": [gid]} if agent else {}
    start = time.perf_counter()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, **extra)
    took = (time.perf_counter() - start) * 1000
    if r.returncode != 0:
        raise SystemExit(f"{argv} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    return took

if step == "cold":
    subprocess.run(["systemctl", "stop", *SERVICES], check=True)
    subprocess.run(["systemctl", "reset-failed", *SERVICES], check=False)  # more starts than StartLimitBurst
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = subprocess.run(["systemctl", "is-active", *SERVICES], capture_output=True, text=True).stdout.split()
        if all(s in ("inactive", "failed") for s in states):
            break
        time.sleep(0.05)
    time.sleep(0.5)
    out = {"cold": [timed(["/usr/bin/airlock", "run", "--no-privilege", "--", "true"])]}
else:
    out = {"airlock": [], "systemd_run": [], "sudo": []}
    for _ in range(count):
        out["airlock"].append(timed(["/usr/bin/airlock", "run", "--", "true"]))
        out["systemd_run"].append(timed(["systemd-run", "--wait", "--pipe", "-q", "/usr/bin/true"], agent=False))
        out["sudo"].append(timed(["sudo", "-n", "/usr/bin/true"]))
print(json.dumps(out))
"""

# (row, the samples' key, what it is compared with in the same container, or None)
ROWS = (
    ("cold start, socket activation (container)", "cold", None),
    ("airlock run -- true, installed, service containment, warm (container)", "airlock", "sudo"),
    ("airlock run -- true beside systemd-run --wait --pipe -q true (container)", "airlock", "systemd_run"),
)
LIMIT = 1.05


def _step(c: Container, step: str, count: int) -> dict[str, list[float]]:
    r = c.run(["python3", "/root/ab_step.py", step, str(count)], check=False, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"the {step} step failed ({r.returncode}):\n{r.stdout[-1000:]}\n{r.stderr[-2000:]}")
    samples: dict[str, list[float]] = json.loads(r.stdout.strip().splitlines()[-1])
    return samples


def measure(debs: dict[str, Path], rounds: int, warm: int) -> dict[str, dict[str, list[float]]]:
    """Both containers booted and installed, then the steps alternating; each tree's samples in ms."""
    samples: dict[str, dict[str, list[float]]] = {tree: {} for tree in debs}
    with contextlib.ExitStack() as stack:
        boxes = {tree: stack.enter_context(booted(packages=("sudo",), name=f"ab-{tree}")) for tree in debs}
        for tree, c in boxes.items():
            install(c, debs[tree])
            c.write("/root/ab_step.py", STEP)
            _step(c, "warm", 2)  # the first runs after install: not counted (caches, the journal's creation)
        for i in range(rounds):
            for tree in ("before", "after") if i % 2 else ("after", "before"):
                for step, count in (("cold", 1), ("warm", warm)):
                    for key, got in _step(boxes[tree], step, count).items():
                        samples[tree].setdefault(key, []).extend(got)
    return samples


def table(samples: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """Each row's before and after medians (a ratio to its yardstick where it has one) and the verdict."""
    rows = []
    for row, key, yardstick in ROWS:
        value = {}
        for tree in ("before", "after"):
            p50 = statistics.median(samples[tree][key])
            value[tree] = p50 / statistics.median(samples[tree][yardstick]) if yardstick else p50
        ratio = value["after"] / value["before"]
        rows.append(
            {
                "row": row,
                "unit": f"x {yardstick}" if yardstick else "ms",
                "before": round(value["before"], 3),
                "after": round(value["after"], 3),
                "ratio": round(ratio, 3),
                "within": ratio <= LIMIT,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True, type=Path, help="the .deb of the tree before")
    parser.add_argument("--rounds", type=int, default=10, help="cold starts per tree (default 10)")
    parser.add_argument("--warm", type=int, default=10, help="warm runs of each command per round (default 10)")
    parser.add_argument("--json", type=Path, help="write the rows and samples here")
    args = parser.parse_args()
    debs = {"before": args.before.resolve(), "after": Path(os.environ["AIRLOCK_DEB"]).resolve()}
    load = os.getloadavg()
    try:
        samples = measure(debs, args.rounds, args.warm)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    rows = table(samples)
    print(f"{'row':75} {'before':>9} {'after':>9} {'after/before':>13}  within (<= {LIMIT}x)")
    for r in rows:
        print(f"{r['row']:75} {r['before']:>9} {r['after']:>9} {r['ratio']:>13}  {'yes' if r['within'] else 'NO'}")
    print(
        f"({args.rounds} rounds, {args.warm} warm runs of each per round; load average {load[0]:.2f} -> "
        f"{os.getloadavg()[0]:.2f}; units: ms, or the ratio to the yardstick in the same container)"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "samples": samples, "debs": {k: str(v) for k, v in debs.items()}}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
