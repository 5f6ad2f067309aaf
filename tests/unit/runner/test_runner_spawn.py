"""The execution engine, with real processes (no mocks of the OS)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.runner import spawn
from airlock.runner.binaries import _open_all
from airlock.runner.identity import HeldDir, check_cwd, open_cwd
from airlock.runner.scope import ProcessGroups
from airlock.runner.spawn import run_job

from runner_testlib import ScratchUser, make_spec, me, pid_alive, run

MiB = 1 << 20


def sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


def test_single_stage() -> None:
    result = run(make_spec(("echo", "hello")))
    assert result.stdout == b"hello\n"
    assert [(s.exit_code, s.signal) for s in result.stages] == [(0, None)]
    assert result.started and not result.timed_out and not result.cancelled
    assert result.timeout_reason is None and result.containment == "process-group" and result.scope_unit is None
    assert result.stdout_sha256 == hashlib.sha256(b"hello\n").hexdigest()


def test_two_stages() -> None:
    result = run(make_spec(("printf", "a\\nb\\nb\\n"), ("grep", "-c", "b")))
    assert result.stdout == b"2\n"
    assert [s.exit_code for s in result.stages] == [0, 0]


def test_three_stages_exit_codes_and_stderr_per_stage() -> None:
    result = run(
        make_spec(
            sh("echo data; echo err1 >&2; exit 1"),
            sh("cat; echo err2 >&2; exit 2"),
            sh("tr a-z A-Z; echo err3 >&2"),
        )
    )
    assert result.stdout == b"DATA\n"
    assert [s.exit_code for s in result.stages] == [1, 2, 0]
    assert [s.stderr for s in result.stages] == [b"err1\n", b"err2\n", b"err3\n"]
    assert [s.stderr_sha256 for s in result.stages] == [hashlib.sha256(s.stderr).hexdigest() for s in result.stages]


def test_stages_are_joined_by_os_pipes() -> None:
    # Each stage's stdout is a pipe whose other end is the next stage's stdin.
    # (Read in a command substitution: a redirection would swap the shell's fds first.)
    result = run(
        make_spec(sh('p=$(readlink /proc/$$/fd/1); echo "$p" >&2'), sh('p=$(readlink /proc/$$/fd/0); echo "$p" >&2'))
    )
    assert result.stages[0].stderr == result.stages[1].stderr
    assert result.stages[0].stderr.startswith(b"pipe:")


def test_argv0_is_the_canonical_binary_policy_matched() -> None:
    # A multi-call binary must not see the name the request used (systemctl as
    # `reboot`): it runs as the canonical path that policy judged.
    result = run(make_spec(("cat", "/proc/self/cmdline")))
    assert result.stdout == b"/usr/bin/cat\0/proc/self/cmdline\0"
    assert result.stages[0].argv == ("cat", "/proc/self/cmdline")  # the evidence keeps what was asked
    assert result.stages[0].resolved == "/usr/bin/cat"  # and says what ran


def test_resolved_is_the_canonical_binary_of_every_stage(world_dir: str) -> None:
    link = os.path.join(world_dir, "kitty")
    os.symlink("/usr/bin/cat", link)
    result = run(make_spec(("true",), (link,), ("/bin/sh", "-c", "cat")))
    assert [s.resolved for s in result.stages] == ["/usr/bin/true", "/usr/bin/cat", os.path.realpath("/bin/sh")]
    assert result.stages[1].argv == (link,)
    assert [s["resolved"] for s in result.to_evidence()["stages"]] == [s.resolved for s in result.stages]


def test_signal_death() -> None:
    result = run(make_spec(sh("kill -KILL $$")))
    assert (result.stages[0].exit_code, result.stages[0].signal) == (None, signal.SIGKILL)


def test_sigpipe_has_its_default_action() -> None:
    result = run(make_spec(("yes",), ("head", "-c", "4")))
    assert result.stdout == b"y\ny\n"
    assert result.stages[0].signal == signal.SIGPIPE


def test_stdin_bytes() -> None:
    assert run(make_spec(("cat",), stdin=b"from the request")).stdout == b"from the request"


def test_large_stdin_is_streamed() -> None:
    data = os.urandom(MiB) * 3
    result = run(make_spec(("sha256sum",), stdin=data))
    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_stdin_not_read_does_not_block() -> None:
    result = run(make_spec(("true",), stdin=b"x" * (4 * MiB)))
    assert result.stages[0].exit_code == 0


def test_stdin_defaults_to_dev_null() -> None:
    result = run(make_spec(sh("readlink /proc/self/fd/0; cat")))
    assert result.stdout == b"/dev/null\n"


def test_only_the_standard_fds_reach_the_job() -> None:
    result = run(make_spec(sh('for fd in /proc/self/fd/*; do echo "${fd##*/} $(readlink $fd)"; done')))
    fds = dict(line.split(" ", 1) for line in result.stdout.decode().splitlines())
    # 0, 1, 2, the binary the runner opened, checked and executed (kept open so
    # that a #! script's interpreter can read it), and the glob's own directory.
    held = [fd for fd, target in fds.items() if target == "/usr/bin/dash"]
    assert {"0", "1", "2"} <= set(fds) and len(held) == 1 and len(fds) <= 5, fds


def test_inheritable_fds_of_the_daemon_do_not_reach_the_job() -> None:
    # Like LISTEN_FDS sockets, which systemd passes without close-on-exec.
    r, w = os.pipe()
    os.set_inheritable(r, True)
    try:
        result = run(make_spec(("ls", "/proc/self/fd")))
    finally:
        os.close(r)
        os.close(w)
    assert str(r).encode() not in result.stdout.split()


def env_of(result: spawn.JobResult) -> dict[str, str]:
    return dict(item.split("=", 1) for item in os.fsdecode(result.stdout).split("\0") if item)


def test_env_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("LISTEN_FDS", "3")
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    monkeypatch.setenv("AIRLOCK_DAEMON_ONLY", "1")
    spec = make_spec(("env", "-0"), request_env={"LANG": "C.UTF-8"})
    seen = env_of(run(spec))
    assert seen == dict(spec.env)
    assert set(seen) == {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG"}


def test_cwd_is_used(world_dir: str) -> None:
    assert run(make_spec(("pwd",), cwd=world_dir)).stdout == f"{world_dir}\n".encode()


def test_unenterable_cwd_runs_nothing(world_dir: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: runs a job as another user")
    from test_runner_identity import NOBODY

    locked = os.path.join(world_dir, "locked")
    os.mkdir(locked, 0o700)
    marker = os.path.join(world_dir, "ran")
    with pytest.raises(AirlockError) as caught:
        run(make_spec(("touch", marker), identity=NOBODY, cwd=locked))
    assert caught.value.code is ErrorCode.SPAWN_FAILED
    assert "locked" in caught.value.message
    assert not os.path.exists(marker)


def test_not_found_binary_runs_nothing(world_dir: str) -> None:
    marker = os.path.join(world_dir, "ran")
    with pytest.raises(AirlockError) as caught:
        run(make_spec(("touch", marker), ("no-such-binary-airlock",)))
    assert caught.value.code is ErrorCode.SPAWN_FAILED
    assert "no-such-binary-airlock" in caught.value.message and "not found" in caught.value.message
    assert caught.value.details == {"stage": 1, "argv0": "no-such-binary-airlock"}
    time.sleep(0.1)
    assert not os.path.exists(marker)


def test_a_stage_the_user_may_not_execute_runs_nothing(world_dir: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: runs a job as another user")
    from test_runner_identity import NOBODY

    tool = os.path.join(world_dir, "root-only-tool")
    with open(tool, "w") as f:
        f.write("#!/bin/sh\necho tool\n")
    os.chmod(tool, 0o744)
    marker = os.path.join(world_dir, "ran")
    with pytest.raises(AirlockError) as caught:
        run(make_spec(("touch", marker), (tool,), identity=NOBODY, cwd="/"))
    assert caught.value.code is ErrorCode.SPAWN_FAILED
    assert caught.value.message.startswith("stage 2: ") and "no permission to execute" in caught.value.message
    time.sleep(0.1)
    assert not os.path.exists(marker)
    os.chmod(tool, 0o755)
    assert run(make_spec((tool,), identity=NOBODY, cwd="/")).stdout == b"tool\n"


def test_relative_argv0_is_refused() -> None:
    with pytest.raises(AirlockError) as caught:
        run(make_spec(("./script",)))
    assert caught.value.code is ErrorCode.SPAWN_FAILED


def test_argv0_never_resolves_on_the_request_path(world_dir: str, test_user: ScratchUser) -> None:
    # Policy matched the binary found on the target user's own PATH; a PATH in
    # the request's environment must not pick another one (issue 14).
    tool = os.path.join(world_dir, "airlock-test-tool")
    with open(tool, "w") as f:
        f.write("#!/bin/sh\necho tool\n")
    os.chmod(tool, 0o755)
    with pytest.raises(AirlockError) as caught:
        run(
            make_spec(
                ("airlock-test-tool",), identity=test_user.identity, cwd=world_dir, request_env={"PATH": world_dir}
            )
        )
    assert caught.value.code is ErrorCode.SPAWN_FAILED and "command not found" in caught.value.message
    # By its path it runs, also as root: a #! script through the fd the runner holds.
    assert run(make_spec((tool,), identity=test_user.identity, cwd=world_dir)).stdout == b"tool\n"
    assert run(make_spec((tool,))).stdout == b"tool\n"


def test_output_cap_with_a_100_mib_producer() -> None:
    started = time.monotonic()
    result = run(make_spec(("head", "-c", str(100 * MiB), "/dev/zero"), max_output_bytes=16 * MiB))
    assert result.stages[0].exit_code == 0
    assert result.stdout_truncated
    assert len(result.stdout) == 16 * MiB
    assert result.stdout_sha256 == hashlib.sha256(bytes(16 * MiB)).hexdigest()
    assert time.monotonic() - started < 10


def test_stderr_cap_is_per_stream() -> None:
    result = run(make_spec(sh("head -c 5000 /dev/zero >&2; echo out"), max_output_bytes=1000))
    assert result.stdout == b"out\n" and not result.stdout_truncated
    assert len(result.stages[0].stderr) == 1000 and result.stages[0].stderr_truncated


def test_one_total_cap_across_every_stage_and_stream() -> None:
    """Issue 39: 8 stages printing 3000 bytes each to stderr keep 10000 bytes in all, not 8 x 4000."""
    loud = sh("head -c 3000 /dev/zero >&2; cat")
    streamed: list[bytes] = []
    result = run(
        make_spec(*([loud] * 8), max_output_bytes=4000, max_total_output_bytes=10_000),
        on_output=lambda stream, stage, data: streamed.append(data),
    )
    kept = [len(stage.stderr) for stage in result.stages]
    assert sum(kept) == 10_000 and result.total_output_truncated
    assert all(stage.exit_code == 0 for stage in result.stages)
    assert [stage.stderr_truncated for stage in result.stages] == [n < 3000 for n in kept]
    assert sum(map(len, streamed)) == 10_000  # the streamed copy is the evidence
    assert "total_output_truncated" in result.to_evidence()
    # Control: under the total cap nothing is cut and nothing says so.
    whole = run(make_spec(*([loud] * 3), max_output_bytes=4000, max_total_output_bytes=10_000))
    assert [len(s.stderr) for s in whole.stages] == [3000] * 3 and not whole.total_output_truncated
    assert "total_output_truncated" not in whole.to_evidence()


def test_truncation_never_splits_a_utf8_character() -> None:
    chunks: list[bytes] = []
    result = run(
        make_spec(("printf", "aaaa€bbbb"), max_output_bytes=6),
        on_output=lambda stream, stage, data: chunks.append(data),
    )
    assert result.stdout == b"aaaa" and result.stdout_truncated
    assert b"".join(chunks) == b"aaaa"


def test_redaction_across_a_chunk_boundary() -> None:
    secret = "hunter2-swordfish"
    chunks: list[tuple[str, int, bytes]] = []
    spec = make_spec(
        sh('printf "key=%s" "${SECRET%%-*}"; sleep 0.3; printf "%s;\\n" "-${SECRET#*-}"; echo "$SECRET" >&2'),
        protected_env={"SECRET": secret},
    )
    result = run(spec, on_output=lambda *a: chunks.append(a))
    assert result.stdout == b"key=[redacted];\n"
    assert result.stages[0].stderr == b"[redacted]\n"
    assert result.stdout_sha256 == hashlib.sha256(b"key=[redacted];\n").hexdigest()
    assert secret.encode() not in b"".join(c for _, _, c in chunks)
    assert b"".join(c for s, _, c in chunks if s == "stdout") == result.stdout


def test_protected_values_reach_the_process() -> None:
    spec = make_spec(sh('[ "$TOKEN" = s3cr3t ] && echo match'), protected_env={"TOKEN": "s3cr3t"})
    assert run(spec).stdout == b"match\n"


def test_streaming_matches_the_evidence() -> None:
    seen: list[tuple[str, int, bytes]] = []
    result = run(
        make_spec(sh("for i in 1 2 3; do echo o$i; echo e$i >&2; done"), ("cat",)), on_output=lambda *a: seen.append(a)
    )
    assert b"".join(d for s, i, d in seen if s == "stdout" and i == 1) == result.stdout == b"o1\no2\no3\n"
    assert b"".join(d for s, i, d in seen if s == "stderr" and i == 0) == result.stages[0].stderr


def test_a_failing_listener_does_not_stop_capture() -> None:
    def listener(stream: str, stage: int, data: bytes) -> None:
        raise RuntimeError("client went away")

    result = run(make_spec(("head", "-c", str(2 * MiB), "/dev/zero")), on_output=listener)
    assert result.stages[0].exit_code == 0 and len(result.stdout) == MiB and result.stdout_truncated


def _read_pid(path: str) -> int:
    for _ in range(100):
        try:
            with open(path) as f:
                return int(f.read())
        except (OSError, ValueError):
            time.sleep(0.02)
    raise AssertionError(f"no pid in {path}")


def test_timeout_kills_the_process_group(world_dir: str) -> None:
    pidfile = os.path.join(world_dir, "child")
    started = time.monotonic()
    result = run(make_spec(sh(f"sleep 60 & echo $! > {pidfile}; wait"), timeout_seconds=0.5))
    assert time.monotonic() - started < 3
    assert result.timed_out and result.timeout_reason == "timeout" and not result.cancelled
    assert result.stages[0].signal == signal.SIGTERM
    assert not pid_alive(_read_pid(pidfile))


def test_sigkill_after_the_grace_period() -> None:
    started = time.monotonic()
    result = run(make_spec(sh("trap '' TERM; sleep 60"), timeout_seconds=0.3, kill_grace_seconds=0.3))
    assert result.timed_out
    assert result.stages[0].signal == signal.SIGKILL
    assert 0.5 < time.monotonic() - started < 3


def test_timeout_kills_every_stage() -> None:
    result = run(make_spec(("sleep", "60"), ("sleep", "60"), ("sleep", "60"), timeout_seconds=0.3))
    assert result.timed_out
    assert [s.signal for s in result.stages] == [signal.SIGTERM] * 3


def test_deadline_earlier_than_timeout() -> None:
    result = run(make_spec(("sleep", "60"), deadline=time.time() + 0.3))
    assert result.timed_out and result.timeout_reason == "deadline"


def test_deadline_in_the_past_runs_nothing(world_dir: str) -> None:
    marker = os.path.join(world_dir, "ran")
    result = run(make_spec(("touch", marker), deadline=time.time() - 1))
    assert not result.started and result.timed_out and result.timeout_reason == "deadline"
    assert [(s.exit_code, s.signal) for s in result.stages] == [(None, None)]
    assert not os.path.exists(marker)


def test_cancel() -> None:
    async def scenario() -> spawn.JobResult:
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, cancel.set)
        return await run_job(make_spec(("sleep", "60")), cancel=cancel)

    started = time.monotonic()
    result = asyncio.run(scenario())
    assert time.monotonic() - started < 3
    assert result.cancelled and not result.timed_out and result.timeout_reason is None
    assert result.stages[0].signal == signal.SIGTERM


def test_cancel_before_start_runs_nothing(world_dir: str) -> None:
    marker = os.path.join(world_dir, "ran")

    async def scenario() -> spawn.JobResult:
        cancel = asyncio.Event()
        cancel.set()
        return await run_job(make_spec(("touch", marker)), cancel=cancel)

    result = asyncio.run(scenario())
    assert result.cancelled and not result.started and not os.path.exists(marker)


def test_cancelling_the_task_kills_the_job(world_dir: str) -> None:
    pidfile = os.path.join(world_dir, "pid")

    async def scenario() -> None:
        task = asyncio.ensure_future(run_job(make_spec(sh(f"echo $$ > {pidfile}; exec sleep 60"))))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert not pid_alive(_read_pid(pidfile))


def test_leftovers_in_the_group_are_stopped_when_the_job_ends(world_dir: str) -> None:
    pidfile = os.path.join(world_dir, "bg")
    started = time.monotonic()
    result = run(make_spec(sh(f"sleep 60 & echo $! > {pidfile}; echo done")))
    assert result.stdout == b"done\n" and not result.timed_out
    assert time.monotonic() - started < 3
    assert not pid_alive(_read_pid(pidfile))


def test_daemonised_grandchild_escapes_process_group_mode(world_dir: str) -> None:
    """The documented limit: setsid() leaves the job's groups; only a scope catches it.

    The job still ends (timeout, grace, then a bounded wait for output).
    """
    pidfile = os.path.join(world_dir, "escaped")
    started = time.monotonic()
    result = run(make_spec(sh(f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' & sleep 60"), timeout_seconds=0.5))
    escaped = _read_pid(pidfile)
    try:
        assert result.timed_out
        assert time.monotonic() - started < 0.5 + 0.5 + spawn._DRAIN_SECONDS + 1.5
        assert pid_alive(escaped)
    finally:
        os.kill(escaped, signal.SIGKILL)


def test_evidence_is_json_ready() -> None:
    result = run(make_spec(sh("printf out; printf err >&2; exit 4")))
    evidence = json.loads(json.dumps(result.to_evidence()))
    assert base64.b64decode(evidence["stdout"]) == b"out"
    assert evidence["stages"] == [
        {
            "argv": ["sh", "-c", "printf out; printf err >&2; exit 4"],
            "resolved": os.path.realpath("/bin/sh"),
            "exit_code": 4,
            "signal": None,
            "stderr": base64.b64encode(b"err").decode(),
            "stderr_truncated": False,
            "stderr_sha256": hashlib.sha256(b"err").hexdigest(),
            # Only a service unit reports them (process-group mode here).
            "unit": None,
            "cpu_usec": None,
            "memory_peak_bytes": None,
        }
    ]
    for key in ("mode", "containment", "timed_out", "timeout_reason", "cancelled", "started_at", "ended_at"):
        assert key in evidence
    assert evidence["started_at"].endswith("Z") and evidence["uid"] == os.geteuid()
    assert isinstance(evidence["duration_ms"], int)


def test_shell_mode() -> None:
    result = run(make_spec(("/bin/sh", "-c", "echo $((6 * 7)) | cat"), mode="shell"))
    assert result.stdout == b"42\n" and result.mode == "shell"


@pytest.mark.parametrize(
    "overrides",
    [
        {"stages": ()},
        {"stages": ((),)},
        {"mode": "shell", "stages": (("sh", "-c", "a"), ("cat",))},
        {"timeout_seconds": 0},
        {"max_output_bytes": -1},
        {"containment": "none"},
        {"env": {"A=B": "x"}},
        {"env": {"A": "x\0"}},
        {"deadline": float("nan")},
        {"stages": (("echo", "\ud800"),)},
        {"env": {"A": "\udfff\ud800"}},
    ],
)
def test_spec_validation(overrides: dict[str, object]) -> None:
    with pytest.raises(AirlockError) as caught:
        make_spec(("true",), **overrides)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS


# --- identity (root only) --------------------------------------------------------


def test_runs_as_root_when_privileged() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: privileged job")
    result = run(make_spec(sh("id -u; id -g; echo $HOME $USER $LOGNAME")))
    assert result.stdout == b"0\n0\n/root root root\n"


def test_runs_as_the_peer_with_its_groups(test_user: ScratchUser, world_dir: str) -> None:
    identity = test_user.identity
    result = run(make_spec(sh("id -u; id -g; id -G; echo $USER"), identity=identity, cwd=world_dir))
    uid, gid, groups, user = result.stdout.decode().splitlines()
    assert (int(uid), int(gid), user) == (identity.uid, identity.gid, identity.user)
    assert sorted(int(g) for g in groups.split()) == sorted(identity.groups)
    assert test_user.supplementary_gid in identity.groups


def test_every_stage_runs_as_the_peer(test_user: ScratchUser, world_dir: str) -> None:
    result = run(make_spec(("id", "-u"), sh("cat; id -u"), identity=test_user.identity, cwd=world_dir))
    assert result.stdout == f"{test_user.identity.uid}\n".encode() * 2


def test_job_files_get_a_sane_umask(test_user: ScratchUser, world_dir: str) -> None:
    os.chmod(world_dir, 0o777)
    result = run(make_spec(sh("umask"), identity=test_user.identity, cwd=world_dir))
    assert result.stdout == b"0022\n"


def test_non_root_cannot_run_as_another_user(test_user: ScratchUser, world_dir: str) -> None:
    """A runner that is not root refuses other uids with a clear error (run in a child as the test user)."""
    import subprocess
    import sys

    services = str(Path(spawn.__file__).resolve().parents[2])
    try:
        check_cwd(test_user.identity, services)
    except AirlockError as exc:
        pytest.skip(f"the checkout is not readable by a scratch user: {exc.message}")
    code = (
        "import asyncio, sys\n"
        "from airlock.common.errors import AirlockError\n"
        "from airlock.runner.identity import resolve_identity, build_env\n"
        "from airlock.runner.spawn import JobSpec, run_job\n"
        "root = resolve_identity(0)\n"
        "spec = JobSpec('op', 'exec', (('true',),), root, build_env(root, {}, {}), '/', None, 5, None, 10, 0.1, (), "
        "'process-group')\n"
        "try:\n"
        "    asyncio.run(run_job(spec))\n"
        "except AirlockError as exc:\n"
        "    print(exc.code.value, exc.message)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": services}
    proc = subprocess.run(
        [os.path.realpath(sys.executable), "-c", code],
        user=test_user.identity.uid,
        group=test_user.identity.gid,
        extra_groups=[],
        env=env,
        cwd=world_dir,
        capture_output=True,
        timeout=20,
    )
    assert proc.stdout.startswith(b"privilege_unavailable the runner is not root"), proc.stderr


# --- the gated start used by scope mode (systemd itself is tested in the system tests) ---


class _GatedGroups(ProcessGroups):
    """Scope mode without systemd: stages wait at the gate while we look at them."""

    gated = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bytes] = []

    async def attach(self, pids: Sequence[int]) -> None:
        await super().attach(pids)
        await asyncio.sleep(0.2)  # a blocked stage has not exec'd its binary yet
        for pid in pids:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                self.seen.append(f.read())


def _held(spec: spawn.JobSpec) -> HeldDir:
    """The working directory as run_job holds it (what _execute's stages enter)."""
    return open_cwd(spec.identity, spec.cwd)


def run_gated(spec: spawn.JobSpec) -> tuple[spawn.JobResult, _GatedGroups]:
    containment = _GatedGroups()
    executables = _open_all(spec)
    return asyncio.run(spawn._execute(spec, containment, executables, None, None, cwd=_held(spec))), containment


def test_gated_stages_wait_before_exec() -> None:
    result, containment = run_gated(make_spec(("cat", "/proc/self/cmdline"), ("cat",)))
    assert result.stdout == b"/usr/bin/cat\0/proc/self/cmdline\0"  # the canonical argv[0], after the gate
    assert all(b"-I\0-S\0-c\0" in cmdline for cmdline in containment.seen)
    assert all(b"cat" not in cmdline.split(b"\0")[0] for cmdline in containment.seen)


def test_gated_stages_get_exactly_the_job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The shim is Python, whose locale coercion would add or rewrite LC_CTYPE.
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    raw = os.fsdecode(b"\xff")  # a non-UTF-8 byte, as Python carries it
    spec = make_spec(("env", "-0"), request_env={"LC_CTYPE": "C", "EMPTY": "", "EQ": "a=b", "RAW": raw})
    result, _ = run_gated(spec)
    assert env_of(result) == dict(spec.env)
    spec = make_spec(("env", "-0"))
    assert env_of(run_gated(spec)[0]) == dict(spec.env)


def test_gated_stdin_and_pipeline() -> None:
    result, _ = run_gated(make_spec(("cat",), ("wc", "-c"), stdin=b"x" * 100_000))
    assert result.stdout.strip() == b"100000"


def test_gated_stages_keep_default_signals_and_clean_fds() -> None:
    result, _ = run_gated(make_spec(("yes",), ("head", "-c", "2")))
    assert result.stages[0].signal == signal.SIGPIPE
    result, _ = run_gated(make_spec(("ls", "-l", "/proc/self/fd")))
    # The gate fd is closed before exec: 0, 1, 2, the held binary, ls's own directory.
    assert result.stdout.count(b" -> ") == 5 and result.stdout.count(b"-> /usr/bin/ls") == 1


def test_gated_stages_run_as_the_peer(test_user: ScratchUser, world_dir: str) -> None:
    result, _ = run_gated(make_spec(("id", "-u"), identity=test_user.identity, cwd=world_dir))
    assert result.stdout == f"{test_user.identity.uid}\n".encode()


def test_gated_timeout() -> None:
    result, _ = run_gated(make_spec(("sleep", "60"), timeout_seconds=0.3))
    assert result.timed_out and result.stages[0].signal == signal.SIGTERM


def test_failed_attach_runs_nothing(world_dir: str) -> None:
    marker = os.path.join(world_dir, "ran")

    class Failing(_GatedGroups):
        async def attach(self, pids: Sequence[int]) -> None:
            await super().attach(pids)
            raise AirlockError(ErrorCode.SPAWN_FAILED, "cannot create scope")

    spec = make_spec(("touch", marker))
    with pytest.raises(AirlockError, match="cannot create scope"):
        asyncio.run(spawn._execute(spec, Failing(), _open_all(spec), None, None, cwd=_held(spec)))
    time.sleep(0.1)
    assert not os.path.exists(marker)


def test_identity_of_the_test_process_is_usable() -> None:
    assert me().uid == os.geteuid()


def test_gates_stay_shut_when_the_deadline_passes_during_attach(world_dir: str) -> None:
    marker = os.path.join(world_dir, "ran")

    class Slow(_GatedGroups):
        async def attach(self, pids: Sequence[int]) -> None:
            await super().attach(pids)
            await asyncio.sleep(0.5)

    spec = make_spec(("touch", marker), deadline=time.time() + 0.3)
    result = asyncio.run(spawn._execute(spec, Slow(), _open_all(spec), None, None, cwd=_held(spec)))
    assert not result.started and result.timed_out and result.timeout_reason == "deadline"
    assert result.stages[0].exit_code is None
    time.sleep(0.1)
    assert not os.path.exists(marker)


def test_concurrent_jobs_do_not_mix() -> None:
    """Many jobs in one loop, some timing out, some gated: fd numbers get reused constantly."""

    async def scenario() -> list[tuple[int, spawn.JobResult]]:
        async def one(i: int) -> tuple[int, spawn.JobResult]:
            if i % 5 == 0:
                spec = make_spec(sh(f"echo start{i}; sleep 60"), timeout_seconds=0.3, kill_grace_seconds=0.1)
            else:
                spec = make_spec(sh(f"printf 'out{i}'; printf 'err{i}' >&2"), ("cat",), stdin=b"in%d" % i)
            if i % 5 != 0 and i % 7 == 1:  # (a timed-out job's gate may rightly stay shut)
                return i, await spawn._execute(spec, _GatedGroups(), _open_all(spec), None, None, cwd=_held(spec))
            return i, await run_job(spec)

        return await asyncio.gather(*(one(i) for i in range(30)))

    for i, result in asyncio.run(scenario()):
        if i % 5 == 0:
            assert result.timed_out and result.stdout == f"start{i}\n".encode()
        else:
            assert result.stdout == f"out{i}".encode()
            assert result.stages[0].stderr == f"err{i}".encode()
            assert not result.timed_out


def test_a_reply_that_would_not_fit_goes_without_its_output() -> None:
    from airlock.runner.endrecord import fit_reply

    evidence = run(make_spec(sh("echo out; echo err >&2"))).to_evidence()
    assert fit_reply(evidence) is evidence  # control: it fits, untouched
    thin = fit_reply(evidence, room=64)
    assert thin["stdout"] == "" and thin["stdout_truncated"] and thin["output_retained"] is False
    assert thin["stages"][0]["stderr"] == "" and thin["stages"][0]["stderr_truncated"]
    assert thin["stdout_sha256"] == evidence["stdout_sha256"] and thin["stages"][0]["exit_code"] == 0
