#!/usr/bin/env python3
"""The agent door itself (issue 4): requests per second through intake.

`ping` and `exec` of `true` (allow rule, full audit) with 1 and 16 concurrent
clients on persistent connections, printed beside a direct fork/exec of
`true` measured in the same run, rounds alternating so that a neighbour's
load hits every figure alike.  Not a test: nothing here asserts a number.

    .venv/bin/python bench/door_bench.py [--rounds 3] [--pings 5000] [--execs 300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchStack, Requests, bench_config, drive, machine, median


def fork_exec_rate(count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        subprocess.run(["/usr/bin/true"], check=True)
    return count / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pings", type=int, default=5000, help="pings per round and client count")
    parser.add_argument("--execs", type=int, default=300, help="execs per round and client count")
    ns = parser.parse_args()
    root = os.geteuid() == 0
    requests = Requests()
    true_args = {"argv": ["/usr/bin/true"], "privileged": False}
    rates: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="aldoor-") as tmp:
        config = bench_config(Path(tmp) / "bench.yaml", root=root)
        with BenchStack(config).start() as stack:
            for _ in range(ns.rounds):
                for clients in (1, 16):
                    load = drive(stack.agent, clients, ns.pings, requests.ping_line)
                    rates.setdefault(f"ping, {clients:>2} client(s)", []).append(load.rate)
                    load = drive(stack.agent, clients, ns.execs, lambda: requests.exec_line(true_args))
                    if load.errors:
                        print(f"door bench: exec errors {load.errors}", file=sys.stderr)
                        return 1
                    rates.setdefault(f"exec true, {clients:>2} client(s)", []).append(load.rate)
                rates.setdefault("fork/exec of true (no airlock)", []).append(fork_exec_rate(ns.execs))
    info = machine()
    print(f"agent door, {info.get('cores')} cores, median of {ns.rounds} rounds")
    baseline = median(rates["fork/exec of true (no airlock)"])
    print(f"{'figure':<34} {'req/s':>10} {'vs fork/exec':>13}")
    for name, values in rates.items():
        value = median(values)
        print(f"{name:<34} {value:>10,.0f} {value / baseline:>12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
