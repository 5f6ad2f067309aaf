"""Runner figures of issue 5: airlock beside the shell it replaces, in one run.

    .venv/bin/python bench/runner_bench.py [--size-mib 1024] [--jobs 1000] [--reps 5] [--json FILE]

1. A 1 GiB file through ``cat FILE | wc -c``: as one airlock request (a
   two-stage pipeline) against ``sh -c 'cat FILE | wc -c'`` on the same file.
2. ``--jobs`` (1,000) ``true`` jobs, one airlock request each, one after the
   other on one connection, against as many ``subprocess.run(["true"])``.

Each figure is the median of ``--reps`` repetitions; airlock's and the
yardstick's repetitions alternate, so load on a shared machine hits both
alike.  The file is read once before timing, so both read from the page cache.

"Through airlock" is the full audited path, as an agent sees it, timed from
the request's first byte to the reply's last: a fresh ``airlock dev up``
stack (four services, the real sockets and SO_PEERCRED checks), intake's
validation and ``request.received``, the operation store (``op.begin`` /
``op.complete``), approval's policy decision and ticket, the runner's ticket
redemption, ``exec.started`` committed (fsync) before the spawn,
the spawn as the peer's own user (the same uid as the yardstick: both run
unprivileged), capture and digests of the output, ``exec.finished``,
``request.replied``, and the base64 evidence in the reply.  The 1 GiB
itself goes from ``cat`` to ``wc`` through an OS pipe in both cases: airlock
never copies it.  Logging stays at the dev stack's default level.

Not a test: nothing is asserted beyond each run having done its work.
Standalone (no bench harness needed) so that ``make bench`` can call it, or
import ``measure()`` and get the rows.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Row:
    """One figure: airlock's median and the yardstick's, in seconds."""

    name: str
    airlock_seconds: float
    yardstick: str
    yardstick_seconds: float
    airlock_samples: tuple[float, ...]
    yardstick_samples: tuple[float, ...]

    @property
    def ratio(self) -> float:
        return self.airlock_seconds / self.yardstick_seconds


# -- a stack and a client ------------------------------------------------------------


def _config(path: Path) -> Path:
    # Allow everything: the policy decision is still made and journaled.
    path.write_text("policy:\n  default: deny\n  rules:\n    - {name: bench, decision: allow}\n")
    return path


@contextmanager
def dev_stack(workdir: Path) -> Iterator[str]:
    """`airlock dev up` in a short runtime folder (sun_path is 108 bytes); yields the agent socket."""
    runtime = Path(tempfile.mkdtemp(prefix="alrb-", dir="/tmp"))
    output = workdir / "dev-up.log"  # a file, not a pipe: nobody has to keep reading it
    with open(output, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airlock",
                "dev",
                "up",
                "--runtime-dir",
                str(runtime),
                "--config",
                str(_config(workdir / "bench.yaml")),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready" not in output.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("runner_bench: airlock dev up did not become ready:\n" + output.read_text())
            time.sleep(0.05)
        yield str(runtime / "agent.sock")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(runtime, ignore_errors=True)


class Client:
    """One connection, one request after another, as a persistent agent would hold it."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""

    def exec(self, args: dict[str, Any]) -> dict[str, Any]:
        # A fresh operation_id each time, as a client that retries safely names it.
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        request = {
            "v": 1,
            "id": str(uuid.uuid4()),
            "verb": "exec",
            "token": None,
            "args": {"privileged": False, "time": now, "operation_id": f"op-{uuid.uuid4()}"} | args,
        }
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        while True:
            nl = self.buf.find(b"\n")
            while nl >= 0:
                frame, self.buf = self.buf[:nl], self.buf[nl + 1 :]
                reply: dict[str, Any] = json.loads(frame)
                if "event" not in reply:
                    if not reply.get("ok"):
                        raise SystemExit(f"runner_bench: airlock refused {args}: {reply.get('error')}")
                    data: dict[str, Any] = reply["data"]
                    return data
                nl = self.buf.find(b"\n")
            chunk = self.sock.recv(MiB)
            if not chunk:
                raise SystemExit("runner_bench: the connection closed before the reply")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


# -- the figures ----------------------------------------------------------------------


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _alternate(reps: int, ours: Callable[[], None], yardstick: Callable[[], None]) -> tuple[list[float], list[float]]:
    a, b = [], []
    for _ in range(reps):
        a.append(_timed(ours))
        b.append(_timed(yardstick))
    return a, b


def _row(name: str, yardstick: str, a: list[float], b: list[float]) -> Row:
    return Row(name, statistics.median(a), yardstick, statistics.median(b), tuple(a), tuple(b))


def pipeline(client: Client, data: Path, size: int, reps: int) -> Row:
    def ours() -> None:
        evidence = client.exec({"pipeline": [["cat", str(data)], ["wc", "-c"]]})
        counted = base64.b64decode(evidence["stdout"]).strip()
        if evidence["stages"][-1]["exit_code"] != 0 or int(counted or 0) != size:
            raise SystemExit(f"runner_bench: the pipeline did not count {size} bytes: {evidence}")

    def shell() -> None:
        out = subprocess.run(["sh", "-c", f"cat {shlex.quote(str(data))} | wc -c"], capture_output=True, check=True)
        if int(out.stdout) != size:
            raise SystemExit(f"runner_bench: sh counted {out.stdout!r}")

    a, b = _alternate(reps, ours, shell)
    return _row(f"{size // MiB} MiB: cat FILE | wc -c", "sh -c 'cat FILE | wc -c'", a, b)


def true_jobs(client: Client, jobs: int, reps: int) -> Row:
    def ours() -> None:
        for _ in range(jobs):
            if client.exec({"argv": ["true"]})["stages"][0]["exit_code"] != 0:
                raise SystemExit("runner_bench: true failed")

    def bare() -> None:
        for _ in range(jobs):
            subprocess.run(["true"], check=True)

    a, b = _alternate(reps, ours, bare)
    return _row(f"{jobs:,} true jobs, one after another", f'{jobs:,} x subprocess.run(["true"])', a, b)


def _make_file(path: Path, size: int) -> None:
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(block)
        f.write(block[: size % MiB])
    path.chmod(0o644)
    os.sync()  # no writeback of the fresh gigabyte while either side is timed
    # Into the page cache before either side is timed.
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)


def measure(size: int = 1024 * MiB, jobs: int = 1000, reps: int = 5, true_reps: int = 3) -> list[Row]:
    """Both figures, measured in this run, against a dev stack started here."""
    with tempfile.TemporaryDirectory(prefix="airlock-runner-bench-", dir="/var/tmp") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o755)  # the job runs as our own uid, but keep the file reachable regardless
        data = workdir / "data.bin"
        _make_file(data, size)
        with dev_stack(workdir) as agent:
            client = Client(agent)
            try:
                for _ in range(20):  # warm up: imports, caches, the journal's first pages
                    client.exec({"argv": ["true"]})
                rows = [pipeline(client, data, size, reps), true_jobs(client, jobs, true_reps)]
            finally:
                client.close()
    return rows


def table(rows: list[Row]) -> str:
    def fmt(seconds: float) -> str:
        return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"

    lines = [["figure", "through airlock", "yardstick", "", "ratio"]]
    for r in rows:
        lines.append([r.name, fmt(r.airlock_seconds), r.yardstick, fmt(r.yardstick_seconds), f"{r.ratio:.2f}x"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="size of the file piped through (default 1024)")
    parser.add_argument("--jobs", type=int, default=1000, help="true jobs per repetition (default 1000)")
    parser.add_argument("--reps", type=int, default=5, help="pipeline repetitions (default 5)")
    parser.add_argument("--true-reps", type=int, default=3, help="repetitions of the true batch (default 3)")
    parser.add_argument("--json", type=Path, help="also write the rows (samples included) here")
    args = parser.parse_args(argv)
    started, load = time.monotonic(), os.getloadavg()[0]
    rows = measure(args.size_mib * MiB, args.jobs, max(1, args.reps), max(1, args.true_reps))
    # The ratios are what to quote: a loaded machine moves both sides of a row alike.
    print(
        f"airlock runner bench: {os.cpu_count()} cores, uid {os.geteuid()}, load average "
        f"{load:.2f} -> {os.getloadavg()[0]:.2f}, {time.monotonic() - started:.0f} s; medians of the repetitions"
    )
    print(table(rows))
    per_job = [r for r in rows if "true" in r.name]
    for r in per_job:
        print(
            f"  per true job: {r.airlock_seconds / args.jobs * 1000:.2f} ms through airlock, "
            f"{r.yardstick_seconds / args.jobs * 1000:.2f} ms bare"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"ratio": r.ratio} for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
