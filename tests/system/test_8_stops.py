"""Every airlock service's stop record reaches the journal, started side by side (issue 50).

intake, approval and the runner are no longer ordered after the journal (a cold
start no longer waits for the journal to be ready); the journal's ExecStop=
waits while any of them is stopping.  Here: a `systemctl stop` of all of them
at once, journal included, and a clean poweroff of the container, each
followed by the journal's records -- every service's `service.stopping`, with
the PID it had, and the journal's own after theirs.  A job is running when
the stop begins, so the runner and intake have work to finish first (an idle
service stops in a few ms, faster than the journal, and would prove nothing):
its records land too, to intake's `request.replied`.  The control: the same records of a fresh
start (`service.started`) land as they always did, and the journal restarted
alone does not wait for anyone.
"""

from __future__ import annotations

import time
import uuid

from conftest import all_events

STOPPERS = ("intake", "approval", "runner", "journal")


def _all_running(system) -> dict[str, int]:
    r = system.airlock("run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/true")
    assert r.returncode == 0, r
    pids = {name: system.main_pid(f"airlock-{name}.service") for name in STOPPERS}
    assert all(pids.values()), pids
    return pids


def _records(events: list[dict], kind: str, pids: dict[str, int]) -> dict[str, int]:
    """The seq of each service's `kind` record carrying the PID it had."""
    found: dict[str, int] = {}
    for e in events:
        payload = e.get("payload") or {}
        name = payload.get("service")
        if e.get("kind") == kind and name in pids and payload.get("pid") == pids[name]:
            found[name] = e["seq"]
    return found


def _a_job_running(system) -> tuple[str, object]:
    """An `airlock run -- sleep 3` whose job has started: (its operation ID, the client process)."""
    op = f"systest-{uuid.uuid4().hex}"
    proc = system.c.popen(
        ["airlock", "run", "--no-privilege", "--operation-id", op, "--", "/usr/bin/sleep", "3"], user=system.AGENT
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(e.get("kind") == "exec.started" and e.get("operation_id") == op for e in all_events(system)):
            return op, proc
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the job did not start")


def _every_stop_landed(system, pids: dict[str, int], op: str) -> None:
    events = all_events(system)
    assert _records(events, "service.started", pids).keys() == set(STOPPERS)  # the control: they ran
    stops = _records(events, "service.stopping", pids)
    assert stops.keys() == set(STOPPERS), (pids, stops)
    assert all(stops["journal"] > stops[name] for name in ("intake", "approval", "runner")), stops
    # The request in flight ended in the journal (the runner's record of its job, intake's reply) before the
    # journal stopped.  (At a poweroff the job's unit is stopped by the shutdown too: exec.refused, not finished.)
    story = [(e["seq"], e["kind"]) for e in events if e.get("operation_id") == op]
    kinds = [kind for _seq, kind in story]
    assert {"exec.finished", "exec.refused"} & set(kinds) and kinds[-1] == "request.replied", story
    assert story[-1][0] < stops["journal"], (story, stops)


def test_a_stop_of_every_service_at_once_journals_each_stop(system) -> None:
    pids = _all_running(system)
    op, proc = _a_job_running(system)
    system.c.run(["systemctl", "stop", *system.SERVICES])
    # Nothing woke the journal again for a late record: it stopped once, last.
    assert {system.active(f"airlock-{name}.service") for name in STOPPERS} == {"inactive"}
    proc.communicate(timeout=60)
    _every_stop_landed(system, pids, op)
    system.audit_verify()


def test_the_journal_restarted_alone_waits_for_nobody(system) -> None:
    _all_running(system)
    unit = ["journalctl", "--no-pager", "-o", "cat", "-u", "airlock-journal.service"]
    cursor = system.c.run([*unit, "-n", "0", "--show-cursor"]).stdout.strip().rsplit("cursor: ", 1)[-1]
    system.c.run(["systemctl", "restart", "airlock-journal.service"])
    log = system.c.run([*unit, f"--after-cursor={cursor}"]).stdout
    assert "journal.service.stopping" in log, log[-2000:]  # it did stop (and start again) ...
    assert "stop waited" not in log, log[-2000:]  # ... without waiting: nobody else was stopping
    assert system.active("airlock-intake.service") == "active"
    assert system.active("airlock-approval.service") == "active"
    assert system.active("airlock-journal.service") == "active"


def test_a_poweroff_journals_each_stop(system) -> None:
    pids = _all_running(system)
    op, proc = _a_job_running(system)
    system.c.shutdown()  # a clean poweroff: one transaction stops every unit, the journal's socket too
    proc.kill()
    proc.communicate(timeout=60)
    system.c.leader = 0
    system.c.boot()
    _every_stop_landed(system, pids, op)
    system.audit_verify()
