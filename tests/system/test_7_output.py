"""Issue 35 with a real systemd: a rule's credential reaches the job through LoadCredential= and never the
agent, the journal or journald; each job's output log is kept, cut at its bound, its digest in the chain.
Issue 51: credentials go only to jobs that run as another account than the agent's (privileged: true)."""

from __future__ import annotations

import json
import uuid

import pytest

CREDENTIAL = f"systest-credential-{uuid.uuid4().hex}"
SCRIPT = 'cat "$CREDENTIALS_DIRECTORY/db"; echo; echo done'
SLOW = 'cat "$CREDENTIALS_DIRECTORY/db"; echo; sleep 3; echo done'
POLICY = f"""\
rules:
  - name: systest-output-credential
    decision: allow
    groups: [airlock]
    privileged: true
    commands:
      - [/usr/bin/dash, -c, '{SCRIPT}']
      - [/usr/bin/dash, -c, '{SLOW}']
    credentials:
      db: /etc/airlock/credentials/db.pass
"""


def op() -> str:
    return f"systest-output-{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="module", autouse=True)
def credential_policy(system):
    system.c.run(["install", "-d", "-m", "0755", "-o", "root", "-g", "root", "/etc/airlock/credentials"])
    system.c.write("/etc/airlock/credentials/db.pass", CREDENTIAL + "\n", mode=0o600)
    system.c.write("/etc/airlock/policy.d/56-systest-output.yaml", POLICY)
    system.c.run(["systemctl", "try-reload-or-restart", "airlock-approval.service"])
    yield
    system.c.run(["rm", "-f", "/etc/airlock/policy.d/56-systest-output.yaml", "/etc/airlock/credentials/db.pass"])
    system.c.run(["systemctl", "try-reload-or-restart", "airlock-approval.service"])


def _records(system, operation: str, kind: str) -> list[dict]:
    r = system.airlock("events", "--tail", "200", "--json", user=system.OPERATOR)
    found = []
    for line in r.stdout.splitlines():
        envelope = json.loads(line)
        for event in (envelope.get("data") or {}).get("events") or []:
            if event.get("operation_id") == operation and event.get("kind") == kind:
                found.append(event)
    return found


def test_a_credential_reaches_the_job_redacted_for_the_agent_the_log_and_journald(system) -> None:
    operation = op()
    code, envelope, r = system.run_json("/bin/sh", "-c", SCRIPT, privileged=True, extra=("--operation-id", operation))
    assert code == 0 and envelope.get("ok"), r
    import base64

    stdout = base64.b64decode(envelope["data"]["stdout"]).decode()
    # The job read the file systemd gave it (else cat fails and nothing is redacted): the agent sees the redaction.
    stderr = base64.b64decode(envelope["data"]["stages"][0]["stderr"]).decode()
    why = system.c.run(["journalctl", "--no-pager", "-n", "30", "-u", "airlock-approval"], check=False).stdout
    assert "[redacted]" in stdout and "done" in stdout, (stdout, stderr, why)
    assert CREDENTIAL not in r.stdout and CREDENTIAL not in r.stderr

    shown = system.airlock("show", operation, "--output", user=system.OPERATOR)
    assert shown.returncode == 0, shown
    assert "[redacted]" in shown.stdout and CREDENTIAL not in shown.stdout
    assert "matches exec.finished" in shown.stdout

    story = system.airlock("show", operation, user=system.OPERATOR)
    assert "stage 1: db" in story.stdout and CREDENTIAL not in story.stdout, story

    started = _records(system, operation, "exec.started")
    assert started and [c["name"] for c in started[0]["payload"]["credentials"]] == ["db"]
    # Only its name and digest: the value is nowhere in the journal's database, nor in journald.
    db = system.c.run(["grep", "-rc", CREDENTIAL, "/var/lib/airlock"], check=False)
    assert db.returncode == 1, db
    journald = system.c.run(["journalctl", "--no-pager", "-o", "verbose", "--since", "-10min"], check=False)
    assert CREDENTIAL not in journald.stdout
    logs = system.c.run(["sh", "-c", "zcat /var/lib/airlock-runner/output/*.gz | grep -c " + CREDENTIAL], check=False)
    assert logs.stdout.strip() == "0", logs


def test_the_unit_loads_the_value_the_runner_read_from_its_own_copy(system) -> None:
    """systemd would open the rule's file again when the unit starts; a value rotated in between would reach
    the job unredacted.  So the unit loads a root-only copy of what the runner read, gone with the job."""
    import time

    operation = op()
    proc = system.c.popen(
        ["airlock", "run", "--operation-id", operation, "--", "/bin/sh", "-c", SLOW],
        user=system.AGENT,
    )
    loaded = ""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "/run/" not in loaded:
        units = system.c.run(["systemctl", "list-units", "--no-legend", "--plain", "airlock-job-*"]).stdout
        names = [line.split()[0] for line in units.splitlines() if operation in line]
        if names:
            # `systemctl show` prints LoadCredential= as [unprintable] on systemd 252: read the transient unit.
            unit = system.c.run(["cat", f"/run/systemd/transient/{names[0]}"], check=False).stdout
            loaded = "".join(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("LoadCredential="))
        time.sleep(0.2)
    assert loaded.startswith("db:/run/airlock-runner/") and "/etc/airlock/credentials" not in loaded, loaded
    copy = loaded.split(":", 1)[1].split()[0]
    mode = system.c.run(["stat", "-c", "%a %U", copy], check=False).stdout.strip()
    assert mode == "600 root", mode
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"[redacted]" in out and b"done" in out, (out, err)
    assert system.c.run(["test", "-e", copy], check=False).returncode == 1  # removed with the job


ATTACK = 'cat "$CREDENTIALS_DIRECTORY/db" >/dev/null; sleep 6; echo attack'
ATTACK_POLICY = f"""\
rules:
  - name: systest-attack-credential
    decision: allow
    groups: [airlock]
    commands:
      - [/usr/bin/dash, -c, '{ATTACK}']
    credentials:
      db: /etc/airlock/credentials/db.pass
"""
# What the agent's other processes try while a job runs: read every job's copy of a credential.
STEAL = "for i in $(seq 1 40); do cat /run/credentials/airlock-job-*/db 2>/dev/null && exit 0; sleep 0.2; done; exit 1"


def _approval_log(system) -> str:
    return system.c.run(["journalctl", "--no-pager", "-o", "cat", "-u", "airlock-approval"], check=False).stdout


def _while_running(system, argv: list[str]) -> tuple[object, str]:
    """Run ``argv`` as the agent and, meanwhile, try to read the credential as the agent: (the run, what was read)."""
    run = system.c.popen(argv, user=system.AGENT)
    stolen = system.c.run(["sh", "-c", STEAL], user=system.AGENT, check=False, timeout=30).stdout
    return run, stolen


def test_a_credential_never_reaches_a_job_that_runs_as_the_agent(system) -> None:
    """The attack (issue 51): a credential rule without privileged: true ran unprivileged jobs as the agent, so
    systemd's copy of the value was the agent's, read by any of its processes while the job ran.  Such a rule is
    now refused (the reload keeps the running policy); control: a root job still gets the value, and the agent
    reading along gets nothing."""
    path = "/etc/airlock/policy.d/57-systest-attack.yaml"
    before = _approval_log(system).count("approval.policy.rejected")
    system.c.write(path, ATTACK_POLICY)
    try:
        system.c.run(["systemctl", "start", "airlock-approval.service"])  # reload needs it running (idle exit)
        # The reload is refused, and says so (issue 44: ExecReload= checks the files after the SIGHUP).
        assert system.c.run(["systemctl", "reload", "airlock-approval.service"], check=False).returncode != 0
        import time

        deadline = time.monotonic() + 20
        while _approval_log(system).count("approval.policy.rejected") == before and time.monotonic() < deadline:
            time.sleep(0.2)
        log = _approval_log(system)
        assert "57-systest-attack.yaml:8:7: rules[0] (systest-attack-credential).credentials: apply only" in log, log
        # The agent asks for the job unprivileged, and reads along: no job ran with the value.
        argv = ["airlock", "run", "--no-privilege", "--", "/bin/sh", "-c", ATTACK]
        run, stolen = _while_running(system, argv)
        run.kill()
        run.communicate(timeout=30)
        assert CREDENTIAL not in stolen, stolen
    finally:
        system.c.run(["rm", "-f", path])
        system.c.run(["systemctl", "try-reload-or-restart", "airlock-approval.service"])
    # Control: the module's rule for root jobs; the job reads the value, the agent reading along does not.
    run, stolen = _while_running(system, ["airlock", "run", "--", "/bin/sh", "-c", SLOW])
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0 and b"[redacted]" in out and b"done" in out, (out, err)
    assert CREDENTIAL not in stolen, stolen


def test_the_output_log_is_cut_at_its_bound_and_the_chain_holds_its_digest(system) -> None:
    system.set_config("runner:\n  output_log_max_bytes: 2048\n")
    system.restart_services()
    try:
        operation = op()
        code, envelope, r = system.run_json("/bin/sh", "-c", "seq 1 3000", extra=("--operation-id", operation))
        assert code == 0 and envelope.get("ok"), r
        finished = _records(system, operation, "exec.finished")
        kept = finished[0]["payload"]["output_log"]
        assert kept["cut"] is True and kept["stored_bytes"] == 2048, kept
        shown = system.airlock("show", operation, "--output", user=system.OPERATOR)
        assert shown.returncode == 0, shown
        assert "output log cut at 2048 bytes" in shown.stdout and "matches exec.finished" in shown.stdout
        assert shown.stdout.startswith("--- stdout ---\n1\n2\n3\n")
        # The agent still got all of it: the log's bound is the runner's, not the request's.
        import base64

        assert base64.b64decode(envelope["data"]["stdout"]).decode().endswith("3000\n")
    finally:
        system.restore_config()
        system.restart_services()
