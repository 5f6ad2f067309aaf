"""Quotas per agent (issue 39 items 6, 7 and 11).

6. A pipeline of 64 stages, each printing a lot, must not make the root
   runner hold 64 streams' worth of output (one total cap, spent while
   reading), and a job that ran is settled whatever its reply's size: a retry
   with the same operation_id replays, it does not run the job again (also
   when a reply outgrows what intake reads: a stand-in runner sends one).
7. One agent flooding large requests cannot fill the audit journal: past its
   quota it gets ``rate_limited`` (nothing of the refused request is
   written), while another agent's requests still run.
11. One agent's flood of trivial requests cannot evict another agent's
   settled outcome from the replay store: the other agent's retry replays.
"""

from __future__ import annotations

import base64
import json
import pwd
import socket
import sqlite3
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_exec, as_user, needs_root, red_stack, throwaway_user

from support import Stack, now_iso

pytestmark = needs_root

MiB = 1024 * 1024

# Run as an agent with the system python: send the requests one after another
# on one connection and print every final reply (events skipped) as JSON.
_FLOOD_CLIENT = r"""
import json, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(job["timeout"])
s.connect(job["socket"])
f = s.makefile("rb")
out = []
for request in job["requests"]:
    s.sendall(json.dumps(request).encode() + b"\n")
    while True:
        line = f.readline()
        if not line.endswith(b"\n"):
            raise SystemExit("connection closed")
        message = json.loads(line)
        if "event" not in message:
            out.append(message)
            break
print(json.dumps(out))
"""


def flood(stack: Stack, user: pwd.struct_passwd, argses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One exec request per ``argses`` item, as ``user``, on one connection; the final replies."""
    requests = [
        {"v": 1, "id": f"flood-{uuid.uuid4()}", "verb": "exec", "args": {"time": now_iso()} | args} for args in argses
    ]
    job = {"socket": stack.agent, "requests": requests, "timeout": 120}
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _FLOOD_CLIENT],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=600,
        **as_user(user),
    )
    assert done.returncode == 0, done.stderr
    replies: list[dict[str, Any]] = json.loads(done.stdout)
    for request, reply in zip(requests, replies, strict=True):
        reply["request_id"] = request["id"]
    return replies


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    with throwaway_user("alqta") as a, throwaway_user("alqtb") as b:
        yield a, b


def _config(a: pwd.struct_passwd, b: pwd.struct_passwd, extra: str = "") -> str:
    return f"""
agents:
  users: [root, {a.pw_name}, {b.pw_name}]
{extra}
policy:
  default: deny
  rules:
    - name: quota-tools
      decision: allow
      users: [{a.pw_name}, {b.pw_name}]
      privileged: false
      commands: [[/usr/bin/echo, "..."], [/bin/sh, "..."], [/usr/bin/true]]
"""


def _peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


# --- item 6: one output cap per request; a job that ran is settled -----------------------


def test_a_64_stage_flood_of_output_stays_bounded_and_a_retry_does_not_run_it_again(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd],
) -> None:
    a, b = users
    # Per stream 4 MiB (64 of them: 256 MiB, far past intake's 96 MiB reply limit); 8 MiB for the whole request.
    extra = "limits:\n  max_output_bytes: 4194304\n  max_total_output_bytes: 8388608\n"
    with red_stack(_config(a, b, extra)) as stack:
        runs = Path(a.pw_dir) / f"runs-{uuid.uuid4().hex[:8]}"

        # Control: a small pipeline comes back whole, untruncated, and replays.
        small_op = f"small-{uuid.uuid4()}"
        small = {
            "pipeline": [["/bin/sh", "-c", "echo one >&2; echo out"], ["/bin/sh", "-c", "echo two >&2; cat"]],
            "privileged": False,
            "operation_id": small_op,
        }
        first = agent_exec(stack.agent, a, small)
        assert first["ok"] is True, first
        data = first["data"]
        assert base64.b64decode(data["stdout"]) == b"out\n" and "total_output_truncated" not in data
        assert [base64.b64decode(s["stderr"]) for s in data["stages"]] == [b"one\n", b"two\n"]
        assert agent_exec(stack.agent, a, small)["data"]["replay"] is True

        runner = stack.service_pid("runner")
        peak_before = _peak_kib(runner)
        # 64 stages, each writes 5 MB to stderr (past its own 4 MiB cap) and passes stdin on; the first
        # counts its runs.
        loud = "head -c 5000000 /dev/zero >&2; cat"
        stages = [["/bin/sh", "-c", f"echo ran >> {runs}; {loud}"]] + [["/bin/sh", "-c", loud]] * 63
        op = f"loud-{uuid.uuid4()}"
        request = {"pipeline": stages, "privileged": False, "operation_id": op, "timeout_ms": 120_000}
        # (flood reads its reply while it comes: agent_exec's helper waits first, and a reply of
        # megabytes would fill the pipe it prints to.)
        reply = flood(stack, a, [request])[0]
        grown_mib = (_peak_kib(runner) - peak_before) / 1024
        ran = _runs(runs)
        # The retry with the same operation_id replays the settled outcome.
        again = flood(stack, a, [request])[0]

        assert ran == 1 and _runs(runs) == 1, f"the job ran {_runs(runs)} times (reply: {reply.get('error')})"
        assert again["ok"] is True and again["data"]["replay"] is True, again.get("error")
        # The root runner held about one request's worth of output, not 64 streams' worth.
        assert grown_mib < 96, f"the runner's peak memory grew by {grown_mib:.0f} MiB"
        assert reply["ok"] is True, reply.get("error")
        data = reply["data"]
        kept = sum(len(base64.b64decode(s["stderr"])) for s in data["stages"])
        assert kept <= 8 * MiB and data["total_output_truncated"] is True
        assert any(s["stderr_truncated"] for s in data["stages"])
        assert all(s["exit_code"] == 0 for s in data["stages"])


class _LoudRunner:
    """Stands in for the runner on its socket path: answers every exec with a reply of ``size`` bytes."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.execs = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                request = json.loads(line)
                if request.get("verb") != "exec":
                    continue
                self.execs += 1
                evidence = {"operation_id": request["args"]["operation_id"], "stages": [], "stdout": "A" * self.size}
                data = {"evidence": evidence}  # wire.runner.Ran
                try:
                    conn.sendall(json.dumps({"id": request["id"], "ok": True, "data": data}).encode() + b"\n")
                except (BrokenPipeError, ConnectionResetError):
                    return  # intake stops reading past its limit and hangs up

    def close(self) -> None:
        self._sock.close()


def test_a_reply_too_large_for_intake_is_settled_not_run_again(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd],
) -> None:
    """The runner's own caps keep its reply inside what intake reads; should one still not fit, the
    work ran all the same: intake settles it (without output) and a retry replays."""
    a, b = users
    with red_stack(_config(a, b)) as stack:
        runner_sock = stack.runtime_dir / "internal" / "runner.sock"
        runner_sock.unlink()
        fake = _LoudRunner(runner_sock, 100 * MiB)  # past intake's 96 MiB
        try:
            op = f"big-{uuid.uuid4()}"
            request = {"argv": ["/usr/bin/true"], "privileged": False, "operation_id": op}
            first = flood(stack, a, [request])[0]
            again = flood(stack, a, [request])[0]
            # Control: the same stand-in with a reply that fits is read and settled as usual.
            fake.size = 1000
            small = {"argv": ["/usr/bin/true"], "privileged": False, "operation_id": f"small-{uuid.uuid4()}"}
            fits = flood(stack, a, [small, small])
        finally:
            fake.close()
        assert fake.execs == 2, f"the runner was asked {fake.execs} times (the retry ran the work again)"
        assert first["ok"] is True and first["data"]["reply_too_large"] is True, first
        assert first["data"]["output_retained"] is False and first["data"]["stdout_truncated"] is True
        assert again["ok"] is True and again["data"]["replay"] is True, again
        assert [r["data"]["replay"] for r in fits] == [False, True]
        assert len(fits[0]["data"]["stdout"]) == 1000


# --- item 7: a per-agent quota on journal bytes ------------------------------------------


def _events_of(database: Path, request_id: str) -> int:
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM events WHERE request_id = ?", (request_id,)).fetchone()[0])
    finally:
        conn.close()


def test_one_agent_flooding_the_journal_is_rate_limited_and_another_still_runs(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd],
) -> None:
    a, b = users
    # 1 MiB in a burst, 32 KiB/s after it: a request with a 48 KB argument journals it several times.
    extra = "journal:\n  agent_bytes_per_second: 32768\n  agent_burst_bytes: 1048576\n"
    with red_stack(_config(a, b, extra)) as stack:
        # Control: the victim's request runs.
        assert agent_exec(stack.agent, a, {"argv": ["echo", "before"], "privileged": False})["ok"] is True

        big = "x" * 48_000
        replies = flood(stack, b, [{"argv": ["echo", big, str(i)], "privileged": False} for i in range(60)])
        codes = [r["error"]["code"] if not r["ok"] else "ok" for r in replies]
        # Control: large requests are admitted while the agent is within its quota ...
        assert codes[0] == "ok" and codes[1] == "ok", codes
        # ... and past it they are refused, clearly, for this agent only.
        assert "rate_limited" in codes, codes
        limited = [r for r in replies if not r["ok"]]
        assert {r["error"]["code"] for r in limited} == {"rate_limited"}, limited[0]
        assert "quota" in limited[0]["error"]["message"] and limited[0]["error"]["details"]["retry_after_seconds"] > 0
        # Nothing of a refused request was written.
        assert all(_events_of(stack.database, r["request_id"]) == 0 for r in limited)
        assert _events_of(stack.database, replies[0]["request_id"]) >= 4  # control: an admitted one was

        # The victim's requests still run while the flooder is held back.
        for word in ("during", "after"):
            mine = agent_exec(stack.agent, a, {"argv": ["echo", word], "privileged": False})
            assert mine["ok"] is True and base64.b64decode(mine["data"]["stdout"]) == f"{word}\n".encode(), mine
        still = flood(stack, b, [{"argv": ["echo", big, "again"], "privileged": False}])
        assert still[0]["ok"] is False and still[0]["error"]["code"] == "rate_limited", still


# --- item 11: the replay store is per agent -----------------------------------------------


def test_another_agents_flood_does_not_make_my_retry_run_again(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd],
) -> None:
    a, b = users
    with red_stack(_config(a, b)) as stack:
        runs = Path(a.pw_dir) / f"runs-{uuid.uuid4().hex[:8]}"
        op = f"once-{uuid.uuid4()}"
        mine = {"argv": ["/bin/sh", "-c", f"echo ran >> {runs}"], "privileged": False, "operation_id": op}
        assert agent_exec(stack.agent, a, mine)["ok"] is True
        assert _runs(runs) == 1
        # Control: A's retry replays.
        assert agent_exec(stack.agent, a, mine)["data"]["replay"] is True

        # B floods the replay store with 300 trivial operations (more than the 256 a store used to hold).
        ops = [f"b-{i}-{uuid.uuid4()}" for i in range(300)]
        replies = flood(stack, b, [{"argv": ["/usr/bin/true"], "privileged": False, "operation_id": o} for o in ops])
        assert all(r["ok"] for r in replies), next(r for r in replies if not r["ok"])
        # Control: the flood was big enough to push B's own oldest outcome out of its share ...
        oldest = flood(stack, b, [{"argv": ["/usr/bin/true"], "privileged": False, "operation_id": ops[0]}])
        assert oldest[0]["ok"] is True and oldest[0]["data"]["replay"] is False

        # ... but A's settled outcome is A's: the retry replays, the job does not run again.
        again = agent_exec(stack.agent, a, mine)
        assert _runs(runs) == 1, f"A's job ran {_runs(runs)} times"
        assert again["ok"] is True and again["data"]["replay"] is True, again
