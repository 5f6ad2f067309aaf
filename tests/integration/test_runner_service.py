"""The runner as a service: identity, tickets, the journal outage (issue 5)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.peer import identify
from airlock.common.spec import ExecSpec
from airlock.common.wire import approval as wire_approval
from airlock.common.wire.verb import Stub

from support import Stack, now_iso, start_stack, stop_stack
from waits import until, wait_record

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: jobs run as other users")
USER, GROUP = "airlock-t1", "airlock-t1x"


@pytest.fixture(scope="module")
def test_user() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a test user")
    subprocess.run(["groupadd", "-f", GROUP], check=True)
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-M", "-U", "-G", GROUP, "-s", "/bin/sh", "-d", "/nonexistent", USER], check=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], capture_output=True)
        subprocess.run(["groupdel", GROUP], capture_output=True)


@pytest.fixture(scope="module")
def rstack(tmp_path_factory: pytest.TempPathFactory, test_user: pwd.struct_passwd) -> Iterator[Stack]:
    runtime = Path(tmp_path_factory.mktemp("rn"))
    config = runtime.parent / f"{runtime.name}.yaml"
    config.write_text(
        f"agents:\n  users: [root, {USER}]\npolicy:\n  default: deny\n  rules:\n    - {{name: any, decision: allow}}\n"
    )
    s = start_stack(runtime, config)
    os.chmod(runtime, 0o711)
    os.chmod(s.agent, 0o666)
    try:
        yield s
    finally:
        stop_stack(s)


def run_as(user: pwd.struct_passwd, stack: Stack, *argv: str) -> subprocess.CompletedProcess[str]:
    # Relative socket path from the runtime folder: the pytest folders above stay private.
    return subprocess.run(
        [sys.executable, "-m", "airlock", "run", "--socket", "agent.sock", *argv],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=os.getgrouplist(user.pw_name, user.pw_gid),
        cwd=stack.runtime_dir,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)},
    )


@needs_root
def test_an_unprivileged_job_runs_with_exactly_the_peers_uid_gid_and_groups(
    rstack: Stack, test_user: pwd.struct_passwd
) -> None:
    result = run_as(test_user, rstack, "--no-privilege", "--", "sh", "-c", "id -u; id -g; id -G")
    assert result.returncode == 0, result.stderr
    uid, gid, groups = result.stdout.split("\n")[:3]
    expected = sorted(os.getgrouplist(test_user.pw_name, test_user.pw_gid))
    assert int(uid) == test_user.pw_uid and int(gid) == test_user.pw_gid
    assert sorted(int(g) for g in groups.split()) == expected


@needs_root
def test_a_privileged_job_runs_as_root(rstack: Stack, test_user: pwd.struct_passwd) -> None:
    result = run_as(test_user, rstack, "--", "id", "-u")
    assert result.returncode == 0 and result.stdout.strip() == "0", result.stderr


@needs_root
def test_environment_is_the_target_users(rstack: Stack, test_user: pwd.struct_passwd) -> None:
    result = run_as(test_user, rstack, "--no-privilege", "--", "env")
    env = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert env["USER"] == USER and env["LOGNAME"] == USER and env["HOME"] == "/nonexistent"
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert not any(k.startswith(("LISTEN_", "NOTIFY_", "WATCHDOG_", "PYTHON")) for k in env)


@needs_root
def test_a_cwd_the_user_cannot_enter_is_refused_and_nothing_runs(
    rstack: Stack, test_user: pwd.struct_passwd, tmp_path: Path
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    marker = tmp_path / "marker"
    result = run_as(test_user, rstack, "--no-privilege", "--cwd", str(private), "--", "sh", "-c", f"touch {marker}")
    assert result.returncode == 125 and "enter" in result.stderr
    assert not marker.exists()


# --- forward_agent ---------------------------------------------------------------------------

# The peer: binds an ssh-agent-like socket at the SSH_AUTH_SOCK it was started
# with (argv[2] says whether to), then asks for argv[1] on the agent socket.
_PEER = """\
import os, socket, sys
if sys.argv[2] == "bind":
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.environ["SSH_AUTH_SOCK"])
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.connect("agent.sock")
    sock.sendall(sys.argv[1].encode() + b"\\n")
    sock.shutdown(socket.SHUT_WR)
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
sys.stdout.write(reply.decode())
"""


@pytest.fixture
def user_dir(test_user: pwd.struct_passwd) -> Iterator[Path]:
    """A private folder of the test user's, as ssh-agent makes one in /tmp."""
    path = Path(tempfile.mkdtemp(prefix="al-agent-", dir="/tmp"))
    os.chown(path, test_user.pw_uid, test_user.pw_gid)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def ask_as(
    user: pwd.struct_passwd, stack: Stack, args: dict[str, Any], *, agent_sock: str | None, bind: bool
) -> tuple[dict[str, Any], str]:
    """A peer process of ``user`` (with ``SSH_AUTH_SOCK=agent_sock``) asks for an exec; its reply and op ID."""
    op = f"op-{uuid.uuid4()}"
    request = {
        "v": 1,
        "id": str(uuid.uuid4()),
        "verb": "exec",
        "token": None,
        "args": {"privileged": False, "forward_agent": True, "time": now_iso(), "operation_id": op} | args,
    }
    env = {"PATH": "/usr/bin:/bin"} | ({"SSH_AUTH_SOCK": agent_sock} if agent_sock is not None else {})
    done = subprocess.run(
        [sys.executable, "-I", "-c", _PEER, json.dumps(request), "bind" if bind else "no"],
        user=user.pw_uid,
        group=user.pw_gid,
        cwd=stack.runtime_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    finals = [r for r in map(json.loads, done.stdout.splitlines()) if "event" not in r]
    assert len(finals) == 1, done.stdout
    return finals[0], op


@needs_root
def test_forward_agent_gives_the_job_the_peers_own_agent_socket(
    rstack: Stack, test_user: pwd.struct_passwd, user_dir: Path
) -> None:
    agent_sock = str(user_dir / "agent.sock")
    reply, op = ask_as(
        test_user,
        rstack,
        {"argv": ["sh", "-c", 'printf %s "$SSH_AUTH_SOCK"; test -S "$SSH_AUTH_SOCK"']},
        agent_sock=agent_sock,
        bind=True,
    )
    assert reply["ok"], reply
    assert base64.b64decode(reply["data"]["stdout"]).decode() == agent_sock
    assert reply["data"]["stages"][0]["exit_code"] == 0 and reply["data"]["uid"] == test_user.pw_uid
    rows = [r for r in rstack.journal_rows() if r["operation_id"] == op]
    started = [json.loads(r["payload"]) for r in rows if r["kind"] == "exec.started"]
    assert started and started[0]["added_env"] == ["SSH_AUTH_SOCK"]
    assert not any(agent_sock in (r["payload"] or "") for r in rows)  # names only, never the value


@needs_root
def test_forward_agent_refuses_a_socket_owned_by_another_uid(
    rstack: Stack, test_user: pwd.struct_passwd, user_dir: Path
) -> None:
    marker = user_dir / "ran"
    # The stack's own agent socket: a real socket, reachable by the user, owned by root.
    reply, op = ask_as(test_user, rstack, {"argv": ["touch", str(marker)]}, agent_sock=rstack.agent, bind=False)
    assert reply["ok"] is False and reply["error"]["code"] == "invalid_arguments", reply
    assert reply["error"]["message"] == (
        f"forward_agent: SSH_AUTH_SOCK of the requesting process is owned by uid 0, not by uid {test_user.pw_uid}"
    )
    assert not marker.exists()
    kinds = [r["kind"] for r in rstack.journal_rows() if r["operation_id"] == op]
    assert "exec.refused" in kinds and "exec.started" not in kinds


@needs_root
def test_forward_agent_without_an_agent_runs_without_one(
    rstack: Stack, test_user: pwd.struct_passwd, user_dir: Path
) -> None:
    marker = user_dir / "ran"
    reply, _ = ask_as(
        test_user, rstack, {"command": f'touch {marker}; test -z "$SSH_AUTH_SOCK"'}, agent_sock=None, bind=False
    )
    assert reply["ok"] is True, reply
    assert reply["data"]["stages"][0]["exit_code"] == 0
    assert marker.exists()


# --- tickets -------------------------------------------------------------------------------


def spec_for(marker: Path) -> ExecSpec:
    return ExecSpec(mode="exec", stages=(("/usr/bin/touch", str(marker)),), privileged=False, uid=os.geteuid())


async def _ticket(stack: Stack, spec: ExecSpec) -> str:
    approval = Client(
        stack.runtime_dir / "internal" / "approval.sock", service="approval", unavailable=ErrorCode.APPROVAL_UNAVAILABLE
    )
    peer = identify(os.getpid(), os.geteuid(), os.getegid())
    decide = wire_approval.Decide.from_dict(
        {
            "request": {"request_id": str(uuid.uuid4())},
            "spec": spec.to_dict(),
            "peer": peer.to_dict(),
            "operation_id": str(uuid.uuid4()),
        }
    )
    decided = await Stub(wire_approval.DOOR, approval).call(wire_approval.DECIDE, decide)
    _BOUND[decided.ticket] = decided.bound  # what intake passes on with the ticket
    return decided.ticket


_BOUND: dict[str, Any] = {}


async def _run(stack: Stack, spec: ExecSpec, ticket: str, op: str | None = None) -> dict[str, Any]:
    runner = Client(
        stack.runtime_dir / "internal" / "runner.sock", service="runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE
    )
    ran = await runner.call(
        "exec",
        {
            "ticket": ticket,
            "spec": spec.to_dict(),
            "operation_id": op or str(uuid.uuid4()),
            "bound": _BOUND.get(ticket, {}),
        },
    )
    return dict(ran["evidence"])  # wire.runner.Ran


@contextlib.contextmanager
def paused(stack: Stack, name: str) -> Iterator[None]:
    """One service stopped (SIGSTOP): its callers wait, as behind a slow service."""
    pid = stack.service_pid(name)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _kinds(stack: Stack, op: str, last: str | None = "exec.finished") -> list[str]:
    """The operation's exec.* records, once its ``last`` is in (the runner defers exec.finished: issue 21);
    ``last=None``: as they are now (the runner has replied, and refused before journaling anything more)."""

    def records() -> list[str]:
        return [r["kind"] for r in stack.journal_rows() if r["operation_id"] == op and r["kind"].startswith("exec.")]

    if last is not None:
        with contextlib.suppress(AssertionError):  # the caller's assertion says what is missing
            until(f"{last} of {op}", lambda: last in records(), timeout=10)
    return records()


def test_a_forged_ticket_is_refused_nothing_runs_and_the_attempt_is_journaled(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "forged"
    with pytest.raises(AirlockError) as err:
        asyncio.run(_run(stack, spec_for(marker), "forged-" + "A" * 40))
    assert err.value.code is ErrorCode.INVALID_TICKET
    assert not marker.exists()
    refused = [r for r in stack.journal_rows() if r["kind"] == "exec.refused"]
    assert refused and json.loads(refused[-1]["payload"])["code"] == "invalid_ticket"


def test_a_ticket_is_single_use_and_bound_to_the_spec(stack: Stack, tmp_path: Path) -> None:
    first, second, other = tmp_path / "first", tmp_path / "second", tmp_path / "other"

    async def scenario() -> list[ErrorCode | str]:
        outcomes: list[ErrorCode | str] = []
        ticket = await _ticket(stack, spec_for(first))
        # The same ticket for another spec: refused (and spent).
        try:
            await _run(stack, spec_for(other), ticket)
            outcomes.append("ran")
        except AirlockError as exc:
            outcomes.append(exc.code)
        ticket = await _ticket(stack, spec_for(second))
        await _run(stack, spec_for(second), ticket)
        outcomes.append("ran")
        try:
            await _run(stack, spec_for(second), ticket)  # reuse
            outcomes.append("ran again")
        except AirlockError as exc:
            outcomes.append(exc.code)
        return outcomes

    assert asyncio.run(scenario()) == [ErrorCode.INVALID_TICKET, "ran", ErrorCode.INVALID_TICKET]
    assert second.exists() and not other.exists() and not first.exists()


def test_when_the_journal_is_unreachable_nothing_is_spawned(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "unaudited"
    ticket = asyncio.run(_ticket(stack, spec_for(marker)))
    with stack.down("journal"), pytest.raises(AirlockError) as err:
        asyncio.run(_run(stack, spec_for(marker), ticket))
    assert err.value.code is ErrorCode.AUDIT_UNAVAILABLE
    assert not marker.exists()


def test_intake_fails_closed_with_audit_unavailable(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "never"
    with stack.down("journal"):
        reply = stack.exec({"argv": ["touch", str(marker)], "privileged": False})
    assert reply["error"]["code"] == "audit_unavailable"
    assert not marker.exists()
    assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True


def test_large_output_is_capped_and_the_producer_still_exits_zero(stack: Stack) -> None:
    reply = stack.exec({"command": "head -c 104857600 /dev/zero", "privileged": False})
    assert reply["ok"], reply
    data = reply["data"]
    assert data["stages"][0]["exit_code"] == 0 and data["stdout_truncated"] is True
    assert len(base64.b64decode(data["stdout"])) == 16 * 1024 * 1024


def test_a_large_outcome_replays_without_its_output_bytes(stack: Stack) -> None:
    op = f"op-{uuid.uuid4()}"
    first = stack.exec({"command": "head -c 2000000 /dev/zero", "privileged": False, "operation_id": op})["data"]
    again = stack.exec({"command": "head -c 2000000 /dev/zero", "privileged": False, "operation_id": op})["data"]
    assert len(base64.b64decode(first["stdout"])) == 2000000
    assert again["replay"] is True and again["output_retained"] is False and again["stdout"] == ""
    assert again["stdout_sha256"] == first["stdout_sha256"]


# --- what issue 5 says about limits, refusals and the journal ------------------------------


def test_a_deadline_of_zero_is_long_past_and_nothing_runs(stack: Stack, tmp_path: Path) -> None:
    marker, op = tmp_path / "late", f"op-{uuid.uuid4()}"
    spec = ExecSpec(
        mode="exec", stages=(("/usr/bin/touch", str(marker)),), privileged=False, uid=os.geteuid(), deadline_ms=0
    )
    evidence = asyncio.run(_run(stack, spec, asyncio.run(_ticket(stack, spec)), op))
    assert evidence["started"] is False and evidence["timed_out"] is True and evidence["timeout_reason"] == "deadline"
    assert evidence["stages"][0]["exit_code"] is None and not marker.exists()
    assert _kinds(stack, op) == ["exec.started", "exec.finished"]


def test_max_output_bytes_above_the_ceiling_is_refused(stack: Stack, tmp_path: Path) -> None:
    marker, op = tmp_path / "big", f"op-{uuid.uuid4()}"
    spec = ExecSpec(
        mode="exec",
        stages=(("/usr/bin/touch", str(marker)),),
        privileged=False,
        uid=os.geteuid(),
        max_output_bytes=16 * 1024 * 1024 + 1,
    )
    with pytest.raises(AirlockError) as err:
        asyncio.run(_run(stack, spec, asyncio.run(_ticket(stack, spec)), op))
    assert err.value.code is ErrorCode.INVALID_ARGUMENTS
    assert err.value.message == "max_output_bytes: must be between 1 and 16777216"
    assert not marker.exists() and _kinds(stack, op, "exec.refused") == ["exec.refused"]


def test_a_program_gone_since_approval_is_refused_after_exec_started(stack: Stack, tmp_path: Path) -> None:
    tool, op = tmp_path / "tool", f"op-{uuid.uuid4()}"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    spec = ExecSpec(mode="exec", stages=((str(tool),),), privileged=False, uid=os.geteuid())
    ticket = asyncio.run(_ticket(stack, spec))
    tool.unlink()
    with pytest.raises(AirlockError) as err:
        asyncio.run(_run(stack, spec, ticket, op))
    assert err.value.code is ErrorCode.BINARY_CHANGED and "is gone since it was approved" in err.value.message
    assert _kinds(stack, op, "exec.refused") == ["exec.started", "exec.refused"]  # why nothing followed


def test_a_program_replaced_since_approval_is_refused_and_nothing_runs(stack: Stack, tmp_path: Path) -> None:
    tool, op, marker = tmp_path / "tool", f"op-{uuid.uuid4()}", tmp_path / "ran"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    spec = ExecSpec(mode="exec", stages=((str(tool),),), privileged=False, uid=os.geteuid())
    ticket = asyncio.run(_ticket(stack, spec))
    replacement = tmp_path / "tool.new"
    replacement.write_text(f"#!/bin/sh\ntouch {marker}\n")
    replacement.chmod(0o755)
    replacement.rename(tool)  # same path, another file
    with pytest.raises(AirlockError) as err:
        asyncio.run(_run(stack, spec, ticket, op))
    assert err.value.code is ErrorCode.BINARY_CHANGED and "ino" in err.value.details["changed"]
    assert not marker.exists()
    refused = [
        json.loads(r["payload"])
        for r in stack.journal_rows()
        if r["operation_id"] == op and r["kind"] == "exec.refused"
    ]
    assert refused and refused[0]["code"] == "binary_changed"


def test_a_second_exec_of_a_running_operation_is_refused_and_journaled(stack: Stack) -> None:
    op = f"op-{uuid.uuid4()}"
    spec = ExecSpec(mode="exec", stages=(("/usr/bin/sleep", "1"),), privileged=False, uid=os.geteuid())

    async def scenario() -> tuple[dict[str, Any], BaseException | dict[str, Any]]:
        first_ticket, second_ticket = await _ticket(stack, spec), await _ticket(stack, spec)
        first = asyncio.create_task(_run(stack, spec, first_ticket, op))
        await asyncio.to_thread(wait_record, stack, "exec.started", operation_id=op)  # the first one runs
        second = await asyncio.gather(_run(stack, spec, second_ticket, op), return_exceptions=True)
        return await first, second[0]

    first, second = asyncio.run(scenario())
    assert first["stages"][0]["exit_code"] == 0
    assert isinstance(second, AirlockError) and second.code is ErrorCode.OPERATION_IN_PROGRESS
    assert sorted(_kinds(stack, op)) == ["exec.finished", "exec.refused", "exec.started"]


def test_a_cancel_during_the_ticket_check_is_not_lost(stack: Stack, tmp_path: Path) -> None:
    marker, op = tmp_path / "cancelled", f"op-{uuid.uuid4()}"
    spec = ExecSpec(mode="exec", stages=(("/usr/bin/touch", str(marker)),), privileged=False, uid=os.geteuid())
    runner = Client(
        stack.runtime_dir / "internal" / "runner.sock", service="runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE
    )

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        ticket = await _ticket(stack, spec)
        with paused(stack, "approval"):  # the runner waits in redeem
            job = asyncio.create_task(_run(stack, spec, ticket, op))
            deadline = time.monotonic() + 15
            while True:  # until the runner holds the operation (then it waits in redeem)
                try:
                    cancelled = await runner.call("cancel", {"operation_id": op})
                    break
                except AirlockError as exc:
                    assert exc.code is ErrorCode.NOT_FOUND and time.monotonic() < deadline, exc
                    await asyncio.sleep(0.05)
        return await job, cancelled

    evidence, cancelled = asyncio.run(scenario())
    assert cancelled == {"operation_id": op, "cancelling": True}
    assert evidence["cancelled"] is True and evidence["started"] is False and not marker.exists()
    assert _kinds(stack, op) == ["exec.started", "exec.cancelled", "exec.finished"]


def test_evidence_comes_back_when_the_journal_goes_away_during_the_job(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    spec = ExecSpec(
        mode="exec", stages=(("/bin/sh", "-c", f"sleep 1; touch {marker}"),), privileged=False, uid=os.geteuid()
    )
    ticket = asyncio.run(_ticket(stack, spec))
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(asyncio.run(_run(stack, spec, ticket))))
    worker.start()
    wait_record(stack, "exec.started", containing=spec.digest())  # the job sleeps (the record names the spec by digest)
    with stack.down("journal"):
        worker.join(30)
    # It ran: a retry after an error would run it again.
    assert marker.exists() and result["stages"][0]["exit_code"] == 0


def test_a_decision_the_journal_may_have_lost_never_runs(stack: Stack, tmp_path: Path) -> None:
    """Issue 21: a rule's approval.decided is deferred; the journal restarting before exec.started
    (its mark names the old journal process) makes the runner refuse, and nothing runs."""
    control, marker = tmp_path / "control", tmp_path / "after-restart"
    # Control: the same ticket flow with the journal up all along runs.
    asyncio.run(_run(stack, spec_for(control), asyncio.run(_ticket(stack, spec_for(control)))))
    assert control.exists()
    ticket = asyncio.run(_ticket(stack, spec_for(marker)))
    stack.kill_service("journal")
    op = str(uuid.uuid4())
    with pytest.raises(AirlockError) as err:
        asyncio.run(_run(stack, spec_for(marker), ticket, op))
    assert err.value.code is ErrorCode.AUDIT_UNAVAILABLE
    assert not marker.exists()
    assert "exec.started" not in _kinds(stack, op, None)


def test_a_forged_mark_in_after_is_refused_and_nothing_runs(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "forged-mark"
    spec = spec_for(marker)
    ticket = asyncio.run(_ticket(stack, spec))
    runner = Client(
        stack.runtime_dir / "internal" / "runner.sock", service="runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE
    )
    with pytest.raises(AirlockError) as err:
        asyncio.run(
            runner.call(
                "exec",
                {
                    "ticket": ticket,
                    "spec": spec.to_dict(),
                    "operation_id": str(uuid.uuid4()),
                    "bound": _BOUND.get(ticket, {}),
                    "after": ["0000000000000000:1"],
                },
            )
        )
    assert err.value.code is ErrorCode.AUDIT_UNAVAILABLE
    assert not marker.exists()
