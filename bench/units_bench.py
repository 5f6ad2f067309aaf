"""Exec latency per containment, in one run: a unit per stage (scope or service) vs the old scope vs process group.

    python3 bench/units_bench.py [--jobs 200]      # as root, with systemd as PID 1

Runs ``/usr/bin/true`` as a root job through `spawn.run_job` (the runner's own
start path, without the sockets, ticket and journal around it), alternating
the containments job by job so background load hits them alike: ``service``
without a sandbox (since issue 50 a scope per stage, forked by the fork
server), ``service`` with a service-only sandbox property
(``no_new_privileges``: a transient service per stage with the exec helper,
every job's path before issue 50), ``scope`` (the runner forks, a gate shim,
busctl) and ``process-group``; and, in the same rounds, ``systemd-run --wait
--pipe -q true`` and ``systemd-run --scope -q true`` (their own process start
included).  Prints p50/p90/p99 per mode, the ratios and the D-Bus method
calls the runner made per job of each unit mode.  On a machine
without systemd it says so and exits 2.  Not a test: nothing is asserted
beyond every job exiting 0.  The system tests' container can run it:
``nsenter -t <PID 1> -a python3 /path/to/units_bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any

from airlock.common.sandbox import Sandbox
from airlock.runner.identity import resolve_identity
from airlock.runner.spawn import JobSpec, run_job, systemd_is_running
from airlock.runner.units import ENV_DIR

# (label, containment, the stage's sandbox or None), alternating job by job with the systemd-run yardsticks.
MODES: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
    ("service: scope stage", "service", None),
    ("service: service stage", "service", {"no_new_privileges": True}),
    ("scope (runner-forked)", "scope", None),
    ("process-group", "process-group", None),
)
YARDSTICKS = {
    "systemd-run --wait --pipe": ["systemd-run", "--wait", "--pipe", "-q", "/usr/bin/true"],
    "systemd-run --scope": ["systemd-run", "--scope", "-q", "/usr/bin/true"],
}


class CallCounter:
    """Counts the D-Bus method calls made through python3-dbus (service mode's only client)."""

    def __init__(self) -> None:
        self.calls = 0
        try:
            import dbus.connection  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError:
            return
        connection = dbus.connection.Connection
        for name in ("call_blocking", "call_async"):
            method = getattr(connection, name)
            setattr(connection, name, self._counting(method))

    def _counting(self, method: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return method(*args, **kwargs)

        return counted


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=200, help="jobs per mode (default 200)")
    args = parser.parse_args()
    if os.geteuid() != 0 or not systemd_is_running():
        print("units_bench: needs root and systemd as PID 1", file=sys.stderr)
        return 2
    os.makedirs(ENV_DIR, mode=0o700, exist_ok=True)
    identity = resolve_identity(0)
    times: dict[str, list[float]] = {label: [] for label in (*(m[0] for m in MODES), *YARDSTICKS)}
    counter = CallCounter()
    calls: dict[str, int] = {label: 0 for label, _mode, _sb in MODES}
    for index in range(args.jobs + 5):
        for label, argv in YARDSTICKS.items():
            started = time.perf_counter()
            subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)  # noqa: ASYNC221  timed as a user runs it
            if index >= 5:
                times[label].append((time.perf_counter() - started) * 1000)
        for label, mode, settings in MODES:
            spec = JobSpec(
                operation_id=f"bench-{os.getpid()}-{index}",
                mode="exec",
                stages=(("/usr/bin/true",),),
                identity=identity,
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                stdin=None,
                timeout_seconds=30,
                deadline=None,
                max_output_bytes=65536,
                kill_grace_seconds=2,
                protected_values=(),
                containment=mode,  # type: ignore[arg-type]
                sandboxes=(Sandbox.of(settings),) if settings else None,
            )
            calls_before = counter.calls
            started = time.perf_counter()
            result = await run_job(spec)
            elapsed = (time.perf_counter() - started) * 1000
            if index >= 5:
                calls[label] += counter.calls - calls_before
            if result.stages[0].exit_code != 0:
                print(f"units_bench: {label} job {index} failed: {result.stages[0]}", file=sys.stderr)
                return 1
            if index >= 5:  # warm-up
                times[label].append(elapsed)
    print(f"exec latency of /usr/bin/true as a root job, {args.jobs} jobs per mode, alternating (ms)")
    print(f"{'containment':<28}{'p50':>8}{'p90':>8}{'p99':>8}")
    for label, values in times.items():
        print(
            f"{label:<28}{percentile(values, 0.5):>8.1f}{percentile(values, 0.9):>8.1f}{percentile(values, 0.99):>8.1f}"
        )
    p50 = {label: percentile(values, 0.5) for label, values in times.items()}
    for label in ("service: scope stage", "service: service stage"):
        print(
            f"{label} p50 / systemd-run --wait --pipe: {p50[label] / p50['systemd-run --wait --pipe']:.2f}x, "
            f"/ systemd-run --scope: {p50[label] / p50['systemd-run --scope']:.2f}x"
        )
    for label, _mode, _sb in MODES:
        print(f"{label}: {calls[label] / args.jobs:.1f} D-Bus calls per job")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
