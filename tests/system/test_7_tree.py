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
