"""Red team: privileged file operations cannot be redirected, escalated, stretched or slipped past review.

An unprivileged throwaway agent owns a work directory; policy lets it run
every file tool *as root* there, and nowhere else.  It attacks the runner:

* swaps a directory of its own with a symlink to a root-only directory
  (``renameat2(RENAME_EXCHANGE)``, in a tight loop) while asking to read,
  write, edit, list, find and search below it;
* asks for setuid, setgid and sticky modes;
* points a read or write at a FIFO or a device node;
* changes a file between the operator's review and the write;
* sends a catastrophic regular expression.

Each attack has a control that shows it would have worked against the
naive code (a by-path open really lands in the root-only directory; the
regex really runs away; an unbound write would overwrite the changed file).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from secsupport import as_user, needs_root, throwaway_user

from support import Stack, custom_stack, now_iso

pytestmark = needs_root

ROUNDS = 4  # rounds of TRIES concurrent requests, until one meets the swapped link
TRIES = 40
SECRET = "TOPSECRET-f15"
CPU_SECONDS = 4

# An agent's client: one request per line on stdin, each on its own connection,
# each final reply printed as one line.
_CLIENT = r"""
import json, socket, sys
for line in sys.stdin:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(300)
    s.connect(sys.argv[1])
    s.sendall(line.encode())
    s.shutdown(socket.SHUT_WR)
    buf = b""
    while chunk := s.recv(1 << 20):
        buf += chunk
    s.close()
    finals = [r for r in buf.decode().splitlines() if r.strip() and '"event"' not in r[:40]]
    print(finals[-1] if finals else json.dumps({"ok": False, "error": {"code": "no_reply"}}), flush=True)
"""

# The attacker's swapper: exchange two names for ever (renameat2, RENAME_EXCHANGE = 2).
_SWAPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
if libc.renameat2(-100, a, -100, b, 2) != 0 or libc.renameat2(-100, a, -100, b, 2) != 0:
    print("no renameat2:", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)
print("swapping", flush=True)
while True:
    libc.renameat2(-100, a, -100, b, 2)
"""


@dataclass
class Lab:
    stack: Stack
    user: Any  # pwd.struct_passwd
    work: Path  # the agent's own directory; policy allows root file tools below it
    review: Path  # the agent's too; writes here wait for an operator
    target: Path  # root-only: where the swapped-in link points


def _config(user: str, work: Path, review: Path) -> str:
    return f"""
agents:
  users: [{user}]
limits:
  search_cpu_seconds: {CPU_SECONDS}
approval:
  timeout_seconds: 60
policy:
  default: deny
  rules:
    - name: agent-work-as-root
      decision: allow
      users: [{user}]
      privileged: true
      files:
        - tools: [files_read, files_inspect, files_list, files_find, files_search, files_write, files_edit]
          paths: [{work}/...]
    - name: agent-review-as-root
      decision: ask
      users: [{user}]
      privileged: true
      files:
        - tools: [files_write, files_edit]
          paths: [{review}/...]
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    tag = secrets.token_hex(4)
    with throwaway_user("alfs") as user:
        work, review = Path(f"/srv/agentwork-{tag}"), Path(f"/srv/agentreview-{tag}")
        target = Path(f"/srv/airlock-rootonly-{tag}")
        runtime = Path(tempfile.mkdtemp(prefix="alsf", dir="/tmp"))
        try:
            for d in (work, review):
                d.mkdir(parents=True)
                os.chown(d, user.pw_uid, user.pw_gid)
            target.mkdir(mode=0o700)
            (target / "secret").write_text(SECRET + "\n")
            os.chmod(target / "secret", 0o600)
            (target / "victim").write_text("ORIGINAL\n")
            (target / f"{SECRET}-name").write_text("")
            os.chmod(runtime, 0o755)
            with custom_stack(runtime, _config(user.pw_name, work, review)) as stack:
                os.chmod(stack.agent, 0o666)  # agents.users still decides who gets in
                yield Lab(stack, user, work, review, target)
        finally:
            for d in (work, review, target, runtime):
                shutil.rmtree(d, ignore_errors=True)


def agent_calls(lab: Lab, requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Send ``(verb, args)`` requests as the agent user; one final reply each."""
    lines = "".join(
        json.dumps({"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": {"time": now_iso()} | args}) + "\n"
        for verb, args in requests
    )
    out = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _CLIENT, lab.stack.agent],
        input=lines,
        text=True,
        capture_output=True,
        timeout=600,
        **as_user(lab.user),
    )  # type: ignore[call-overload]
    assert out.returncode == 0, out.stderr
    replies = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(replies) == len(requests), out.stdout
    return replies


def agent_call(lab: Lab, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    return agent_calls(lab, [(verb, args)])[0]


def code(reply: dict[str, Any]) -> str | None:
    """The error code of a reply: the request's, else the operation outcome's; None if it worked."""
    if not reply.get("ok"):
        return str(reply["error"]["code"])
    error = reply["data"].get("error")
    return None if error is None else str(error["code"])


def as_agent(lab: Lab, *argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=30, **as_user(lab.user))  # type: ignore[call-overload]


# --- the parent-directory swap -----------------------------------------------------------


@pytest.fixture
def swapping(lab: Lab) -> Iterator[Path]:
    """``work/race/d`` (a real directory of the agent's) swapped with ``work/race/L -> target``, non-stop."""
    race = lab.work / f"race-{secrets.token_hex(3)}"
    as_agent(lab, "mkdir", "-p", str(race / "d" / "sub"))
    as_agent(lab, "ln", "-s", str(lab.target), str(race / "L"))
    for name, content in (("secret", "decoy\n"), ("victim", "ORIGINAL\n"), ("sub/x", "x\n")):
        as_agent(lab, "sh", "-c", f"printf '%s' '{content}' > {race / 'd' / name}")
    swapper = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-c", _SWAPPER, str(race / "d"), str(race / "L")],
        stdout=subprocess.PIPE,
        text=True,
        **as_user(lab.user),
    )  # type: ignore[call-overload]
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "swapping"
        yield race
    finally:
        swapper.kill()
        swapper.wait()


def _target_untouched(lab: Lab) -> None:
    assert sorted(p.name for p in lab.target.iterdir()) == sorted(["secret", "victim", f"{SECRET}-name"])
    assert (lab.target / "victim").read_text() == "ORIGINAL\n"
    st = (lab.target / "victim").stat()
    assert (st.st_uid, st.st_gid) == (0, 0)


def test_control_the_swap_really_redirects_a_by_path_open(lab: Lab, swapping: Path) -> None:
    # What the old runner did (realpath, then open by name): as root, a by-path
    # open of d/secret lands in the root-only directory within a few tries.
    hits = 0
    deadline = time.monotonic() + 30
    while hits == 0 and time.monotonic() < deadline:
        try:
            hits += (swapping / "d" / "secret").read_text().startswith(SECRET)
        except OSError:
            pass
    assert hits, "the swap never redirected a by-path open: the race tests below would prove nothing"


_RACES: dict[str, tuple[str, dict[str, Any]]] = {
    "files_read": ("d/secret", {}),
    "files_write": ("d/victim", {"content": base64.b64encode(b"PWNED\n").decode()}),
    "files_edit": ("d/victim", {"old_text": "ORIGINAL", "new_text": "PWNED"}),
    "files_list": ("d", {}),
    "files_find": ("d", {"pattern": "*"}),
    "files_search": ("d", {"query": "TOPSECRET"}),
    "files_inspect": ("d/secret", {}),
}


@pytest.mark.parametrize("tool", sorted(_RACES))
def test_a_swapped_parent_directory_never_redirects(lab: Lab, swapping: Path, tool: str) -> None:
    relative, params = _RACES[tool]
    path = str(swapping / relative)
    # Each its own operation: identical requests would otherwise replay the first answer.  The race is
    # only sometimes met in one round on a loaded machine: rounds go on (each checked whole) until it is.
    codes: list[str | None] = []
    for round_ in range(ROUNDS):
        replies = agent_calls(
            lab,
            [
                (tool, {"path": path, "privileged": True, "operation_id": f"race-{round_}-{i}-{uuid.uuid4()}"} | params)
                for i in range(TRIES)
            ],
        )
        codes += [code(r) for r in replies]
        secret_sha256 = hashlib.sha256(f"{SECRET}\n".encode()).hexdigest()
        for reply in replies:
            shown = json.dumps(reply)
            assert SECRET not in shown and secret_sha256 not in shown, f"{tool} leaked the root-only directory: {reply}"
            assert not reply.get("ok") or reply["data"].get("owner_uid") in (None, lab.user.pw_uid), reply
        _target_untouched(lab)
        if "not_canonical" in codes:
            break
    # The runner met the swapped-in link (approval may also have denied while it pointed away).
    assert "not_canonical" in codes, codes
    assert set(codes) <= {None, "not_canonical", "denied", "no_match", "not_found", "not_a_directory"}, codes


# --- modes, FIFOs and devices -----------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o1777, 0o6755, 0o10644])
def test_setuid_setgid_and_sticky_modes_are_refused(lab: Lab, mode: int) -> None:
    payload = base64.b64encode(Path("/usr/bin/id").read_bytes()).decode()
    path = lab.work / f"tool-{mode:o}"
    reply = agent_call(lab, "files_write", {"path": str(path), "privileged": True, "content": payload, "mode": mode})
    assert code(reply) == "invalid_arguments" and not path.exists()
    # Control: the same write with plain permission bits is allowed, root-owned and executable.
    plain = agent_call(lab, "files_write", {"path": str(path), "privileged": True, "content": payload, "mode": 0o755})
    assert code(plain) is None, plain
    st = path.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755


def test_a_write_over_a_setuid_file_keeps_its_owner_but_not_the_setuid_bit(lab: Lab) -> None:
    path = lab.work / "was-suid"
    path.write_bytes(b"old")
    os.chown(path, 0, 0)
    os.chmod(path, 0o4755)
    reply = agent_call(lab, "files_write", {"path": str(path), "privileged": True, "content": "bmV3"})
    assert code(reply) is None, reply
    st = path.stat()
    assert (st.st_uid, st.st_gid) == (0, 0) and stat.S_IMODE(st.st_mode) == 0o755 and path.read_bytes() == b"new"


def test_a_fifo_or_device_as_target_is_refused_at_once(lab: Lab) -> None:
    fifo = lab.work / "fifo"
    as_agent(lab, "mkfifo", str(fifo))
    device = lab.work / "null-device"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the agent could not, but a stale one may be there
    (lab.work / "plain").write_text("plain\n")
    started = time.monotonic()
    replies = agent_calls(
        lab,
        [
            ("files_read", {"path": str(fifo), "privileged": True}),
            ("files_write", {"path": str(fifo), "privileged": True, "content": "eA=="}),
            ("files_edit", {"path": str(fifo), "privileged": True, "old_text": "a", "new_text": "b"}),
            ("files_search", {"path": str(fifo), "privileged": True, "query": "a"}),
            ("files_read", {"path": str(device), "privileged": True}),
            ("files_write", {"path": str(device), "privileged": True, "content": "eA=="}),
            ("files_read", {"path": str(lab.work / "plain"), "privileged": True}),  # control
        ],
    )
    # A blocking open of a FIFO without a writer would wait for the job's 300 s timeout.
    assert time.monotonic() - started < 120
    assert [code(r) for r in replies] == ["not_a_file"] * 6 + [None]
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and stat.S_ISCHR(device.lstat().st_mode)
    assert base64.b64decode(replies[-1]["data"]["content"]) == b"plain\n"


# --- review, then change ----------------------------------------------------------------


class AgentBackground:
    """One agent request left running (it waits for an operator)."""

    def __init__(self, lab: Lab, verb: str, args: dict[str, Any]) -> None:
        self.request_id = str(uuid.uuid4())
        line = json.dumps({"v": 1, "id": self.request_id, "verb": verb, "args": {"time": now_iso()} | args}) + "\n"
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-c", _CLIENT, lab.stack.agent],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            **as_user(lab.user),
        )  # type: ignore[call-overload]
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.close()

    def result(self, timeout: float = 120) -> dict[str, Any]:
        assert self.proc.stdout is not None
        self.proc.wait(timeout)  # replies are small: the pipe cannot fill
        out = self.proc.stdout.read()
        reply: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return reply


def _pending(lab: Lab, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for entry in lab.stack.native("pending", path=lab.stack.operator)["data"]["pending"]:
            if entry["request_id"] == request_id:
                found: dict[str, Any] = entry
                return found
        time.sleep(0.1)
    raise AssertionError("the request never became pending")


def _reviewed_write(lab: Lab, path: Path, change: bool) -> tuple[dict[str, Any], dict[str, Any], str]:
    path.write_text("reviewed\n")
    os.chown(path, lab.user.pw_uid, lab.user.pw_gid)
    bg = AgentBackground(
        lab, "files_write", {"path": str(path), "privileged": True, "content": base64.b64encode(b"approved\n").decode()}
    )
    pending = _pending(lab, bg.request_id)
    cli = lab.stack.cli("pending")
    if change:
        as_agent(lab, "sh", "-c", f"printf 'swapped in after review\\n' > {path}")
    approved = lab.stack.native("approve", {"id": bg.request_id}, path=lab.stack.operator)
    assert approved["ok"] is True, approved
    return bg.result(), pending, cli.stdout


def test_control_an_unchanged_reviewed_file_is_written(lab: Lab) -> None:
    path = lab.review / "unchanged.conf"
    reply, pending, cli = _reviewed_write(lab, path, change=False)
    reviewed = hashlib.sha256(b"reviewed\n").hexdigest()
    assert pending["request"]["before_sha256"] == reviewed
    assert reviewed in cli  # airlock pending shows what is being approved against
    assert code(reply) is None, reply
    assert path.read_text() == "approved\n"


def test_a_file_changed_after_review_is_not_written(lab: Lab) -> None:
    path = lab.review / "changed.conf"
    reply, pending, _cli = _reviewed_write(lab, path, change=True)
    assert pending["request"]["before_sha256"] == hashlib.sha256(b"reviewed\n").hexdigest()
    assert code(reply) == "file_changed", reply
    assert path.read_text() == "swapped in after review\n"
    assert [p.name for p in lab.review.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_a_file_reviewed_as_absent_that_appears_is_not_written(lab: Lab) -> None:
    path = lab.review / "new.conf"
    bg = AgentBackground(lab, "files_write", {"path": str(path), "privileged": True, "content": "eA=="})
    pending = _pending(lab, bg.request_id)
    assert pending["request"]["before_sha256"] == "absent"
    as_agent(lab, "sh", "-c", f"printf 'planted\\n' > {path}")
    assert lab.stack.native("approve", {"id": bg.request_id}, path=lab.stack.operator)["ok"] is True
    assert code(bg.result()) == "file_changed" and path.read_text() == "planted\n"


def test_expected_sha256_is_a_compare_and_swap(lab: Lab) -> None:
    path = lab.work / "cas.conf"
    path.write_text("one\n")
    stale = agent_call(
        lab,
        "files_write",
        {
            "path": str(path),
            "privileged": True,
            "content": "dHdvCg==",
            "expected_sha256": hashlib.sha256(b"zero\n").hexdigest(),
        },
    )
    assert code(stale) == "file_changed" and path.read_text() == "one\n"
    fresh = agent_call(
        lab,
        "files_write",
        {
            "path": str(path),
            "privileged": True,
            "content": "dHdvCg==",
            "expected_sha256": hashlib.sha256(b"one\n").hexdigest(),
        },
    )
    assert code(fresh) is None and path.read_text() == "two\n"
    bad = agent_call(lab, "files_write", {"path": str(path), "privileged": True, "content": "", "expected_sha256": "X"})
    assert code(bad) == "invalid_arguments"


# --- a catastrophic regular expression ------------------------------------------------------


def test_control_the_regex_really_runs_away() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            ["/usr/bin/python3", "-I", "-c", "import re; re.search('(a+)+$', 'a' * 40 + '!')"], timeout=3 * CPU_SECONDS
        )


def test_a_catastrophic_regex_is_stopped_by_the_cpu_limit(lab: Lab) -> None:
    (lab.work / "regex").mkdir(exist_ok=True)
    (lab.work / "regex" / "f").write_text("a" * 40 + "!\n")
    started = time.monotonic()
    reply = agent_call(
        lab, "files_search", {"path": str(lab.work / "regex"), "privileged": True, "query": "(a+)+$", "regex": True}
    )
    took = time.monotonic() - started
    assert code(reply) == "limit_exceeded", reply
    assert took < 100, took  # the job timeout is 300 s
    # Control: a sane search of the same file works.
    sane = agent_call(
        lab, "files_search", {"path": str(lab.work / "regex"), "privileged": True, "query": "a+!$", "regex": True}
    )
    assert code(sane) is None and len(sane["data"]["matches"]) == 1


def test_the_agent_can_cancel_its_own_privileged_search(lab: Lab) -> None:
    (lab.work / "regex").mkdir(exist_ok=True)
    (lab.work / "regex" / "f").write_text("a" * 40 + "!\n")
    codes = []
    for _attempt in range(5):
        op = f"op-{uuid.uuid4()}"
        started = time.monotonic()
        bg = AgentBackground(
            lab,
            "files_search",
            {"path": str(lab.work / "regex"), "privileged": True, "query": "(a+)+$", "regex": True, "operation_id": op},
        )
        cancelled = None
        while time.monotonic() - started < 30:
            cancelled = agent_call(lab, "cancel", {"operation_id": op})
            if cancelled.get("ok"):
                break
            time.sleep(0.05)
        assert cancelled is not None and cancelled.get("ok"), cancelled
        reply = bg.result()
        codes.append(code(reply))
        # A cancel that lands before the rule's decision withdraws the request (nothing ran);
        # under load that can happen: try again until one lands on the running search.
        if codes[-1] != "withdrawn":
            break
    assert codes[-1] == "cancelled", codes
