"""Where an exec's time goes: phases from the journal, CPU per request per service, py-spy's top frames.

    .venv/bin/python bench/profile_exec.py [--requests N] [--py-spy]

Not part of `make bench`: it is what docs/benchmarks-log.md's notes on missed
targets were made with.  ``--py-spy`` needs py-spy in the venv
(``.venv/bin/pip install py-spy``; profiling only, not a dependency).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from harness import REPO, SERVICES, BenchStack, Persistent, Requests, bench_config, drive, median

ROOT = os.geteuid() == 0
PHASES = ("request.received", "approval.decided", "exec.started", "exec.finished", "request.replied")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phases(database: Path, prefix: str) -> dict[str, float]:
    """Median milliseconds between consecutive audit events of each request (ms-resolution stamps)."""
    by_request: dict[str, dict[str, datetime]] = collections.defaultdict(dict)
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        for kind, rid, stamp in conn.execute(
            "SELECT kind, request_id, time FROM events WHERE request_id LIKE ?", (f"b-{prefix}-%",)
        ):
            by_request[rid].setdefault(kind, datetime.fromisoformat(stamp.replace("Z", "+00:00")))
    gaps: dict[str, list[float]] = collections.defaultdict(list)
    for events in by_request.values():
        for a, b in itertools.pairwise(PHASES):
            if a in events and b in events:
                gaps[f"{a} -> {b}"].append((events[b] - events[a]).total_seconds() * 1000)
    return {k: median(v) for k, v in gaps.items()}


def top_frames(raw: Path, n: int = 12) -> list[str]:
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        # The innermost airlock frame: what of ours was running (or waiting).
        ours = [f for f in frames if "airlock/" in f]
        own[(ours[-1] if ours else frames[-1])[:110]] += int(count)
    return [f"{c / total:6.1%}  {f}" for f, c in own.most_common(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--py-spy", action="store_true", help="sample each service during the concurrent load")
    parser.add_argument("--keep", type=Path, help="copy py-spy's raw stacks (SERVICE.txt) into this folder")
    parser.add_argument("--gil", action="store_true", help="py-spy: only samples holding the GIL (CPU in Python)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="alp-"))
    config = bench_config(work / "bench.yaml", root=ROOT)
    true_args = {"argv": ["true"], "privileged": ROOT}
    with BenchStack(config) as stack:
        reqs = Requests()
        client = Persistent(stack.agent)
        for _ in range(args.requests):
            client.call(reqs.exec_line(true_args))
        client.close()
        print(f"sequential exec of true, {args.requests} requests: median ms between audit events")
        for name, ms in phases(stack.runtime_dir / "state" / "journal.sqlite", reqs.prefix).items():
            print(f"  {name:<40} {ms:7.2f}")

        # The exec-tree listener (airlock-exectree, dev up's airlock.runner.exectree) works on every exec too.
        pids = {s: stack.pid(s) for s in SERVICES} | {"exectree": stack.pid("runner.exectree")}
        before = {s: cpu_seconds(p) for s, p in pids.items() if p}
        spies = []
        if args.py_spy:
            spy = shutil.which("py-spy", path=str(REPO / ".venv" / "bin"))
            if spy is None:
                print("py-spy is not in .venv/bin", file=sys.stderr)
                return 2
            for s, p in pids.items():
                spies.append(
                    (
                        s,
                        work / f"{s}.txt",
                        subprocess.Popen(
                            [
                                spy,
                                "record",
                                "-p",
                                str(p),
                                "-d",
                                "15",
                                "-r",
                                "100",
                                "-f",
                                "raw",
                                "-o",
                                str(work / f"{s}.txt"),
                                *(["--gil"] if args.gil else []),
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        ),
                    )
                )
            time.sleep(1)
        me = os.times()
        load = drive(stack.agent, 16, args.requests * 2, lambda: reqs.exec_line(true_args))
        mine = os.times()
        print(f"\n16 clients, {load.requests} execs: {load.rate:.0f}/s; CPU ms per request:")
        total = 0.0
        for s, p in pids.items():
            if p:
                ms = (cpu_seconds(p) - before[s]) / load.requests * 1000
                total += ms
                print(f"  {s:<10} {ms:6.2f}")
        client_ms = (mine.user + mine.system - me.user - me.system) / load.requests * 1000
        print(
            f"  {'client':<10} {client_ms:6.2f}\n  {'services':<10} {total:6.2f}  "
            f"(ceiling on {os.cpu_count()} idle cores: {1000 * (os.cpu_count() or 1) / total:.0f}/s, "
            "before the jobs' own fork/exec)"
        )
        for s, path, proc in spies:
            proc.wait()
            if path.exists():
                print(f"\npy-spy, {s}: innermost airlock frame (or leaf), share of samples")
                for line in top_frames(path):
                    print(f"  {line}")
                if args.keep is not None:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, args.keep / path.name)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
