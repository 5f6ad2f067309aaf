"""Every A/B row of two airlock trees, each row alternating the two trees in one run.

    .venv/bin/python bench/exec_ab.py --before /tmp/b10/services [--quick] [--only ROW ...] [--json FILE]

`make bench-ab BEFORE=<commit>` runs it against that commit's services/ (and
writes bench/results-ab.json, which `make bench-doc` renders into
docs/benchmarks.md's A/B table): the "no row regresses by more than 5%
against the tree before (A/B in one run)" rule of issues 47 and 50.

``--before`` is the old tree's services/ folder; its parent is the old tree
(for its console script, packaging/debian/airlock-console).  Two `airlock dev
up` stacks run side by side, one per tree (the old one via PYTHONPATH), and
every row takes its samples from both in turn, so background load on a shared
machine hits both alike:

- latency:    ``exec true`` p50 and p99, request by request over one persistent connection per stack
- throughput: ``exec true`` from 16 clients, rounds of a few seconds alternating
- cli:        ``airlock run -- true``, each tree's CLI (as its .deb installs it) against its own stack
- approval:   approve returned -> the job ran (a rule that asks), approval by approval
- pipeline:   ``cat FILE | wc -c`` through airlock, MiB/s, run by run
- cold:       fresh `dev up` of each tree in turn, spawn to the first exec answered; and the CPU it took

Each row prints before, after, after/before and whether it is within 1.05
(a time) or at least 0.95 (a rate).  A row the old tree cannot run says so.
Not a test: nothing is asserted; a regression is reported.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import functools
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cli_ab import layout
from harness import (
    REPO,
    BenchStack,
    Figure,
    Persistent,
    Requests,
    approved_once,
    bench_config,
    connect_when_bound,
    drive,
    fmt,
    machine,
    median,
    percentile,
    time_subprocess,
)

ROOT = os.geteuid() == 0
SIDES = ("before", "after")
SLOWER = 1.05  # a time may grow by 5% at most (issues 47, 50)
FASTER = 0.95  # a rate may shrink by 5% at most
ASKS = 100_000  # approval.asks_per_minute: the bench asks on purpose (an agent gets 20)
ROWS = ("latency", "throughput", "cli", "approval", "pipeline", "cold")


@dataclass(frozen=True, slots=True)
class Plan:
    """How much each row does: `--quick` is a smoke run, not numbers to quote."""

    requests: int
    throughput_rounds: int
    throughput_load: int
    cli_runs: int
    approvals: int
    pipeline_rounds: int
    pipeline_bytes: int
    cold_starts: int


FULL = Plan(1000, 8, 800, 100, 200, 6, 1 << 30, 10)
QUICK = Plan(150, 2, 200, 10, 10, 2, 1 << 26, 2)


class Missing(Exception):
    """The old tree cannot run this row (a feature it lacks): the row says so instead of a ratio."""


# -- the verdict (pure) -------------------------------------------------------------


def verdict(row: str, unit: str, before: float, after: float, *, rate: bool, before_name: str, how: str) -> Figure:
    """One A/B row: after beside before, their ratio, and whether it is within 5% the way that counts.

    A time (``rate=False``) may be at most 1.05x before; a rate at least 0.95x.
    """
    ratio = after / before if before else None
    limit = f">= {FASTER}x before" if rate else f"<= {SLOWER}x before"
    met = None if ratio is None else (ratio >= FASTER if rate else ratio <= SLOWER)
    return Figure(row, after, unit, limit, before_name, before, ratio, met, how)


def missing(row: str, unit: str, after: float | None, *, before_name: str, why: str) -> Figure:
    """A row the old tree cannot run: this tree's figure alone, no ratio, no verdict."""
    return Figure(row, after, unit, "—", before_name, None, None, None, f"not in {before_name}: {why}")


def failed(row: str, unit: str, why: str) -> Figure:
    return Figure(row, None, unit, "—", note=f"failed: {why}")


def ab_table(figures: list[Figure]) -> str:
    """The printed table: row, before, after, after/before, within."""
    rows = [["row", "before", "after", "after/before", "within"]]
    for f in figures:
        ratio = "-" if f.ratio is None else f"{f.ratio:.3f}"
        if f.met is None:
            within = "not in before" if f.note.startswith("not in ") else "n/a"
        else:
            within = ("yes" if f.met else "NO") + f" ({f.target})"
        rows.append([f.name, fmt(f.yardstick_value, f.unit), fmt(f.value, f.unit), ratio, within])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {f.name}: {f.note}" for f in figures if f.note]
    return "\n".join(lines + (["", "notes:", *notes] if notes else []))


def results(figures: list[Figure], run: dict[str, Any]) -> dict[str, Any]:
    """What --json writes and bench/bench_doc.py reads: the run, and each row without its samples."""
    rows = [{k: v for k, v in vars(f).items() if k != "samples"} for f in figures]
    return {"machine": run, "figures": rows}


def alternate(i: int) -> tuple[str, str]:
    """Which tree goes first in round ``i``: each in turn, so neither always follows the other."""
    return ("after", "before") if i % 2 else SIDES


# -- the two stacks -------------------------------------------------------------------


@contextlib.contextmanager
def tree(services: Path) -> Iterator[None]:
    """PYTHONPATH set to one tree's services/ while a `dev up` is spawned (its services inherit it)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(services)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def ab_config(path: Path) -> Path:
    """The bench policy plus a rule that asks for ``true asked`` (the approval row)."""
    user = pwd.getpwuid(os.getuid()).pw_name
    config = bench_config(path, root=ROOT)
    data = yaml.safe_load(config.read_text())
    asked = {"name": "bench-asked", "decision": "ask", "users": [user], "privileged": ROOT}
    data["policy"]["rules"].insert(0, asked | {"commands": [["/usr/bin/true", "asked"]]})
    data.setdefault("approval", {})["asks_per_minute"] = ASKS
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class AB:
    def __init__(self, plan: Plan, trees: dict[str, Path], before_name: str, workdir: Path) -> None:
        self.plan = plan
        self.trees = trees  # side -> services/ folder
        self.before_name = before_name
        self.workdir = workdir
        self.config = ab_config(workdir / "ab.yaml")
        self.requests = Requests()
        self.true_args = {"argv": ["true"], "privileged": ROOT}
        self.figures: list[Figure] = []

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)
        print(f"  {figure.name}: done", file=sys.stderr, flush=True)

    def row(self, name: str, unit: str, samples: dict[str, list[float]], *, rate: bool, how: str) -> None:
        before, after = median(samples["before"]), median(samples["after"])
        self.add(verdict(name, unit, before, after, rate=rate, before_name=self.before_name, how=how))

    def attempt(self, rows: list[tuple[str, str]], step: Callable[[], None]) -> None:
        """Run one step; if it fails, its rows say why (not in before, or failed) and the others still run."""
        try:
            step()
        except Missing as exc:
            for name, unit in rows:
                self.add(missing(name, unit, None, before_name=self.before_name, why=str(exc)))
        except (SystemExit, Exception) as exc:  # a step's failure is a result to print, not a crash
            why = " ".join(str(exc).split())[:300] or type(exc).__name__
            print(f"bench-ab: {rows[0][0]} failed: {why}", file=sys.stderr, flush=True)
            for name, unit in rows:
                self.add(failed(name, unit, why))

    def start(self) -> dict[str, BenchStack]:
        stacks: dict[str, BenchStack] = {}
        try:
            for side in SIDES:
                with tree(self.trees[side]):
                    stacks[side] = BenchStack(self.config).start()
                runs_tree(stacks[side], self.trees[side])
        except BaseException:
            stop(stacks)
            raise
        return stacks

    # -- exec latency: request by request ---------------------------------------------

    def latency(self, stacks: dict[str, BenchStack]) -> None:
        clients = {side: Persistent(stacks[side].agent) for side in SIDES}
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        try:
            for _ in range(30):
                for client in clients.values():
                    client.call(self.requests.exec_line(self.true_args))
            for i in range(self.plan.requests):
                for side in alternate(i):
                    start = time.perf_counter()
                    reply = clients[side].call(self.requests.exec_line(self.true_args))
                    samples[side].append((time.perf_counter() - start) * 1000)
                    if not reply.get("ok"):
                        raise SystemExit(f"{side}: exec of true failed: {reply}")
        finally:
            for client in clients.values():
                client.close()
        kind = "privileged" if ROOT else "unprivileged"
        how = f"{self.plan.requests} execs each, alternating request by request, one persistent connection"
        for q in (50, 99):
            before, after = percentile(samples["before"], q), percentile(samples["after"], q)
            name = f"exec `true` p{q} ({kind})"
            self.add(verdict(name, "ms", before, after, rate=False, before_name=self.before_name, how=how))

    # -- exec throughput: rounds of a few seconds -----------------------------------------

    def throughput(self, stacks: dict[str, BenchStack]) -> None:
        rates: dict[str, list[float]] = {side: [] for side in SIDES}
        for i in range(self.plan.throughput_rounds):
            for side in alternate(i):
                load = drive(stacks[side].agent, 16, self.plan.throughput_load, self._true_line)
                if load.errors:
                    raise SystemExit(f"{side}: exec load had errors: {load.errors}")
                rates[side].append(load.rate)
        how = (
            f"{self.plan.throughput_rounds} rounds of {self.plan.throughput_load} execs each, 16 persistent "
            "connections from one asyncio process, the trees' rounds alternating; median"
        )
        self.row("exec throughput, 16 clients", "req/s", rates, rate=True, how=how)

    def _true_line(self) -> bytes:
        return self.requests.exec_line(self.true_args)

    # -- airlock run -- true: each tree's CLI against its own stack ----------------------------

    def cli(self, stacks: dict[str, BenchStack]) -> None:
        scripts = {side: layout(self.trees[side].parent, self.workdir / f"cli-{side}") for side in SIDES}
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        argv = {
            side: [str(scripts[side]), "run", "--socket", stacks[side].agent]
            + ([] if ROOT else ["--no-privilege"])
            + ["--", "true"]
            for side in SIDES
        }
        for side in SIDES:  # once each, checked: a CLI that fails would time its error message
            done = subprocess.run(argv[side], env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                message = f"`airlock run -- true` exited {done.returncode}: {done.stderr.strip()[:200]}"
                if side == "before":
                    raise Missing(message)
                raise SystemExit(message)
        runs: dict[str, list[float]] = {side: [] for side in SIDES}
        for i in range(self.plan.cli_runs):
            for side in alternate(i):
                runs[side].append(time_subprocess(argv[side], env=env) * 1000)
        how = (
            f"{self.plan.cli_runs} runs each, process start to exit, each tree's package and console script "
            "as its .deb installs them, against its own stack, alternating run by run"
        )
        self.row("airlock run -- true (installed layout)", "ms", runs, rate=False, how=how)

    # -- approval round trip: approve returned -> the job ran --------------------------------

    def approval(self, stacks: dict[str, BenchStack]) -> None:
        agents = {side: Persistent(stacks[side].agent) for side in SIDES}
        operators = {side: Persistent(stacks[side].operator) for side in SIDES}
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        try:
            for side in SIDES:
                try:
                    self._approved_once(agents[side], operators[side])
                except (SystemExit, ConnectionError) as exc:
                    if side == "before":
                        raise Missing(f"approve over operator.sock: {exc}") from exc
                    raise
            for i in range(self.plan.approvals):
                for side in alternate(i):
                    samples[side].append(self._approved_once(agents[side], operators[side]) * 1000)
        finally:
            for client in [*agents.values(), *operators.values()]:
                client.close()
        how = (
            f"{self.plan.approvals} approvals each (a rule that asks for `true asked`): from the operator's "
            "approve reply to the agent's reply, alternating approval by approval; median"
        )
        self.row("approval round trip p50 (approve returned -> job ran)", "ms", samples, rate=False, how=how)

    def _approved_once(self, agent: Persistent, operator: Persistent) -> float:
        """Seconds from the approve reply to the agent's final reply, for one asked exec."""
        args = {"argv": ["true", "asked"], "privileged": ROOT, "stream": True}
        return approved_once(agent, operator, self.requests.exec_line(args))[1]

    # -- cat FILE | wc -c through airlock --------------------------------------------------

    def pipeline(self, stacks: dict[str, BenchStack]) -> None:
        size = self.plan.pipeline_bytes
        data = self.workdir / "pipeline.bin"
        block = os.urandom(1 << 20)
        with open(data, "wb") as f:
            for _ in range(size // len(block)):
                f.write(block)
        os.chmod(data, 0o644)
        os.chmod(self.workdir, 0o755)
        clients = {side: Persistent(stacks[side].agent) for side in SIDES}
        body = {"pipeline": [["cat", str(data)], ["wc", "-c"]], "privileged": ROOT}
        rates: dict[str, list[float]] = {side: [] for side in SIDES}
        mib = size / (1 << 20)
        try:
            for i in range(self.plan.pipeline_rounds):
                for side in alternate(i):
                    start = time.perf_counter()
                    reply = clients[side].call(self.requests.exec_line(body))
                    took = time.perf_counter() - start
                    out = base64.b64decode(reply.get("data", {}).get("stdout", "")).strip()
                    if not reply.get("ok") or int(out or 0) != size:
                        raise SystemExit(f"{side}: the pipeline did not count {size} bytes: {str(reply)[:200]}")
                    rates[side].append(mib / took)
        finally:
            for client in clients.values():
                client.close()
            data.unlink()
        how = f"{self.plan.pipeline_rounds} runs each, file in the page cache, alternating run by run; median"
        self.row(f"{size >> 20} MiB through cat FILE | wc -c", "MiB/s", rates, rate=True, how=how)

    # -- cold start: fresh stacks alternating ----------------------------------------------------

    def cold(self) -> None:
        """Spawn -> first exec answered, a fresh `dev up` of each tree in turn (journal already on disk).

        Its own step (issue 50's cold-start work may give dev up a faster
        start or a mode of its own): the stacks of the other rows are stopped
        by then, so only the stack being timed runs.
        """
        runtimes = {side: Path(tempfile.mkdtemp(prefix=f"alc{side[0]}-", dir="/tmp")) for side in SIDES}
        colds: dict[str, list[float]] = {side: [] for side in SIDES}
        cpus: dict[str, list[float]] = {side: [] for side in SIDES}
        try:
            for i in range(self.plan.cold_starts + 1):  # the first pair makes each journal: not timed
                for side in alternate(i):
                    took, cpu = self._cold_once(side, runtimes[side])
                    if i:
                        colds[side].append(took)
                        cpus[side].append(cpu)
        finally:
            for runtime in runtimes.values():
                shutil.rmtree(runtime, ignore_errors=True)
        how = (
            f"{self.plan.cold_starts} fresh `airlock dev up` of each tree, alternating, from spawn to the first "
            "exec's reply (journal already on disk); median"
        )
        self.row("cold start to first exec answered (dev up)", "ms", colds, rate=False, how=how)
        how = (
            "the same starts: CPU time (user + system) of dev up and its services when the first exec's reply "
            "came; on a shared machine a neighbour stretches the wall time, not the work; median"
        )
        self.row("cold start CPU, dev up and its services", "ms", cpus, rate=False, how=how)

    def _cold_once(self, side: str, runtime: Path) -> tuple[float, float]:
        """(wall ms, CPU ms of the process tree) from spawn to the first exec's reply."""
        stack = BenchStack(self.config, runtime)
        with tree(self.trees[side]):
            stack.spawn()
        assert stack.proc is not None
        try:
            client = connect_when_bound(stack.agent, 30)
            reply = client.call(self.requests.exec_line(self.true_args))
            took = (time.perf_counter() - stack.started_at) * 1000
            cpu = cpu_ms(stack.proc.pid)
            client.close()
            if not reply.get("ok"):
                raise SystemExit(f"{side}: first exec after start failed: {reply}")
            runs_tree(stack, self.trees[side])
            return took, cpu
        finally:
            stack.stop()


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) of ``pid`` and its descendants so far, in ms (0 for one gone meanwhile)."""
    total = 0.0
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            total += cpu_ms(int(child))
    return total


def runs_tree(stack: BenchStack, services: Path) -> None:
    """SystemExit unless the stack's intake runs the code under ``services``: an A/A run would pass silently."""
    pid = stack.pid("intake")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if pid else []
    found = next((v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"PYTHONPATH=")), None)
    if found is None or Path(found).resolve() != services.resolve():
        raise SystemExit(f"bench-ab: the stack runs {found or 'no PYTHONPATH'}, not {services}")


def stop(stacks: dict[str, BenchStack]) -> None:
    for stack in stacks.values():
        stack.stop()
        stack.remove()


def row_names(plan: Plan) -> dict[str, list[tuple[str, str]]]:
    """Each step's rows (name, unit): what a step that fails or the old tree lacks still prints."""
    kind = "privileged" if ROOT else "unprivileged"
    return {
        "latency": [(f"exec `true` p50 ({kind})", "ms"), (f"exec `true` p99 ({kind})", "ms")],
        "throughput": [("exec throughput, 16 clients", "req/s")],
        "cli": [("airlock run -- true (installed layout)", "ms")],
        "approval": [("approval round trip p50 (approve returned -> job ran)", "ms")],
        "pipeline": [(f"{plan.pipeline_bytes >> 20} MiB through cat FILE | wc -c", "MiB/s")],
        "cold": [
            ("cold start to first exec answered (dev up)", "ms"),
            ("cold start CPU, dev up and its services", "ms"),
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True, type=Path, help="the services/ folder of the tree to compare with")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few samples, not numbers to quote")
    parser.add_argument("--only", nargs="+", choices=ROWS, help="only these rows")
    parser.add_argument(
        "--requests", type=int, help="exec latency requests per tree (default 1000; --quick 150; 0: no latency rows)"
    )
    parser.add_argument("--cold", type=int, help="cold starts per tree (default 10; --quick 2; 0: no cold row)")
    parser.add_argument("--json", type=Path, help="write the figures here (bench/results-ab.json: `make bench-doc`)")
    parser.add_argument("--before-name", default="", help="what --before is (a commit), for the figures")
    args = parser.parse_args(argv)
    before = args.before.resolve()
    if not (before / "airlock" / "__init__.py").exists():
        print(f"bench-ab: {before} is not a services/ folder (no airlock/__init__.py)", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    if args.requests is not None:
        plan = dataclasses.replace(plan, requests=args.requests)
    if args.cold is not None:
        plan = dataclasses.replace(plan, cold_starts=args.cold)
    skipped = {"latency"} if plan.requests <= 0 else set()
    skipped |= {"cold"} if plan.cold_starts <= 0 else set()
    rows = [row for row in args.only or ROWS if row not in skipped]
    before_name = args.before_name or str(before)
    run = machine() | {"load_average_start": list(os.getloadavg())}
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ab", dir="/tmp"))
    ab = AB(plan, {"before": before, "after": REPO / "services"}, before_name, work)
    try:
        names = row_names(plan)
        live = {"latency": ab.latency, "throughput": ab.throughput, "cli": ab.cli, "approval": ab.approval}
        live["pipeline"] = ab.pipeline
        if any(name in live for name in rows):
            stacks = ab.start()
            try:
                for name in (name for name in rows if name in live):
                    print(f"bench-ab: {name}", file=sys.stderr, flush=True)
                    ab.attempt(names[name], functools.partial(live[name], stacks))
            finally:
                stop(stacks)
        if "cold" in rows:  # after the pair above has stopped: only the stack being timed runs
            print("bench-ab: cold", file=sys.stderr, flush=True)
            ab.attempt(names["cold"], ab.cold)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run |= {
        "load_average_end": list(os.getloadavg()),
        "seconds": time.perf_counter() - started,
        "before": before_name,
        "requests": plan.requests,
        "quick": args.quick,
        "source": "bench/results-ab.json",
    }
    print(ab_table(ab.figures))
    print(
        f"(load average {run['load_average_start'][0]:.2f} at the start, {run['load_average_end'][0]:.2f} at the end)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results(ab.figures, run), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
