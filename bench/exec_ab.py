"""Exec latency of two airlock trees side by side: two live stacks, requests alternating.

    .venv/bin/python bench/exec_ab.py --before /work/main/services [--requests 1000]

Starts one `airlock dev up` on the code under ``--before`` (via PYTHONPATH) and
one on this tree, warms both, then sends ``exec true`` (privileged when root)
to each in turn over one persistent connection per stack, so background load
on a shared machine hits both alike.  Prints p50/p90/p99 and the p50 ratio.
Not a test: nothing is asserted beyond every request succeeding.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from harness import BenchStack, Persistent, Requests, bench_config, percentile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True, help="the services/ folder of the tree to compare with")
    parser.add_argument("--requests", type=int, default=1000, help="requests per stack (default 1000)")
    args = parser.parse_args()
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
    print(f"after/before p50: {percentile(samples['after'], 50) / percentile(samples['before'], 50):.3f}")


if __name__ == "__main__":
    main()
