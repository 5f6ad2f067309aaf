"""`make bench-system`: cold start under real socket activation, in the system tests' Debian 12 container.

Boots the container (tests/system/nspawn.py, the cached root plus sudo),
installs the .deb named by AIRLOCK_DEB, adds an agent user, rules that allow
``/usr/bin/true`` (unprivileged and privileged) and a sudoers NOPASSWD rule
for the same user and command, then, round after round: stops every airlock
service (the sockets stay listening, as after an idle exit), and times the
first ``airlock run --no-privilege -- true`` typed by the agent, from process
start to exit -- systemd starts intake, approval, runner and journal on
demand.  Then the same command with every service running (warm), in the
same rounds.  Then (issue 37) ``airlock run -- true`` as typed (privileged:
the runner's default containment under systemd, each job a transient
service) alternating run by run with ``sudo -n true`` by the same user,
with each service's CPU per run; then the same with ``runner.containment:
process-group`` (what the unit costs).  Before those (issue 50), alternating run
by run: the same command, ``sudo -n true``, ``systemd-run --wait --pipe -q
true`` and ``systemd-run --scope -q true`` (as root: they need it) and
``airlock run -- true sandboxed`` (a rule with a sandbox: a service per job),
then the sandboxed service's exec helper alone beside ``/usr/bin/true``.

    AIRLOCK_DEB=dist/airlock_*.deb .venv/bin/python bench/cold_container.py [--rounds N] [--json FILE]

airlock_bench.py calls `measure` when `make bench` runs as root.

Prints one line per figure; with ``--json`` writes them for airlock_bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "system"))

from nspawn import Container, booted  # noqa: E402

sys.path.insert(0, str(HERE.parent / "services"))
from airlock.runner.exechelper import HELPER  # noqa: E402  the exec helper a sandboxed job's service runs

POLICY = """\
rules:
  - name: bench-true
    decision: allow
    groups: [airlock]
    privileged: false
    commands:
      - [/usr/bin/true]
  - name: bench-true-privileged
    decision: allow
    groups: [airlock]
    privileged: true
    commands:
      - [/usr/bin/true]
  - name: bench-true-sandboxed
    decision: allow
    groups: [airlock]
    privileged: true
    commands:
      - [/usr/bin/true, sandboxed]
    sandbox: {no_new_privileges: true}
"""
SUDOERS = "agent1 ALL=(root) NOPASSWD: /usr/bin/true\n"

# Runs inside the container as root; prints one JSON object.
INNER = r"""
import grp, json, os, statistics, subprocess, sys, time
SERVICES = ["airlock-intake.service", "airlock-approval.service", "airlock-runner.service", "airlock-journal.service"]
rounds, warm_runs = int(sys.argv[1]), int(sys.argv[2])
gid = grp.getgrnam("airlock").gr_gid
env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/home/agent1"}

def run(argv=("/usr/bin/airlock", "run", "--no-privilege", "--", "true")):
    start = time.perf_counter()
    r = subprocess.run(list(argv), user="agent1", group="agent1",
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
# Issue 37: as typed (privileged), warm, beside sudo by the same user, alternating run by run.
typed, sudo = ["/usr/bin/airlock", "run", "--", "true"], ["sudo", "-n", "/usr/bin/true"]
evidence = subprocess.run(["/usr/bin/airlock", "run", "--json", "--", "true"], user="agent1", group="agent1",
                          extra_groups=[gid], env=env, capture_output=True, text=True)
containment = (json.loads(evidence.stdout or "{}").get("data") or {}).get("containment")
run(typed), run(sudo)
def pids():
    out = {}
    for s in SERVICES:
        show = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", s], capture_output=True, text=True)
        out[s.split("-")[1].split(".")[0]] = int(show.stdout.strip() or 0)
    return out

def cpu_ms(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")

def run_root(argv):
    start = time.perf_counter()
    r = subprocess.run(list(argv), env=env, stdin=subprocess.DEVNULL, capture_output=True)
    took = (time.perf_counter() - start) * 1000
    if r.returncode != 0:
        raise SystemExit(f"{argv} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    return took

def typed_beside_sudo(n):
    # n runs of each, alternating; and each service's CPU ms per typed run (sudo's runs cost them nothing).
    before = {s: cpu_ms(p) for s, p in pids().items() if p}
    ours, theirs = [], []
    for _ in range(n):
        ours.append(run(typed))
        theirs.append(run(sudo))
    cpu = {s: round((cpu_ms(p) - before[s]) / n, 2) for s, p in pids().items() if s in before}
    return ours, theirs, cpu

# Issue 50: the same command beside systemd's own tools for a unit per command (as root, which they
# need: run0 would ask polkit), and a rule with a sandbox (a service per job, its exec helper in front),
# all alternating run by run.  Then the helper alone: python3 -I -S -c HELPER before /usr/bin/true,
# beside /usr/bin/true (what a sandboxed job's service pays for the binary check).
YARDSTICKS = {
    "systemd_run_service": ["systemd-run", "--wait", "--pipe", "-q", "/usr/bin/true"],
    "systemd_run_scope": ["systemd-run", "--scope", "-q", "/usr/bin/true"],
}
sandboxed = ["/usr/bin/airlock", "run", "--", "true", "sandboxed"]

def beside_systemd(n):
    out = {"privileged": [], "sudo": [], "sandboxed": [], **{k: [] for k in YARDSTICKS}}
    for _ in range(n):
        out["privileged"].append(run(typed))
        out["sudo"].append(run(sudo))
        for name, argv in YARDSTICKS.items():
            out[name].append(run_root(argv))
        out["sandboxed"].append(run(sandboxed))
    return out

run(sandboxed), [run_root(a) for a in YARDSTICKS.values()]
side = beside_systemd(max(40, rounds * warm_runs // 2))
st, here = os.stat("/usr/bin/true"), os.stat(".")  # the helper compares its cwd with the held one's
helper_argv = ["python3", "-I", "-S", "-c", open("/root/helper.py").read(), "/usr/bin/true", str(st.st_dev),
               str(st.st_ino), str(st.st_uid), str(st.st_mode & 0o7777), f"{here.st_dev}:{here.st_ino}",
               "/usr/bin/true"]
helper, helper_bare = [], []
for _ in range(max(40, rounds * warm_runs // 2)):
    helper.append(run_root(helper_argv))
    helper_bare.append(run_root(["/usr/bin/true"]))
privileged, sudos, cpu = typed_beside_sudo(rounds * warm_runs)
# The same with each job in the runner's process group instead of a transient unit: what the unit costs.
with open("/etc/airlock/airlock.yaml", "a") as f:
    f.write("\nrunner:\n  containment: process-group\n")
subprocess.run(["systemctl", "restart", "airlock-runner.service"], check=True)
run(typed)
grouped, grouped_sudo, grouped_cpu = typed_beside_sudo(max(10, rounds * warm_runs // 2))
print(json.dumps({"cold": cold, "warm": warm, "bare": bare, "privileged": privileged, "sudo": sudos,
                  "containment": containment, "cpu_ms_per_run": cpu,
                  "process_group": grouped, "process_group_sudo": grouped_sudo,
                  "process_group_cpu_ms_per_run": grouped_cpu, "beside_systemd": side,
                  "helper": helper, "helper_bare": helper_bare,
                  "loadavg": os.getloadavg(), "python": sys.version.split()[0]}))
"""


def install(c: Container, deb: Path) -> None:
    """The .deb installed in a booted container, an agent user, the bench's rules and sudoers line."""
    shutil.copy(deb, c.root / "root" / deb.name)
    r = c.run(["apt-get", "install", "-y", "--no-install-recommends", f"/root/{deb.name}"], check=False, timeout=300)
    if r.returncode != 0:
        c.run(["apt-get", "update", "-qq"], timeout=300)
        c.run(["apt-get", "install", "-y", "--no-install-recommends", f"/root/{deb.name}"], timeout=300)
    c.run(["useradd", "--create-home", "--groups", "airlock", "agent1"])
    c.write("/etc/airlock/policy.d/50-bench.yaml", POLICY)
    c.write("/etc/sudoers.d/airlock-bench", SUDOERS, mode=0o440)
    c.run(["systemctl", "reload-or-restart", "airlock-approval.service"], check=False)


def measure(deb: Path, rounds: int, warm: int) -> dict[str, Any]:
    """Boot, install, measure; the samples in milliseconds (cold, warm, bare, privileged, sudo) and the context."""
    with booted(packages=("sudo",)) as c:
        install(c, deb)
        c.write("/root/cold_inner.py", INNER)
        c.write("/root/helper.py", HELPER)
        r = c.run(["python3", "/root/cold_inner.py", str(rounds), str(warm)], check=False, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"the container bench failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    result["rounds"], result["warm_runs"] = rounds, warm
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warm", type=int, default=10, help="warm runs per round")
    parser.add_argument("--json", help="write the samples here")
    args = parser.parse_args()
    try:
        result = measure(Path(os.environ["AIRLOCK_DEB"]).resolve(), args.rounds, args.warm)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    for name in ("cold", "warm", "bare", "privileged", "sudo", "process_group", "process_group_sudo"):
        samples = sorted(result[name])
        print(
            f"{name:18} p50 {samples[len(samples) // 2]:7.1f} ms  min {samples[0]:7.1f}  max {samples[-1]:7.1f}  "
            f"(n={len(samples)})"
        )
    print(f"containment of `airlock run -- true`: {result['containment']}; CPU ms per run: {result['cpu_ms_per_run']}")
    print(f"with runner.containment process-group, CPU ms per run: {result['process_group_cpu_ms_per_run']}")
    for name, samples in [
        *result["beside_systemd"].items(),
        ("helper", result["helper"]),
        ("helper_bare", result["helper_bare"]),
    ]:
        samples = sorted(samples)
        print(f"{name:20} p50 {samples[len(samples) // 2]:7.1f} ms  (n={len(samples)}, alternating)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
