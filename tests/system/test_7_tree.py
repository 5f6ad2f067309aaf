"""Exec trees and `airlock kill` under service containment (issue 35).

`kill` stops a running job's whole unit and leaves no process.  The exec
tree comes from the kernel's process-events connector, which serves only
the host's initial PID namespace: inside this systemd-nspawn container the
runner falls back to fanotify exec opens (runner/fanotify.py), filtered by
the job's unit like the connector; the connector's tree is tested on the
host (tests/integration/test_exec_tree.py).
"""

from __future__ import annotations

import json
import uuid


def test_kill_stops_a_sleep_600_job_and_leaves_no_process(system) -> None:
    operation = f"systest-kill-{uuid.uuid4().hex[:12]}"
    proc = system.c.popen(
        ["airlock", "run", "--no-privilege", "--operation-id", operation, "--", "/usr/bin/sleep", "600"],
        user=system.AGENT,
    )
    system.c.wait_for(["pgrep", "-f", "^/usr/bin/sleep 600"], timeout=20)
    r = system.airlock("kill", operation, "--reason", "systest", user=system.OPERATOR)
    assert r.returncode == 0, r
    assert "SIGTERM sent (running)" in r.stdout, r
    proc.communicate(timeout=30)
    assert system.c.run(["pgrep", "-f", "^/usr/bin/sleep 600"], check=False).returncode == 1
    units = system.c.run(["systemctl", "list-units", "--all", "--no-legend", "--plain", "airlock-job-*"]).stdout
    assert operation.replace("-", "") not in units.replace("-", ""), units
    shown = json.loads(system.airlock("show", operation, "--json", user=system.OPERATOR).stdout)["data"]
    assert shown["outcome"]["killed"]["by"] == system.OPERATOR and shown["outcome"]["killed"]["reason"] == "systest"


def test_the_tree_has_id_sh_and_uname_of_a_setsid_child(system) -> None:
    # A program reaped before the runner read its cgroup is counted (unattributed), never guessed: a
    # run with such a count (a loaded host) is retried.
    for _ in range(5):
        operation = f"systest-tree-{uuid.uuid4().hex[:12]}"
        code, _envelope, r = system.run_json(
            "/bin/sh", "-c", 'id; (setsid sh -c "uname -a" &); sleep 0.2', extra=("--operation-id", operation)
        )
        assert code == 0, r
        shown = json.loads(system.airlock("show", operation, "--json", user=system.OPERATOR).stdout)["data"]
        tree = shown["tree"]
        if tree.get("unattributed") == 0:
            break
    assert tree["source"] == "fanotify" and tree["scope"] == "cgroup" and "unavailable" not in tree, tree
    procs = tree["processes"]
    names = [p.get("exe", "").rsplit("/", 1)[-1] for p in procs]
    assert {"id", "dash", "setsid", "uname", "sleep"} <= set(names), names
    shells = [p for p in procs if p.get("exe") == "/usr/bin/dash"]
    # The job's sh and the setsid'd one (argv[0] sh; /bin/sh is dash), one program per exec: no ld.so.
    assert [p["argv"][:3] for p in shells if p.get("argv")][-1] == ["sh", "-c", "uname -a"], shells
    assert not any("ld-linux" in n for n in names), names
    uname = next(p for p in procs if p.get("exe", "").endswith("/uname"))
    assert uname["exe_id"]["ino"] > 0


# Issue 51: programs run from where fanotify marked nothing before: tmpfs /dev/shm and /run, and a memfd.
SHM = "cp /usr/bin/id /dev/shm/airlock-systest-id && /dev/shm/airlock-systest-id; rm -f /dev/shm/airlock-systest-id"
RUN = "cp /usr/bin/id /run/airlock-systest-id && /run/airlock-systest-id; rm -f /run/airlock-systest-id"
# The payload lives half a second (sleep, not id): a program gone before the listener read /proc/PID/exe is
# recorded as what the events told (its ld.so, exited_before_read), which cannot say "memfd"; id was that
# quick once the job's stages started from the fork server (CI at 7dd3560, a quiet machine).
MEMFD = (
    "import os; fd = os.memfd_create('airlock-payload', 0); os.write(fd, open('/usr/bin/sleep', 'rb').read()); "
    "os.execv('/proc/self/fd/%d' % fd, ['airlock-payload', '0.5'])"
)
UNWATCHED_POLICY = f"""\
rules:
  - name: systest-tree-unwatched
    decision: allow
    groups: [airlock]
    privileged: true
    commands:
      - [/usr/bin/dash, -c, '{SHM}']
      - [/usr/bin/dash, -c, '{RUN}']
      - [/usr/bin/python3, -c, "{MEMFD}"]
"""


def _tree(system, *argv: str) -> tuple[dict, str]:
    # A program reaped before the runner read its cgroup is counted (unattributed), never guessed: retried.
    for _ in range(5):
        operation = f"systest-tree-{uuid.uuid4().hex[:12]}"
        code, envelope, r = system.run_json(*argv, privileged=True, extra=("--operation-id", operation))
        assert code == 0 and envelope.get("ok"), r
        shown = json.loads(system.airlock("show", operation, "--json", user=system.OPERATOR).stdout)["data"]
        if shown["tree"].get("unattributed") == 0:
            break
    text = system.airlock("show", operation, user=system.OPERATOR).stdout
    return shown["tree"], text


def test_programs_run_from_tmpfs_are_in_the_tree_and_a_memfd_is_flagged(system) -> None:
    """Before, only /, /usr, /tmp and the like were marked: a program copied to /dev/shm or /run left no entry
    (only its ld.so), a memfd's neither, and the tree said complete.  Now every exec-able mount (PID 1's, which
    jobs see) is marked, a memfd exec is recorded from /proc/PID/exe and flagged, and the tree says what no
    mark covers."""
    path = "/etc/airlock/policy.d/58-systest-tree.yaml"
    system.c.write(path, UNWATCHED_POLICY)
    system.c.run(["systemctl", "try-reload-or-restart", "airlock-approval.service"])
    try:
        for script, where in ((SHM, "/dev/shm/airlock-systest-id"), (RUN, "/run/airlock-systest-id")):
            tree, text = _tree(system, "/bin/sh", "-c", script)
            assert tree["source"] == "fanotify", tree
            exes = [p.get("exe") for p in tree["processes"]]
            assert where in exes, (exes, text)  # the program itself, from its own event
            ran = next(p for p in tree["processes"] if p.get("exe") == where)
            assert not ran.get("unwatched"), ran
            # What no mark covers is said on every fanotify tree, and show prints it.
            assert tree["complete"] is False and "memfd" in tree["unwatched"], tree
            assert "not watched: memfd:" in text, text
        tree, text = _tree(system, "/usr/bin/python3", "-c", MEMFD)
        flagged = [p for p in tree["processes"] if str(p.get("exe", "")).startswith("/memfd:airlock-payload")]
        assert flagged and flagged[0]["unwatched"] is True, tree["processes"]
        assert any("/memfd:airlock-payload" in why for why in tree["incomplete"]), tree
        assert "NOT WATCHED" in text and "INCOMPLETE: " in text, text
    finally:
        system.c.run(["rm", "-f", path])
        system.c.run(["systemctl", "try-reload-or-restart", "airlock-approval.service"])


def test_the_trees_rights_are_the_listeners_and_not_the_runners(system) -> None:
    """Issue 47: the kernel sources' capabilities are airlock-exectree's (its own user), not the root runner's;
    the trees above came through it.  Control: the listener does hold fanotify's (else it could not have listened)."""
    system.run_json("/bin/true")  # both are running now (the runner wakes the listener)

    def bounding(service: str) -> tuple[str, int]:
        pid = system.c.unit_property(f"{service}.service", "MainPID")
        user = system.c.run(["stat", "-c", "%U", f"/proc/{pid}"]).stdout.strip()
        status = system.c.run(["cat", f"/proc/{pid}/status"]).stdout
        return user, int(next(x.split()[1] for x in status.splitlines() if x.startswith("CapBnd:")), 16)

    net_admin, sys_admin = 1 << 12, 1 << 21  # linux/capability.h
    runner_user, runner_caps = bounding("airlock-runner")
    listener_user, listener_caps = bounding("airlock-exectree")
    assert runner_user == "root" and runner_caps & (net_admin | sys_admin) == 0, hex(runner_caps)
    assert listener_user == "airlock-exectree", listener_user
    # (This container has no CAP_NET_ADMIN to give, as it has no connector: fanotify's CAP_SYS_ADMIN is the one.)
    assert listener_caps & sys_admin, hex(listener_caps)
