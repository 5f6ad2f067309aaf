"""The runner as a service: identity, tickets, the journal outage (issue 5)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pwd
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.peer import identify
from airlock.common.spec import ExecSpec

from support import Stack, start_stack, stop_stack

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
        f"agents:\n  users: [root, {USER}]\n"
        "policy:\n  default: deny\n  rules:\n"
        f"    - {{name: any, decision: allow}}\n"
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
        user=user.pw_uid, group=user.pw_gid, extra_groups=os.getgrouplist(user.pw_name, user.pw_gid),
        cwd=stack.runtime_dir, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)},
    )


@needs_root
def test_an_unprivileged_job_runs_with_exactly_the_peers_uid_gid_and_groups(rstack: Stack, test_user: pwd.struct_passwd) -> None:
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
def test_a_cwd_the_user_cannot_enter_is_refused_and_nothing_runs(rstack: Stack, test_user: pwd.struct_passwd, tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    marker = tmp_path / "marker"
    result = run_as(test_user, rstack, "--no-privilege", "--cwd", str(private), "--", "sh", "-c", f"touch {marker}")
    assert result.returncode == 125 and "enter" in result.stderr
    assert not marker.exists()


# --- tickets -------------------------------------------------------------------------------


def spec_for(marker: Path) -> ExecSpec:
    return ExecSpec(mode="exec", stages=(("/usr/bin/touch", str(marker)),), privileged=False, uid=os.geteuid())


async def _ticket(stack: Stack, spec: ExecSpec) -> str:
    approval = Client(stack.runtime_dir / "internal" / "approval.sock", service="approval", unavailable=ErrorCode.APPROVAL_UNAVAILABLE)
    peer = identify(os.getpid(), os.geteuid(), os.getegid())
    decided = await approval.call("decide", {"request": {"request_id": str(uuid.uuid4()), "spec": spec.to_dict()},
                                             "peer": peer.to_dict(), "operation_id": str(uuid.uuid4())})
    return str(decided["ticket"])


async def _run(stack: Stack, spec: ExecSpec, ticket: str) -> dict[str, Any]:
    runner = Client(stack.runtime_dir / "internal" / "runner.sock", service="runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE)
    return await runner.call("exec", {"ticket": ticket, "spec": spec.to_dict(), "operation_id": str(uuid.uuid4())})


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
