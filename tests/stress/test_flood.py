"""One agent floods (output and journal bytes) beside a victim agent whose requests still run (issue 39).

The flooder is a throwaway user: pipelines whose every stage prints past the
request's total output cap, and requests whose large argument the journal
would keep several times.  The victim (the test's own uid) runs the usual
mix at the same time.  Every victim request gets the answer a healthy stack
gives; the flooder gets its capped output or ``rate_limited``, nothing else;
the root runner's memory stays bounded; 0 lost, 0 unaudited, for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stress_support import (
    ROOT,
    Planned,
    RequestMaker,
    Result,
    Tally,
    audit,
    expected,
    journal_index,
    kind_of,
    run_load,
    running_stack,
    stress_clients,
    stress_n,
    verify_chain,
    write_config,
)

MiB = 1024 * 1024
TOTAL_OUTPUT = 8 * MiB  # limits.max_total_output_bytes of the flood stack
BIG_ARGUMENT = 48_000  # journaled at least once per request (request.received)
FLOOD_CONNECTIONS = 4

# Run as the flooder with the system python: its requests one after another on one connection;
# prints each final reply as {id, ok, code, truncated}.
_FLOOD_CLIENT = r"""
import json, socket, sys, time
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(job["timeout"])
s.connect(job["socket"])
f = s.makefile("rb")
out = []
for request in job["requests"]:
    request["args"]["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # fresh when sent
    s.sendall(json.dumps(request).encode() + b"\n")
    while True:
        message = json.loads(f.readline())
        if "event" not in message:
            break
    data = message.get("data") or {}
    out.append({"id": message.get("id"), "ok": message.get("ok"),
                "code": (message.get("error") or {}).get("code"),
                "truncated": bool(data.get("total_output_truncated"))})
print(json.dumps(out))
"""


@contextlib.contextmanager
def _flooder() -> Iterator[pwd.struct_passwd]:
    name = f"alfld{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "--remove", "--force", name], capture_output=True)


def _peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _flood_requests(count: int) -> list[dict[str, Any]]:
    """Alternately a 16-stage pipeline past the output cap and an echo of a large argument."""
    loud = ["/bin/sh", "-c", "head -c 2000000 /dev/zero >&2; cat"]
    requests = []
    for i in range(count):
        if i % 4 == 0:
            args: dict[str, Any] = {"pipeline": [loud] * 16}
        else:
            args = {"argv": ["/usr/bin/echo", "x" * BIG_ARGUMENT, str(i)]}
        args |= {"privileged": False, "operation_id": f"flood-{uuid.uuid4()}"}
        requests.append({"v": 1, "id": f"f-{uuid.uuid4()}", "verb": "exec", "args": args})
    return requests


def _start_flood(socket_path: str, user: pwd.struct_passwd, requests: list[dict[str, Any]]) -> subprocess.Popen[str]:
    proc: subprocess.Popen[str] = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-c", _FLOOD_CLIENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, "LANG": "C.UTF-8"},
        cwd=user.pw_dir,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"socket": socket_path, "requests": requests, "timeout": 300}))
    proc.stdin.close()
    return proc


def _events(database: Path, request_ids: list[str]) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)) as conn:
        return {
            rid: int(conn.execute("SELECT count(*) FROM events WHERE request_id = ?", (rid,)).fetchone()[0])
            for rid in request_ids
        }


@pytest.mark.skipif(not ROOT or shutil.which("useradd") is None, reason="the flooder is a throwaway user: needs root")
def test_one_agent_floods_output_and_journal_while_a_victim_still_runs(tmp_path: Path, tally: Tally) -> None:
    n = max(200, stress_n() // 10)
    # The victim needs about 4 KB of journal per request: twice that in its burst, so it is never limited;
    # the flooder's large arguments go past the same burst within the flood.
    burst = n * 8 * 1024 + MiB
    flood_count = (burst // BIG_ARGUMENT) * 4 // 3 + 40
    runtime = Path(tempfile.mkdtemp(prefix="alflood", dir="/tmp"))  # reachable by the flooder, unlike tmp_path
    os.chmod(runtime, 0o755)
    with _flooder() as flooder:
        base = yaml.safe_load(write_config(tmp_path / "base.yaml").read_text())
        rules = base["policy"]["rules"] + [
            {
                "name": "flooder",
                "decision": "allow",
                "users": [flooder.pw_name],
                "privileged": False,
                "commands": [["/bin/sh", "..."], ["/usr/bin/echo", "..."]],
            }
        ]
        try:
            with running_stack(
                runtime / "s",
                agents={"users": [pwd.getpwuid(os.getuid()).pw_name, flooder.pw_name]},
                policy={"default": "deny", "rules": rules},
                limits={"max_total_output_bytes": TOTAL_OUTPUT},
                journal={"agent_bytes_per_second": 64 * 1024, "agent_burst_bytes": burst},
            ) as stack:
                os.chmod(stack.agent, 0o666)
                maker = RequestMaker(tmp_path / "markers")
                runner = stack.service_pid("runner")
                peak_before = _peak_kib(runner)

                requests = _flood_requests(flood_count)
                share = -(-len(requests) // FLOOD_CONNECTIONS)
                floods = [
                    _start_flood(stack.agent, flooder, requests[i : i + share]) for i in range(0, len(requests), share)
                ]
                planned = [maker.make(kind_of(i)) for i in range(n)]
                started = time.monotonic()
                victim = asyncio.run(run_load(stack.agent, planned, stress_clients()))
                flood_replies: list[dict[str, Any]] = []
                for proc in floods:
                    assert proc.stdout is not None and proc.stderr is not None
                    out, err = proc.stdout.read(), proc.stderr.read()  # small: one line per request
                    assert proc.wait(600) == 0, err
                    flood_replies += json.loads(out)
                seconds = time.monotonic() - started
                peak_mib = (_peak_kib(runner) - peak_before) / 1024

                found = audit(stack, victim, maker.markers)
                index = journal_index(stack)
                chain = verify_chain(stack)
                refused = [r["id"] for r in flood_replies if r["code"] == "rate_limited"]
                written = _events(stack.database, refused)
        finally:
            shutil.rmtree(runtime, ignore_errors=True)

    flood_lost = [r["id"] for r in flood_replies if r["ok"] and "exec.finished" not in index.get(r["id"], set())]
    flood_results = [Result(Planned(str(r["id"]), "flood", {}), reply=_as_reply(r)) for r in flood_replies]
    tally.add("flood: victim", victim, found)
    tally.add("flood: flooder", flood_results)

    wrong = [(r.planned.kind, why) for r in victim if (why := expected(r)) is not None]
    assert not wrong, f"{len(wrong)} victim requests without the healthy answer, e.g. {wrong[:5]}"
    assert found.lost == [] and found.unaudited == [] and found.unacknowledged_runs == 0, found
    assert len(flood_replies) == len(requests)
    codes = {r["code"] or "ok" for r in flood_replies}
    assert codes <= {"ok", "rate_limited"}, codes
    assert refused, f"the flooder was never rate_limited ({len(requests)} requests in {seconds:.1f} s)"
    assert any(r["truncated"] for r in flood_replies if r["ok"]), "no output flood ran into the total cap"
    assert flood_lost == [], f"flood requests acknowledged but not journaled: {flood_lost[:5]}"
    assert all(count == 0 for count in written.values()), "a rate_limited request left records"
    assert peak_mib < 256, f"the runner's peak memory grew by {peak_mib:.0f} MiB under the flood"
    assert chain.get("ok") is True, chain


def _as_reply(reply: dict[str, Any]) -> dict[str, Any]:
    if reply["ok"]:
        return {"id": reply["id"], "ok": True, "data": {}}
    return {"id": reply["id"], "ok": False, "error": {"code": reply["code"], "message": ""}}
