"""`make bench`: issue 9's and issue 21's figures, each beside its yardstick in the same run.

    .venv/bin/python bench/airlock_bench.py [--quick] [--only NAME ...] [--rounds N]

Prints one table and writes bench/results.json (with the machine).  Every
figure is a median over rounds; where it has a yardstick, the rounds of the
two alternate, so background load on a shared machine hits both alike.
Nothing here is a test: a missed target is reported, never asserted.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json as json_module
import os
import pwd
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fleet_bench
import journal_bench
import verify_bench

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "system"))  # nspawn, for the container
from harness import (
    REPO,
    SERVICES,
    BenchStack,
    Figure,
    Persistent,
    Requests,
    approved_once,
    bench_config,
    connect_when_bound,
    drive,
    machine,
    median,
    percentile,
    sudo_yardstick,
    table,
    time_subprocess,
    write_results,
)

ROOT = os.geteuid() == 0
GIB = 1 << 30
ASKS = 100_000  # approval.asks_per_minute for the stacks that ask on purpose (an agent gets 20)


@dataclass(frozen=True, slots=True)
class Plan:
    """How much work each figure does: `--quick` is for trying the bench out, not for numbers."""

    rounds: int
    latency_requests: int
    cli_runs: int
    exec_load: int
    ping_load: int
    cold_starts: int
    pipeline_bytes: int
    journal_appends: int
    memory_requests: int


FULL = Plan(
    rounds=5,
    latency_requests=200,
    cli_runs=20,
    exec_load=600,
    ping_load=20_000,
    cold_starts=5,
    pipeline_bytes=GIB,
    journal_appends=2000,
    memory_requests=20_000,
)
QUICK = Plan(
    rounds=2,
    latency_requests=50,
    cli_runs=5,
    exec_load=200,
    ping_load=4000,
    cold_starts=2,
    pipeline_bytes=GIB // 16,
    journal_appends=500,
    memory_requests=1000,
)


class Bench:
    def __init__(self, plan: Plan, workdir: Path) -> None:
        self.plan = plan
        self.workdir = workdir
        self.config = bench_config(workdir / "bench.yaml", root=ROOT)
        self.requests = Requests()
        self.figures: list[Figure] = []
        self.true_args = {"argv": ["true"], "privileged": ROOT}

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)
        print(f"  {figure.name}: done", file=sys.stderr, flush=True)

    def attempt(self, name: str, step: Callable[[], None]) -> None:
        """Run one step; if it fails, its row says so (n/a and why) and the other steps still run."""
        print(f"bench: {STEPS[name]}", file=sys.stderr, flush=True)
        try:
            step()
        except (SystemExit, Exception) as exc:  # a bench step's failure is a result to print, not a crash
            why = " ".join(str(exc).split())[:300] or type(exc).__name__
            print(f"bench: {name} failed: {why}", file=sys.stderr, flush=True)
            self.add(Figure(f"{STEPS[name]} (step '{name}')", None, "", note=f"failed: {why}"))

    # -- exec latency from a persistent client, beside sudo and a bare fork/exec -----

    def latency(self, stack: BenchStack, sudo_user: str | None) -> None:
        n = self.plan.latency_requests
        client = Persistent(stack.agent)
        for _ in range(20):  # warm up: imports, caches, the journal's first pages
            client.call(self.requests.exec_line(self.true_args))
        p50s, p99s, sudo50, sudo99, bare50 = [], [], [], [], []
        for _ in range(self.plan.rounds):
            samples = []
            for _ in range(n):
                line = self.requests.exec_line(self.true_args)
                start = time.perf_counter()
                reply = client.call(line)
                samples.append(time.perf_counter() - start)
                if not reply.get("ok"):
                    raise SystemExit(f"bench: exec of true failed: {reply}")
            p50s.append(percentile(samples, 50) * 1000)
            p99s.append(percentile(samples, 99) * 1000)
            if sudo_user is not None:
                sudo = [time_subprocess(["sudo", "-n", "/usr/bin/true"], user=sudo_user) for _ in range(n // 2)]
                sudo50.append(percentile(sudo, 50) * 1000)
                sudo99.append(percentile(sudo, 99) * 1000)
            bare = [time_subprocess(["/usr/bin/true"]) for _ in range(n)]
            bare50.append(percentile(bare, 50) * 1000)
        client.close()
        p50, p99 = median(p50s), median(p99s)
        s50 = median(sudo50) if sudo50 else None
        s99 = median(sudo99) if sudo99 else None
        what = f"{n} requests x {self.plan.rounds} rounds, one connection, allow rule, full audit"
        self.add(
            Figure(
                "exec true p50, persistent client",
                p50,
                "ms",
                "<= 0.6x sudo",
                "sudo -n true",
                s50,
                p50 / s50 if s50 else None,
                (p50 <= 0.6 * s50) if s50 else None,
                what,
                p50s,
            )
        )
        self.add(
            Figure(
                "exec true p99, persistent client",
                p99,
                "ms",
                "",
                "sudo -n true p99",
                s99,
                p99 / s99 if s99 else None,
                None,
                "",
                p99s,
            )
        )
        b50 = median(bare50)
        self.add(
            Figure(
                "exec true p50 vs bare fork/exec",
                p50,
                "ms",
                "",
                "fork/exec of true",
                b50,
                p50 / b50,
                None,
                "subprocess.run(['/usr/bin/true']) from the bench process",
                bare50,
            )
        )

    # -- `airlock run -- true` as a user types it ------------------------------------

    def cli(self, stack: BenchStack, sudo_user: str | None) -> None:
        venv = str(REPO / ".venv" / "bin" / "airlock")
        installed = _installed_layout(self.workdir)
        tail = ["run", "--socket", stack.agent, *([] if ROOT else ["--no-privilege"]), "--", "true"]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        for script in (venv, installed):
            check = subprocess.run([script, *tail], env=env, capture_output=True, text=True)
            if check.returncode != 0:
                raise SystemExit(f"bench: {script} run -- true failed ({check.returncode}): {check.stderr}")
        runs: dict[str, list[float]] = {venv: [], installed: []}
        sudos: list[float] = []
        for _ in range(self.plan.rounds):
            for _ in range(self.plan.cli_runs):  # the three alternate, run by run
                for script in (venv, installed):
                    runs[script].append(time_subprocess([script, *tail], env=env) * 1000)
                if sudo_user is not None:
                    sudos.append(time_subprocess(["sudo", "-n", "/usr/bin/true"], user=sudo_user) * 1000)
        s = median(sudos) if sudos else None
        interpreter = os.path.realpath(REPO / ".venv" / "bin" / "python")
        for script, name, how in (
            (
                venv,
                "airlock run -- true (venv)",
                f"{venv}: {interpreter} -I -S over the checkout's services/ (the Makefile writes it from the .deb's)",
            ),
            (
                installed,
                "airlock run -- true (installed layout)",
                "the .deb's console script (packaging/debian/airlock-console: #!/usr/bin/python3 -IS, no venv) "
                "over a copy of the package in a dist-packages-like folder",
            ),
        ):
            value = median(runs[script])
            self.add(
                Figure(
                    name,
                    value,
                    "ms",
                    "<= 3x sudo",
                    "sudo -n true",
                    s,
                    value / s if s else None,
                    (value <= 3 * s) if s else None,
                    f"whole command as typed; {how}; median of {len(runs[script])}",
                    runs[script],
                )
            )

    # -- what is left of `airlock run`: the interpreter's own start (issue 37) -------------

    def start(self, sudo_user: str | None) -> None:
        """Python's bare start beside `sudo -n true`, and the imports `airlock run` adds to it.

        All alternate run by run with sudo.  ``-I -S`` is how the .deb's
        /usr/bin/airlock starts (packaging/debian/airlock-console); the import
        row loads airlock.cli.quick from the installed-layout copy.
        """
        lib = Path(_installed_layout(self.workdir)).parent / "dist-packages"
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        variants = {
            "python3 -I -S -c pass": ["/usr/bin/python3", "-I", "-S", "-c", "pass"],
            "python3 -c pass (site)": ["/usr/bin/python3", "-c", "pass"],
            "python3 -I -S, import airlock.cli.quick": [
                "/usr/bin/python3",
                "-I",
                "-S",
                "-c",
                f"import sys; sys.path.append({str(lib)!r}); import airlock.cli.quick",
            ],
        }
        runs: dict[str, list[float]] = {name: [] for name in variants}
        sudos: list[float] = []
        for _ in range(self.plan.rounds):
            for _ in range(self.plan.cli_runs):
                for name, argv in variants.items():
                    runs[name].append(time_subprocess(argv, env=env) * 1000)
                if sudo_user is not None:
                    sudos.append(time_subprocess(["sudo", "-n", "/usr/bin/true"], user=sudo_user) * 1000)
        s = median(sudos) if sudos else None
        for name, samples in runs.items():
            value = median(samples)
            self.add(
                Figure(
                    f"start: {name}",
                    value,
                    "ms",
                    "",
                    "sudo -n true",
                    s,
                    value / s if s else None,
                    None,
                    f"process start to exit, Debian's /usr/bin/python3; median of {len(samples)}, alternating with sudo"
                    if name.endswith("pass")
                    else "",
                    samples,
                )
            )

    # -- throughput with 16 clients ----------------------------------------------------

    def throughput(self, stack: BenchStack) -> None:
        rates = []
        for _ in range(self.plan.rounds):
            load = drive(stack.agent, 16, self.plan.exec_load, lambda: self.requests.exec_line(self.true_args))
            if load.errors:
                raise SystemExit(f"bench: exec load had errors: {load.errors}")
            rates.append(load.rate)
        value = median(rates)
        self.add(
            Figure(
                "exec throughput, 16 clients",
                value,
                "req/s",
                ">= 600 req/s",
                met=value >= 600,
                note=f"{self.plan.exec_load} execs of true per round, 16 persistent connections from one "
                "asyncio client process on the same cores",
                samples=rates,
            )
        )
        rates = []
        for _ in range(self.plan.rounds):
            load = drive(stack.agent, 16, self.plan.ping_load, self.requests.ping_line)
            rates.append(load.rate)
        value = median(rates)
        self.add(
            Figure(
                "ping throughput, 16 clients",
                value,
                "req/s",
                ">= 5,000 req/s",
                met=value >= 5000,
                note="native ping without `time` (a health check: no journal round trip)",
                samples=rates,
            )
        )

    # -- cold start ------------------------------------------------------------------

    def cold_start(self) -> None:
        colds, warms = [], []
        runtime = Path(tempfile.mkdtemp(prefix="alc-", dir="/tmp"))
        for _ in range(self.plan.cold_starts):
            stack = BenchStack(self.config, runtime)
            stack.spawn()
            try:
                client = connect_when_bound(stack.agent, 30)
                reply = client.call(self.requests.exec_line(self.true_args))
                colds.append((time.perf_counter() - stack.started_at) * 1000)
                if not reply.get("ok"):
                    raise SystemExit(f"bench: first exec after start failed: {reply}")
                for _ in range(20):
                    start = time.perf_counter()
                    client.call(self.requests.exec_line(self.true_args))
                    warms.append((time.perf_counter() - start) * 1000)
                client.close()
            finally:
                stack.stop()
        stack.remove()
        cold, warm = median(colds), median(warms)
        self.add(
            Figure(
                "cold start to first exec answered (dev up)",
                cold,
                "ms",
                "<= 500 ms",
                "warm exec p50",
                warm,
                cold / warm,
                cold <= 500,
                "measured: a fresh `airlock dev up` (its four services started at once, journal already "
                "on disk) from spawn to the first exec's reply; dev mode cannot idle-exit services",
                colds,
            )
        )

    # -- 1 GiB through a pipeline -----------------------------------------------------

    def pipeline(self, stack: BenchStack) -> None:
        size = self.plan.pipeline_bytes
        data = self.workdir / "pipeline.bin"
        block = os.urandom(1 << 20)
        with open(data, "wb") as f:
            for _ in range(size // len(block)):
                f.write(block)
        os.chmod(data, 0o644)
        os.chmod(self.workdir, 0o755)
        client = Persistent(stack.agent)
        ours, shell = [], []
        for _ in range(self.plan.rounds):
            start = time.perf_counter()
            reply = client.call(
                self.requests.exec_line({"pipeline": [["cat", str(data)], ["wc", "-c"]], "privileged": ROOT})
            )
            ours.append(time.perf_counter() - start)
            out = base64.b64decode(reply.get("data", {}).get("stdout", "")).strip()
            if not reply.get("ok") or int(out or 0) != size:
                raise SystemExit(f"bench: the pipeline did not count {size} bytes: {reply}")
            start = time.perf_counter()
            subprocess.run(["sh", "-c", f"cat '{data}' | wc -c"], stdout=subprocess.DEVNULL, check=True)
            shell.append(time.perf_counter() - start)
        client.close()
        data.unlink()
        mib = size / (1 << 20)
        value, yard = mib / median(ours), mib / median(shell)
        self.add(
            Figure(
                f"{size >> 20} MiB through cat FILE | wc -c",
                value,
                "MiB/s",
                ">= 0.8x sh",
                "same in sh",
                yard,
                value / yard,
                value / yard >= 0.8,
                "file in the page cache; stages joined by OS pipes in both",
                [mib / s for s in ours],
            )
        )

    # -- journal appends ----------------------------------------------------------------

    def journal(self) -> None:
        bare, one, many = [], [], []
        for _ in range(self.plan.rounds):
            results = journal_bench.measure(self.plan.journal_appends, self.workdir)
            bare.append(results[0].rate)
            one.append(results[1].rate)
            many.append(results[2].rate)
        b, o, m = median(bare), median(one), median(many)
        self.add(
            Figure(
                "journal appends, 32 writers",
                m,
                "appends/s",
                ">= 5x one writer",
                "one writer",
                o,
                m / o,
                m / o >= 5,
                f"group commit, WAL + synchronous=FULL; bare SQLite (1 commit/row): {b:,.0f}/s = {m / b:.1f}x",
                many,
            )
        )

    # -- journal bytes per exec (issue 38) -------------------------------------------------

    def journal_bytes(self) -> None:
        """Database bytes each exec of `true` adds (live and sealed segments together), and records per exec."""
        n = self.plan.latency_requests * 4
        samples, records, payloads, chained = [], [], [], []
        for _ in range(self.plan.rounds):
            with BenchStack(self.config) as stack:
                client = Persistent(stack.agent)
                for _ in range(20):
                    client.call(self.requests.exec_line(self.true_args))
                before, seq_before = journal_size(stack.runtime_dir / "state")
                events_before = events_bytes(stack.runtime_dir / "state")
                for _ in range(n):
                    if not client.call(self.requests.exec_line(self.true_args)).get("ok"):
                        raise SystemExit("bench: exec of true failed")
                client.close()
                after, seq_after = journal_size(stack.runtime_dir / "state")
                events_after = events_bytes(stack.runtime_dir / "state")
                payloads.append(payload_bytes(stack.runtime_dir / "state", seq_before) / n)
                if events_before is not None and events_after is not None:
                    chained.append((events_after - events_before) / n)
            samples.append((after - before) / n)
            records.append((seq_after - seq_before) / n)
        value = median(samples)
        # The rest is the bounded tables (replay outcomes, request IDs) filling up: a host past its
        # first few hundred execs reuses their pages.
        split = (
            f"; of which the events table and its indexes {median(chained):,.0f} bytes per exec, the rest the "
            "bounded replay tables filling"
            if chained
            else ""
        )
        self.add(
            Figure(
                "journal bytes per exec",
                value,
                "bytes",
                "<= 2,500 bytes",
                "",
                None,
                None,
                value <= 2500,
                f"{n} execs of true x {self.plan.rounds} rounds, one connection; database pages used / exec; "
                f"{median(records):.1f} records per exec, {median(payloads):,.0f} bytes of payload per exec{split} "
                "(new journals on 16 KiB pages, where several execs' records share a leaf page)",
                samples,
            )
        )

    # -- audit chain verification (issue 38) ---------------------------------------------

    def verify(self) -> None:
        records = 200_000 if self.plan is not QUICK else 50_000
        day = 60_000 if self.plan is not QUICK else 20_000
        results = [verify_bench.measure(records, day, self.workdir) for _ in range(min(self.plan.rounds, 3))]
        full = [r.full_rate for r in results]
        reference = [r.reference_rate for r in results]
        incremental = [r.incremental_seconds for r in results]
        f, ref, inc = median(full), median(reference), median(incremental)
        self.add(
            Figure(
                f"audit verify --full, {records:,} records",
                f,
                "records/s",
                ">= 200,000 records/s",
                "the reference walk (verify before issue 38)",
                ref,
                f / ref,
                f >= 200_000,
                "SQLite in batches of 2,048, stored payload text spliced once a batch is proven canonical; "
                "from 100,000 records split into spans, one per core (helper processes, journal/spans.py): "
                "~0.57 s of CPU on each of two cores for 200,000; the one walk's parse and canonical re-encode "
                "are ~45 % of it (issue 50 in docs/benchmarks-log.md)",
                full,
            )
        )
        self.add(
            Figure(
                f"audit verify (incremental), {day:,} new records",
                inc * 1000,
                "ms",
                "< 1 s",
                met=inc < 1.0,
                note=f"from the last verified point; the journal holds {records + day:,} records",
                samples=[x * 1000 for x in incremental],
            )
        )

    # -- the fleet console (issue 49) ----------------------------------------------------

    def fleet(self) -> None:
        """The fleet page over 1,000 hosts and 10,000 pending requests (a FAKE relay feed, no SSH), and a
        grouped decision carried to 100 hosts that a FAKE ssh command plays."""
        # Each round in a process of its own: its memory and caches start cold.
        script = str(Path(fleet_bench.__file__))
        argv = [sys.executable, script]
        rounds = range(min(self.plan.rounds, 3))
        done = [subprocess.run(argv, capture_output=True, check=True, timeout=600) for _ in rounds]
        runs = [json_module.loads(d.stdout) for d in done]
        page = [r["page_p99"] for r in runs]
        note = (
            "hosts simulated by a FAKE relay feed (bench/fleet_bench.py): 100 rows of 100 hosts and 1,000 host "
            "cards, no SSH; loaded signed in (the session's cookie and the tab's proof)"
        )
        self.add(
            Figure(
                "fleet page p99, 1,000 hosts, 10,000 pending",
                median(page),
                "ms",
                "< 500 ms",
                met=median(page) < 500,
                note=note,
                samples=page,
            )
        )
        grown = [r["rss_after"] - r["rss_before"] for r in runs]
        self.add(
            Figure(
                "fleet console memory for 10,000 pending (RSS growth)",
                median(grown),
                "MiB",
                "<= 100 MiB",
                met=median(grown) <= 100,
                samples=grown,
            )
        )
        group = [r["group_100_ms"] for r in runs]
        self.add(Figure("a group's challenge over 100 hosts' statements", median(group), "ms", samples=group))
        reach = [r["decision_100_ms"] for r in runs]
        fake = (
            "hosts simulated: 100 FAKE hosts, a fake `ssh` first on PATH that answers each call at once "
            "(bench/fleet_bench.py FAKE_SSH); the console's real carry path (one ssh process per host, "
            "32 at once, then each host asked again: pending, running, status); no network, no remote airlock"
        )
        self.add(
            Figure("a grouped decision reaching 100 hosts (fake ssh)", median(reach), "ms", note=fake, samples=reach)
        )

    # -- resident memory ------------------------------------------------------------------

    def reviewer(self) -> None:
        """Issue 34: an ask decided by the reviewer (a minimal script that allows), ask to decision.

        The yardstick is the same request allowed by a rule in the same stack:
        the difference is the reviewer's round trip (approval -> runner ->
        its sandboxed process as ``nobody`` -> answer read -> journaled).
        """
        if not ROOT:
            self.add(Figure("ask decided by the reviewer p50", None, "ms", note="needs root (reviewer user)"))
            return
        folder = self.workdir / "reviewer"
        folder.mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.workdir, 0o755)  # the reviewer user must reach its program
        script = folder / "allow-all"
        script.write_text(
            "#!/usr/bin/python3 -I\nimport json, sys\njson.load(sys.stdin)\n"
            'print(json.dumps({"decision": "allow", "reason": "bench"}))\n'
        )
        os.chmod(script, 0o755)
        user = pwd.getpwuid(os.getuid()).pw_name
        reviewed = {
            "name": "bench-reviewed",
            "decision": "ask",
            "reviewer": "allow",
            "users": [user],
            "privileged": ROOT,
            "commands": [["/usr/bin/true", "reviewed"]],
        }
        ruled = {
            "name": "bench-ruled",
            "decision": "allow",
            "users": [user],
            "privileged": ROOT,
            "commands": [["/usr/bin/true", "ruled"]],
        }
        config = bench_config(
            self.workdir / "reviewer.yaml",
            root=ROOT,
            extra={
                # The bench asks far more often than an agent may (approval.asks_per_minute, 20).
                "approval": {"reviewer_command": [str(script)], "reviewer_user": "nobody", "asks_per_minute": ASKS},
                "policy": {"default": "deny", "rules": [reviewed, ruled]},
            },
        )
        n = max(5, self.plan.latency_requests // 10)
        via, rule = [], []
        with BenchStack(config) as stack:
            client = Persistent(stack.agent)
            for _ in range(3):
                client.call(self.requests.exec_line({"argv": ["true", "reviewed"], "privileged": ROOT}))
            for _ in range(self.plan.rounds):
                for argv, into in ((["true", "reviewed"], via), (["true", "ruled"], rule)):
                    samples = []
                    for _ in range(n):
                        line = self.requests.exec_line({"argv": argv, "privileged": ROOT})
                        start = time.perf_counter()
                        reply = client.call(line)
                        samples.append(time.perf_counter() - start)
                        if not reply.get("ok"):
                            raise SystemExit(f"bench: {argv} failed: {reply}")
                    into.append(percentile(samples, 50) * 1000)
            client.close()
        p50, yard = median(via), median(rule)
        self.add(
            Figure(
                "ask decided by the reviewer p50",
                p50,
                "ms",
                "",
                "the same exec allowed by a rule",
                yard,
                p50 / yard if yard else None,
                None,
                f"{n} requests x {self.plan.rounds} rounds; reviewer: a python script that allows, as nobody",
                via,
            )
        )

    def approval(self) -> None:
        """Issue 37: a pending request approved by an operator -> the job started, after the approve call returns.

        The agent sends ``exec`` of ``true asked`` (rule: ask) and reads the
        ``pending_approval`` event; the operator's ``approve`` goes to
        operator.sock; the figure is from the approve reply to the agent's
        final reply (the job started *and* finished: ``true`` ends at once,
        so this bounds "started" from above).  The yardstick is the same
        exec allowed by a rule in the same stack, alternating.
        """
        user = pwd.getpwuid(os.getuid()).pw_name
        asked = {
            "name": "bench-asked",
            "decision": "ask",
            "users": [user],
            "privileged": ROOT,
            "commands": [["/usr/bin/true", "asked"]],
        }
        ruled = {
            "name": "bench-ruled",
            "decision": "allow",
            "users": [user],
            "privileged": ROOT,
            "commands": [["/usr/bin/true", "ruled"]],
        }
        config = bench_config(
            self.workdir / "approval.yaml",
            root=ROOT,
            extra={"approval": {"asks_per_minute": ASKS}, "policy": {"default": "deny", "rules": [asked, ruled]}},
        )
        n = max(5, self.plan.latency_requests // 10)
        after, calls, rule = [], [], []
        with BenchStack(config) as stack:
            agent, operator = Persistent(stack.agent), Persistent(stack.operator)
            for _ in range(3):
                self._approved_once(agent, operator)
            for _ in range(self.plan.rounds):
                a, c, r = [], [], []
                for _ in range(n):
                    approve_took, to_job = self._approved_once(agent, operator)
                    a.append(to_job)
                    c.append(approve_took)
                    line = self.requests.exec_line({"argv": ["true", "ruled"], "privileged": ROOT})
                    start = time.perf_counter()
                    if not agent.call(line).get("ok"):
                        raise SystemExit("bench: exec of `true ruled` failed")
                    r.append(time.perf_counter() - start)
                after.append(percentile(a, 50) * 1000)
                calls.append(percentile(c, 50) * 1000)
                rule.append(percentile(r, 50) * 1000)
            agent.close()
            operator.close()
        p50, yard = median(after), median(rule)
        self.add(
            Figure(
                "approval round trip p50 (approve returned -> job ran)",
                p50,
                "ms",
                "<= 20 ms",
                "the same exec allowed by a rule",
                yard,
                p50 / yard if yard else None,
                p50 <= 20,
                f"{n} requests x {self.plan.rounds} rounds: from the operator's approve reply to the agent's reply "
                f"(true started and ended); the approve call itself took p50 {median(calls):.2f} ms",
                after,
                extra={"approve_call_ms": calls},
            )
        )

    def _approved_once(self, agent: Persistent, operator: Persistent) -> tuple[float, float]:
        """(approve call, approve reply -> agent's reply) in seconds, for one asked exec."""
        args = {"argv": ["true", "asked"], "privileged": ROOT, "stream": True}
        return approved_once(agent, operator, self.requests.exec_line(args))

    def memory(self) -> None:
        total = self.plan.memory_requests
        half = total // 4  # issue 21: growth from 5,000 to 20,000
        rss: dict[int, dict[str, float]] = {}
        with BenchStack(self.config) as stack:

            def sample(done: int) -> None:
                if done in (half, total):
                    rss[done] = {s: stack.rss_mib(s) for s in SERVICES}

            load = drive(stack.agent, 16, total, lambda: self.requests.exec_line(self.true_args), on_reply=sample)
            if load.errors:
                raise SystemExit(f"bench: memory load had errors: {load.errors}")
        at_end = rss.get(total, {})
        growth = {s: at_end.get(s, 0) - rss.get(half, {}).get(s, 0) for s in SERVICES}
        worst = max(at_end.values()) if at_end else None
        met = worst is not None and worst <= 40 and max(growth.values()) <= 1.0
        detail = ", ".join(f"{s} {at_end.get(s, 0):.1f} ({growth[s]:+.1f})" for s in SERVICES)
        self.add(
            Figure(
                f"RSS per service after {total:,} requests (max)",
                worst,
                "MiB",
                f"<= 40 MiB, growth {half:,}-{total:,} <= 1 MiB",
                met=met,
                note=f"MiB after {total:,} execs (growth since {half:,}): {detail}",
                extra={"rss": rss, "growth": growth},
            )
        )


SYSTEM_RESULTS = REPO / "bench" / "results-system.json"


def container(plan: Plan, path: Path = SYSTEM_RESULTS) -> str | None:
    """Run bench/cold_container.py's measurement (root, the .deb in AIRLOCK_DEB); None, or why it did not run."""
    if not ROOT:
        return "not root: the container rows boot a Debian 12 container (systemd-nspawn)"
    deb = os.environ.get("AIRLOCK_DEB")
    if not deb or not Path(deb).is_file():
        return "no .deb: `make bench` builds one as root (AIRLOCK_DEB names it)"
    try:
        import cold_container
        from nspawn import Unavailable

        rounds, warm = (10, 10) if plan is FULL else (3, 5)
        result = cold_container.measure(Path(deb).resolve(), rounds, warm)
    except (Unavailable, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return f"the container bench failed: {str(exc).strip()[-400:]}"
    result["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path.write_text(json_module.dumps(result, indent=2) + "\n")
    return None


BESIDE_SYSTEMD = (
    "airlock run -- true beside systemd-run --wait --pipe -q true (container)",
    "airlock run -- true beside systemd-run --scope -q true (container)",
    "airlock run -- true, sandboxed rule (a service per job), warm (container)",
    "exec helper before a sandboxed job's program (container)",
)


def _beside_systemd(data: dict[str, Any], earlier: dict[str, Any]) -> list[Figure]:
    """Issue 50: airlock run -- true beside systemd's own unit per command, alternating run by run."""
    side = data.get("beside_systemd")
    if not side:
        why = "not in the container results (written before issue 50)"
        return [Figure(name, None, "ms", note=why) for name in BESIDE_SYSTEMD]
    typed, sudo = median(side["privileged"]), median(side["sudo"])
    service, scope, sandboxed = (median(side[k]) for k in ("systemd_run_service", "systemd_run_scope", "sandboxed"))
    n = len(side["privileged"])
    how = (
        f"/usr/bin/airlock run -- true by the agent, alternating run by run with sudo -n true, systemd-run "
        f"(as root) and the sandboxed rule's run; median of {n}; sudo -n true in the same rounds {sudo:.2f} ms"
    )
    helper, bare = median(data["helper"]), median(data["helper_bare"])
    return [
        Figure(
            BESIDE_SYSTEMD[0],
            typed,
            "ms",
            "<= 1.2x",
            "systemd-run --wait --pipe -q true (a transient service per command, as run0)",
            service,
            typed / service,
            typed <= 1.2 * service,
            how,
            side["privileged"],
            extra=dict(earlier),
        ),
        Figure(
            BESIDE_SYSTEMD[1],
            typed,
            "ms",
            "",
            "systemd-run --scope -q true",
            scope,
            typed / scope,
            None,
            how,
            side["privileged"],
            extra=dict(earlier),
        ),
        Figure(
            BESIDE_SYSTEMD[2],
            sandboxed,
            "ms",
            "",
            "sudo -n true (same container, same user)",
            sudo,
            sandboxed / sudo,
            None,
            f"airlock run -- true sandboxed (a rule with sandbox: no_new_privileges, the cheapest: a transient "
            f"service per job, the exec helper in front); {how}",
            side["sandboxed"],
            extra=dict(earlier),
        ),
        Figure(
            BESIDE_SYSTEMD[3],
            helper - bare,
            "ms",
            "< 1 ms",
            "/usr/bin/true alone",
            bare,
            helper / bare,
            helper - bare < 1.0,
            f"python3 -I -S -c HELPER (runner/exechelper.py) executing /usr/bin/true, less "
            f"/usr/bin/true alone, alternating, as root; median of {len(data['helper'])} (helper {helper:.2f} ms)",
            data["helper"],
            extra=dict(earlier),
        ),
    ]


def system_figures(path: Path = SYSTEM_RESULTS, why_not: str | None = None) -> list[Figure]:
    """The container rows (issue 21, 37): from this run's container step, else the last one's file, else why not."""
    names = (
        ("cold start, socket activation (container)", "<= 300 ms"),
        ("airlock run -- true, installed, service containment, warm (container)", "<= 3x sudo"),
        ("airlock run --no-privilege -- true, installed, warm (container)", ""),
    )
    try:
        data = json_module.loads(path.read_text())
    except (OSError, ValueError):
        reason = why_not or "`make bench` as root runs it (or `make bench-system`)"
        return [Figure(name, None, "ms", target, note=f"not measured: {reason}") for name, target in names]
    when = data.get("measured_at") or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
    source = "this run" if why_not is None and data.get("measured_at") else f"{path.name} of {when}"
    if why_not is not None:
        source += f" (not re-measured: {why_not})"
    cold, warm, bare = median(data["cold"]), median(data["warm"]), median(data["bare"])
    load = float(data.get("loadavg", [0.0])[0])
    # Rows not re-measured keep their own date (docs/benchmarks.md's table says it: bench/bench_doc.py).
    earlier = {} if source == "this run" else {"measured_at": when, "load_average": load}
    figures = [
        Figure(
            names[0][0],
            cold,
            "ms",
            names[0][1],
            "warm airlock run",
            warm,
            cold / warm,
            cold <= 300,
            f"{source}, container load average {load:.2f}: every airlock service stopped, the first "
            f"/usr/bin/airlock run --no-privilege -- true by an agent in the Debian 12 container, start to exit; "
            f"median of {len(data['cold'])}",
            data["cold"],
            extra=dict(earlier),
        ),
    ]
    if data.get("privileged") and data.get("sudo"):
        typed, sudo = median(data["privileged"]), median(data["sudo"])
        figures.append(
            Figure(
                names[1][0],
                typed,
                "ms",
                names[1][1],
                "sudo -n true (same container, same user)",
                sudo,
                typed / sudo,
                typed <= 3 * sudo,
                f"/usr/bin/airlock run -- true as typed (privileged; containment reported: "
                f"{data.get('containment')}), services running, alternating run by run with sudo; "
                f"median of {len(data['privileged'])}",
                data["privileged"],
                extra=dict(earlier),
            )
        )
    else:
        figures.append(
            Figure(names[1][0], None, "ms", names[1][1], note=f"not in {path.name} (written before issue 37)")
        )
    figures += _beside_systemd(data, earlier)
    if data.get("process_group") and data.get("process_group_sudo"):
        grouped, sudo = median(data["process_group"]), median(data["process_group_sudo"])
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in (data.get("cpu_ms_per_run") or {}).items())
        cpu_grouped = ", ".join(f"{k} {v:.1f}" for k, v in (data.get("process_group_cpu_ms_per_run") or {}).items())
        figures.append(
            Figure(
                "airlock run -- true, installed, process-group containment, warm (container)",
                grouped,
                "ms",
                "",
                "sudo -n true (same container, same user)",
                sudo,
                grouped / sudo,
                None,
                f"the row above with runner.containment: process-group (no unit per job), alternating with sudo; "
                f"median of {len(data['process_group'])}; services' CPU ms per run, service containment: {cpu}; "
                f"process-group: {cpu_grouped}",
                data["process_group"],
                extra=dict(earlier),
            )
        )
    figures.append(
        Figure(
            names[2][0],
            warm,
            "ms",
            "",
            "fork/exec of true",
            bare,
            warm / bare,
            None,
            f"the .deb's /usr/bin/airlock in the container, services running; median of {len(data['warm'])}",
            data["warm"],
            extra=dict(earlier),
        )
    )
    return figures


def _installed_layout(workdir: Path) -> str:
    """/usr/bin/airlock as the .deb installs it, without installing it: packaging/debian/airlock-console
    (Debian's python3 -I -S, no venv) and the package in a folder of its own on the path."""
    lib = workdir / "dist-packages"
    if not lib.exists():
        import shutil

        shutil.copytree(REPO / "services" / "airlock", lib / "airlock", ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["/usr/bin/python3", "-m", "compileall", "-q", str(lib)], check=True)
    script = workdir / "airlock"
    # The .deb's own /usr/bin/airlock (-I -S), with this folder where the package would be.
    console = (REPO / "packaging" / "debian" / "airlock-console").read_text()
    script.write_text(console.replace('"/usr/lib/python3/dist-packages"', repr(str(lib))))
    script.chmod(0o755)
    os.chmod(workdir, 0o755)
    return str(script)


def journal_size(state: Path) -> tuple[int, int]:
    """Bytes of pages in use in the journal (the live database and every sealed segment), and its newest seq."""

    used, head = 0, 0
    paths = [state / "journal.sqlite", *sorted((state / "segments").glob("journal-*.db"))]
    for path in paths:
        if not path.exists():
            continue
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            size = conn.execute("PRAGMA page_size").fetchone()[0]
            used += (pages - free) * size
            head = max(head, conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0])
        finally:
            conn.close()
    return used, head


def events_bytes(state: Path) -> int | None:
    """Bytes of the live database's pages holding the events table and its indexes (None without dbstat)."""
    conn = sqlite3.connect(f"file:{state / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT SUM(pgsize) FROM dbstat WHERE name = 'events' OR name LIKE 'events\\_%' ESCAPE '\\'"
        ).fetchone()
    except sqlite3.OperationalError:  # an SQLite built without the dbstat table
        return None
    finally:
        conn.close()
    return int(row[0] or 0)


def payload_bytes(state: Path, after_seq: int) -> int:
    """Bytes of record payload (canonical JSON) past ``after_seq`` in the live database (issue 50)."""
    conn = sqlite3.connect(f"file:{state / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        return int(
            conn.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM events WHERE seq > ?", (after_seq,)).fetchone()[
                0
            ]
        )
    finally:
        conn.close()


STEPS: dict[str, str] = {
    "latency": "exec latency beside sudo and fork/exec",
    "cli": "airlock run -- true beside sudo",
    "start": "python's own start beside sudo (what is left of airlock run)",
    "throughput": "exec and ping with 16 clients",
    "pipeline": "1 GiB through cat | wc -c beside sh",
    "cold": "cold start",
    "journal": "journal appends",
    "memory": "resident memory after many requests",
    "bytes": "journal bytes per exec",
    "verify": "audit chain verify: full walk and incremental",
    "reviewer": "an ask decided by the reviewer, beside a rule's allow",
    "approval": "an ask approved by an operator: approve returned -> job ran",
    "fleet": "the fleet console: 1,000 hosts and 10,000 pending from a FAKE relay feed, a decision to 100 FAKE ssh "
    "hosts (issue 49)",
    "container": "the Debian 12 container: cold start under socket activation, airlock run beside sudo (root)",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and requests (to try it, not to quote)")
    parser.add_argument("--only", nargs="+", choices=sorted(STEPS), help="run only these figures")
    parser.add_argument("--rounds", type=int, help="rounds per figure (default 5, quick 2)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = dataclasses.replace(plan, rounds=max(1, args.rounds))
    wanted = set(args.only or STEPS)
    info = machine() | {"load_average_start": os.getloadavg(), "plan": dataclasses.asdict(plan)}
    started = time.monotonic()
    print(
        f"airlock bench on {info['cores']} cores, {info['memory_gib']} GiB, kernel {info['kernel']}, "
        f"python {info['python']}, load average {info['load_average_start'][0]:.2f}",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="airlock-bench-", dir="/var/tmp") as tmp:
        bench = Bench(plan, Path(tmp))
        with sudo_yardstick() as sudo_user:
            if "start" in wanted:
                bench.attempt("start", lambda: bench.start(sudo_user))
            if wanted & {"latency", "cli", "throughput", "pipeline"}:
                with BenchStack(bench.config) as stack:
                    for name, step in (
                        ("latency", lambda: bench.latency(stack, sudo_user)),
                        ("cli", lambda: bench.cli(stack, sudo_user)),
                        ("throughput", lambda: bench.throughput(stack)),
                        ("pipeline", lambda: bench.pipeline(stack)),
                    ):
                        if name in wanted:
                            bench.attempt(name, step)
        for name, step in (
            ("cold", bench.cold_start),
            ("journal", bench.journal),
            ("memory", bench.memory),
            ("bytes", bench.journal_bytes),
            ("verify", bench.verify),
            ("reviewer", bench.reviewer),
            ("approval", bench.approval),
            ("fleet", bench.fleet),
        ):
            if name in wanted:
                bench.attempt(name, step)
        why_not: str | None = "not asked for (--only)"
        if "container" in wanted:
            print(f"bench: {STEPS['container']}", file=sys.stderr, flush=True)
            why_not = container(plan)
            if why_not is not None:
                print(f"bench: container rows: {why_not}", file=sys.stderr, flush=True)
        figures = bench.figures + system_figures(why_not=why_not)
    info["load_average_end"] = os.getloadavg()
    info["seconds"] = round(time.monotonic() - started, 1)
    print()
    print(
        f"airlock bench, {info['date']}: {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB, "
        f"kernel {info['kernel']}, python {info['python']}, root={info['root']}, "
        f"load average {info['load_average_start'][0]:.2f} -> {info['load_average_end'][0]:.2f}, "
        f"{info['seconds']:.0f} s"
    )
    print(table(figures))
    write_results(figures, info)
    print(f"\nwritten to {Path('bench/results.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
