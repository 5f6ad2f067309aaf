"""Exec latency of two airlock trees side by side: two live stacks, requests alternating.

    .venv/bin/python bench/exec_ab.py --before /work/main/services [--requests 1000] [--json FILE]

`make bench-ab BEFORE=<commit>` runs it against that commit's services/ (and
writes bench/results-ab.json, which `make bench-doc` renders into
docs/benchmarks.md's A/B table): the "no row regresses by more than 5%
against the tree before (A/B in one run)" rule of issues 47 and 50.

Starts one `airlock dev up` on the code under ``--before`` (via PYTHONPATH) and
one on this tree, warms both, then sends ``exec true`` (privileged when root)
to each in turn over one persistent connection per stack, so background load
on a shared machine hits both alike.  Prints p50/p90/p99 and the p50 ratio.
Not a test: nothing is asserted beyond every request succeeding.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from harness import BenchStack, Figure, Persistent, Requests, bench_config, machine, percentile

TARGET = "<= 1.05x (issue 47: within 5% of before)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True, help="the services/ folder of the tree to compare with")
    parser.add_argument("--requests", type=int, default=1000, help="requests per stack (default 1000)")
    parser.add_argument("--json", type=Path, help="write the figures here (bench/results-ab.json: `make bench-doc`)")
    parser.add_argument("--before-name", default="", help="what --before is (a commit), for the figures")
    args = parser.parse_args()
    measured = machine() | {"load_average_start": list(os.getloadavg())}
    work = Path(tempfile.mkdtemp(prefix="ab", dir="/tmp"))
    config = bench_config(work / "bench.yaml", root=os.geteuid() == 0)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = args.before
    stacks = {"before": BenchStack(config).start()}
    if saved is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = saved
    stacks["after"] = BenchStack(config).start()
    requests = Requests()
    body = {"argv": ["true"], "privileged": os.geteuid() == 0}
    clients = {name: Persistent(stack.agent) for name, stack in stacks.items()}
    samples: dict[str, list[float]] = {name: [] for name in stacks}
    try:
        for _ in range(30):
            for client in clients.values():
                client.call(requests.exec_line(body))
        for i in range(args.requests):
            for name in ("before", "after") if i % 2 else ("after", "before"):
                start = time.perf_counter()
                reply = clients[name].call(requests.exec_line(body))
                samples[name].append(time.perf_counter() - start)
                if not reply.get("ok"):
                    raise SystemExit(f"exec_ab: {name}: exec of true failed: {reply}")
    finally:
        for client in clients.values():
            client.close()
        for stack in stacks.values():
            stack.stop()
            shutil.rmtree(stack.runtime_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    for name, values in samples.items():
        figures = " ".join(f"p{q}={percentile(values, q) * 1000:.2f} ms" for q in (50, 90, 99))
        print(f"{name}: {len(values)} requests {figures}")
    ratio = percentile(samples["after"], 50) / percentile(samples["before"], 50)
    print(f"after/before p50: {ratio:.3f}")
    if args.json is not None:
        measured["load_average_end"] = list(os.getloadavg())
        measured["before"] = args.before_name or args.before
        measured["requests"] = args.requests
        measured["source"] = "bench/results-ab.json"
        before = args.before_name or "before"
        p50 = {name: percentile(values, 50) * 1000 for name, values in samples.items()}
        figure = Figure(
            f"exec `true` p50, A/B against {before} ({'privileged' if os.geteuid() == 0 else 'unprivileged'})",
            p50["after"],
            "ms",
            TARGET,
            f"{before}, alternating request by request",
            p50["before"],
            ratio,
            ratio <= 1.05,
            extra={q: {n: percentile(v, int(q[1:])) * 1000 for n, v in samples.items()} for q in ("p90", "p99")},
        )
        figures = [{k: v for k, v in vars(figure).items() if k != "samples"}]
        args.json.write_text(json.dumps({"machine": measured, "figures": figures}, indent=2) + "\n")


if __name__ == "__main__":
    main()
