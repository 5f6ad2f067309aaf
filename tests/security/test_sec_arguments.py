"""Attacks on *what a root job reads* (issue 27, items 4 and 5).

4. Scripts and file arguments were not bound: the operator reads the agent's
   script, approves ``sh /home/agent/task.sh`` with ``--grant``, the agent
   rewrites it, and the next identical request runs the new content as root;
   a file argument swapped while the operator looks is read as root.  Now a
   root job's path argument the agent can change is flagged, bound by
   identity and content, never granted, asks even under an allow rule (unless
   ``writable_arguments: allow``), and is checked again before the job starts
   (``argument_changed``); a script runs from a sealed memfd of the reviewed
   bytes.
5. The ``#!`` interpreter of a root-owned binary, or an ELF's RUNPATH, under a
   directory the agent owns: the agent swaps it and the approved root run
   executes the agent's code.  Now ``unsafe_binary`` names the directory.

Each has a control: the same with files only root can change works as
before, and the payloads really do run as root when started directly.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import (
    agent_exec,
    agent_request,
    final,
    needs_root,
    red_stack,
    replies,
    root_dir,
    run_as,
    throwaway_user,
)

from support import Stack, wait_pending

pytestmark = needs_root

CC = shutil.which("cc")


@pytest.fixture(scope="module")
def agent() -> Iterator[pwd.struct_passwd]:
    with throwaway_user("alarg") as user:
        yield user


@pytest.fixture(scope="module")
def rootdir() -> Iterator[Path]:
    """Root's alone: where root-owned tools live and payloads leave their marks."""
    path = root_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _agent_file(path: Path, user: pwd.struct_passwd, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, user.pw_uid, user.pw_gid)
    os.chown(path.parent, user.pw_uid, user.pw_gid)


def _compile(source: str, out: Path, *flags: str) -> None:
    assert CC is not None
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([CC, "-o", str(out), str(src), *flags], check=True, capture_output=True)
    src.unlink()


def _build_rpath_tools(home: Path, agent: pwd.struct_passwd, rootdir: Path) -> None:
    """A root-owned ELF whose RUNPATH is the agent's lib folder (and one whose RUNPATH is root's)."""
    pwn = (
        "#include <fcntl.h>\n"
        "__attribute__((constructor)) static void pwn(void)\n"
        f'{{ open("{rootdir}/rpath-pwned", O_CREAT | O_WRONLY, 0644); }}\n'
        "int alpwn(void) { return 0; }\n"
    )
    main = "int alpwn(void);\nint main(void) { return alpwn(); }\n"
    for lib in (home / "lib", rootdir / "lib"):
        lib.mkdir(exist_ok=True)
        _compile(
            pwn if lib.parent == home else "int alpwn(void) { return 0; }\n", lib / "libalpwn.so", "-shared", "-fPIC"
        )
    for f in (home / "lib", home / "lib" / "libalpwn.so"):
        os.chown(f, agent.pw_uid, agent.pw_gid)
    _compile(main, rootdir / "rpath-tool", f"-L{home}/lib", "-lalpwn", f"-Wl,-rpath,{home}/lib")
    _compile(main, rootdir / "rpath-ok", f"-L{rootdir}/lib", "-lalpwn", f"-Wl,-rpath,{rootdir}/lib")


@pytest.fixture(scope="module")
def astack(agent: pwd.struct_passwd, rootdir: Path) -> Iterator[Stack]:
    home = Path(agent.pw_dir)
    # Attack 5's tools exist before the policy is loaded (rules name them).
    bindir = home / "app" / "bin"
    bindir.mkdir(parents=True)
    shutil.copy("/usr/bin/dash", bindir / "shx")
    for path in (home / "app", bindir, bindir / "shx"):
        os.chown(path, agent.pw_uid, agent.pw_gid)
    (rootdir / "report").write_text(f"#!{home}/app/bin/shx\nexit 0\n")
    (rootdir / "report-ok").write_text("#!/bin/sh\necho report ok\n")
    for name in ("report", "report-ok"):
        (rootdir / name).chmod(0o755)
    rpath_rules = ""
    if CC is not None:
        _build_rpath_tools(home, agent, rootdir)
        rpath_rules = f", [{rootdir}/rpath-tool], [{rootdir}/rpath-ok]"
    config = f"""
agents:
  users: [{agent.pw_name}]
approval:
  timeout_seconds: 30
policy:
  default: deny
  rules:
    - name: scripts
      decision: ask
      users: [{agent.pw_name}]
      privileged: true
      commands: [[/bin/sh, "..."]]
    - name: cat-anything
      decision: allow
      users: [{agent.pw_name}]
      privileged: true
      commands: [[/usr/bin/cat, "..."]]
    - name: copy-in
      decision: allow
      users: [{agent.pw_name}]
      privileged: true
      writable_arguments: allow
      commands: [[/usr/bin/cp, "..."]]
    - name: reports
      decision: allow
      users: [{agent.pw_name}]
      privileged: true
      commands: [[{rootdir}/report], [{rootdir}/report-ok]{rpath_rules}]
"""
    with red_stack(config) as stack:
        yield stack


def _journal(stack: Stack, op: str) -> list[dict[str, Any]]:
    return [r | {"payload": json.loads(r["payload"])} for r in stack.journal_rows() if r["operation_id"] == op]


def _ask(stack: Stack, agent: pwd.struct_passwd, argv: list[str]) -> tuple[Any, str, str]:
    op, request_id = f"op-arg-{uuid.uuid4()}", f"rq-arg-{uuid.uuid4()}"
    proc = agent_request(
        stack.agent, agent, "exec", {"argv": argv, "privileged": True, "operation_id": op}, request_id=request_id
    )
    return proc, request_id, op


def _stdout(reply: dict[str, Any]) -> str:
    return base64.b64decode(reply["data"]["stdout"]).decode()


# --- attack 4: scripts and file arguments ---------------------------------------------


def test_agent_script_gets_no_grant_and_a_rewrite_asks_again(
    astack: Stack, agent: pwd.struct_passwd, rootdir: Path
) -> None:
    home = Path(agent.pw_dir)
    script, mark = home / "task.sh", rootdir / "grant-pwned"
    _agent_file(script, agent, "echo reviewed\n")

    proc, request_id, _op = _ask(astack, agent, ["sh", str(script)])
    pending = wait_pending(astack, request_id, timeout=30)
    flagged = pending["arguments"]
    assert [(a["path"], a["script"], a["changeable"]["path"]) for a in flagged] == [(str(script), True, str(home))]
    shown = astack.cli("pending")
    assert "CHANGEABLE" in shown.stdout and str(script) in shown.stdout  # the operator sees it flagged
    assert "CHANGEABLE" in astack.cli("show", request_id).stdout
    assert 'arguments: "stage 1 arg 1 ' + str(script) in astack.cli("statement", request_id).stdout
    refused = astack.cli("approve", request_id, "--grant", "30m")
    assert refused.returncode != 0 and "no grant" in refused.stderr, refused
    assert astack.cli("approve", request_id).returncode == 0  # approving this one run is still possible
    reply = final(replies(proc))
    assert reply["ok"] is True and _stdout(reply) == "reviewed\n", reply

    # The agent rewrites the script it owns: the next identical request is decided again.
    run_as(agent, "sh", "-c", f"printf 'touch {mark}\\n' > {script}")
    proc, request_id, _op = _ask(astack, agent, ["sh", str(script)])
    wait_pending(astack, request_id, timeout=30)
    assert astack.native("deny", {"id": request_id}, path=astack.operator)["ok"] is True
    assert final(replies(proc))["error"]["code"] == "denied"
    assert not mark.exists()

    # Control: a script only root can change takes a grant, and the grant lets the same request through.
    trusted = rootdir / "task-root.sh"
    trusted.write_text("echo trusted\n")
    proc, request_id, _op = _ask(astack, agent, ["sh", str(trusted)])
    assert wait_pending(astack, request_id, timeout=30)["arguments"] == []
    assert astack.cli("approve", request_id, "--grant", "10m").returncode == 0
    assert final(replies(proc))["ok"] is True
    again = agent_exec(astack.agent, agent, {"argv": ["sh", str(trusted)], "privileged": True})
    assert again["ok"] is True and again["data"]["decision"]["decided_by"].startswith("grant "), again
    # ... and no grant matches once someone else can change the script: the same request asks again.
    os.chown(trusted, agent.pw_uid, agent.pw_gid)
    proc, request_id, _op = _ask(astack, agent, ["sh", str(trusted)])
    assert wait_pending(astack, request_id, timeout=30)["arguments"][0]["path"] == str(trusted)
    assert astack.native("deny", {"id": request_id}, path=astack.operator)["ok"] is True
    assert final(replies(proc))["error"]["code"] == "denied"


def test_script_rewritten_while_pending_is_refused_and_runs_from_the_reviewed_bytes(
    astack: Stack, agent: pwd.struct_passwd, rootdir: Path
) -> None:
    home = Path(agent.pw_dir)
    script, mark = home / "task2.sh", rootdir / "rewrite-pwned"
    _agent_file(script, agent, "echo reviewed\n")
    proc, request_id, op = _ask(astack, agent, ["sh", str(script)])
    wait_pending(astack, request_id, timeout=30)
    before = os.stat(script)
    run_as(agent, "sh", "-c", f"printf 'touch {mark}\\n' > {script}")  # in place, while the operator reads
    after = os.stat(script)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)  # only the content changed
    assert astack.cli("approve", request_id).returncode == 0
    reply = final(replies(proc))
    assert reply["ok"] is False and reply["error"]["code"] == "argument_changed", reply
    assert reply["error"]["details"]["path"] == str(script)
    assert not mark.exists()
    refused = [r["payload"] for r in _journal(astack, op) if r["kind"] == "exec.refused"]
    assert refused and refused[0]["code"] == "argument_changed"
    # Control: the rewritten script is a real payload when root runs it.
    subprocess.run(["sh", str(script)], check=True)
    assert mark.exists()
    mark.unlink()

    # What runs is the reviewed copy, not the path: the job's $0 is its sealed memfd.
    _agent_file(script, agent, 'echo "$0"\n')
    proc, request_id, op = _ask(astack, agent, ["sh", str(script)])
    wait_pending(astack, request_id, timeout=30)
    assert astack.cli("approve", request_id).returncode == 0
    reply = final(replies(proc))
    assert reply["ok"] is True, reply
    started = [r["payload"] for r in _journal(astack, op) if r["kind"] == "exec.started"]
    assert started[0]["arguments"][0]["sha256"] and started[0]["arguments"][0]["script"] is True
    assert _stdout(reply).startswith("/proc/self/fd/"), reply


def test_file_argument_swapped_while_pending_is_refused(astack: Stack, agent: pwd.struct_passwd, rootdir: Path) -> None:
    home = Path(agent.pw_dir)
    data, swap = home / "data.txt", home / "data.new"
    _agent_file(data, agent, "hello\n")
    # The allow rule does not cover an argument the agent can change: it asks.
    proc, request_id, op = _ask(astack, agent, ["cat", str(data)])
    pending = wait_pending(astack, request_id, timeout=30)
    assert [a["path"] for a in pending["arguments"]] == [str(data)]
    assert pending["arguments"][0]["sha256"] and not pending["arguments"][0]["script"]
    run_as(agent, "ln", "-s", "/etc/shadow", str(swap))
    run_as(agent, "mv", str(swap), str(data))  # the swap while the operator looks
    assert os.path.realpath(data) == "/etc/shadow"  # control: the path now leads to root's secrets
    assert astack.cli("approve", request_id).returncode == 0
    reply = final(replies(proc))
    assert reply["ok"] is False and reply["error"]["code"] == "argument_changed", reply
    assert "stdout" not in (reply.get("data") or {})
    refused = [r["payload"] for r in _journal(astack, op) if r["kind"] == "exec.refused"]
    assert refused and refused[0]["code"] == "argument_changed"

    # Control: the same rule allows at once what only root can change.
    (rootdir / "root-data.txt").write_text("root data\n")
    reply = agent_exec(astack.agent, agent, {"argv": ["cat", str(rootdir / "root-data.txt")], "privileged": True})
    assert reply["ok"] is True and reply["data"]["decision"]["decided_by"] == "policy", reply


def test_writable_arguments_allow_runs_bound_and_checked(
    astack: Stack, agent: pwd.struct_passwd, rootdir: Path
) -> None:
    home = Path(agent.pw_dir)
    src, dst = home / "src.txt", rootdir / f"dst-{uuid.uuid4().hex[:6]}"
    _agent_file(src, agent, "payload\n")
    op = f"op-cp-{uuid.uuid4()}"
    reply = agent_exec(
        astack.agent, agent, {"argv": ["cp", str(src), str(dst)], "privileged": True, "operation_id": op}
    )
    assert reply["ok"] is True, reply  # the rule says writable_arguments: allow
    assert dst.read_text() == "payload\n"
    started = [r["payload"] for r in _journal(astack, op) if r["kind"] == "exec.started"]
    assert [a["path"] for a in started[0]["arguments"]] == [str(src)]  # bound, and journaled


# --- attack 5: the interpreter chain --------------------------------------------------


def test_shebang_interpreter_under_an_agent_folder_is_unsafe(
    astack: Stack, agent: pwd.struct_passwd, rootdir: Path
) -> None:
    home = Path(agent.pw_dir)
    report, mark = rootdir / "report", rootdir / "shebang-pwned"
    # Control: the tool is root's alone and passes the binary's own walk; the agent
    # can swap its interpreter, and then the tool run as root runs the agent's code.
    assert os.stat(report).st_uid == 0 and os.stat(rootdir).st_uid == 0
    run_as(agent, "sh", "-c", f"printf '#!/bin/sh\\ntouch {mark}\\n' > {home}/app/bin/shx.new")
    run_as(agent, "chmod", "755", f"{home}/app/bin/shx.new")
    run_as(agent, "mv", f"{home}/app/bin/shx.new", f"{home}/app/bin/shx")
    subprocess.run([str(report)], check=True)
    assert mark.exists()
    mark.unlink()

    op = f"op-shebang-{uuid.uuid4()}"
    reply = agent_exec(astack.agent, agent, {"argv": [str(report)], "privileged": True, "operation_id": op})
    assert reply["ok"] is False and reply["error"]["code"] == "unsafe_binary", reply
    assert reply["error"]["details"]["path"] == str(home)
    assert not mark.exists()
    trail = _journal(astack, op)
    refused = [r["payload"] for r in trail if r["kind"] == "exec.refused"]
    assert refused and refused[0]["code"] == "unsafe_binary"  # the runner refused before spawning
    assert not [r for r in trail if r["kind"] == "exec.finished"]

    # Control: the same kind of tool with a root-owned interpreter runs.
    reply = agent_exec(astack.agent, agent, {"argv": [str(rootdir / "report-ok")], "privileged": True})
    assert reply["ok"] is True, reply


@pytest.mark.skipif(CC is None, reason="building an ELF with a RUNPATH needs a C compiler (cc)")
def test_elf_runpath_under_an_agent_folder_is_unsafe(astack: Stack, agent: pwd.struct_passwd, rootdir: Path) -> None:
    home = Path(agent.pw_dir)
    tool, mark = rootdir / "rpath-tool", rootdir / "rpath-pwned"
    # Control: run as root directly, the tool loads the agent's library (its constructor leaves the mark).
    subprocess.run([str(tool)], check=True)
    assert mark.exists()
    mark.unlink()

    reply = agent_exec(astack.agent, agent, {"argv": [str(tool)], "privileged": True})
    assert reply["ok"] is False and reply["error"]["code"] == "unsafe_binary", reply
    assert reply["error"]["details"]["path"] == str(home)
    assert "RUNPATH" in reply["error"]["message"]
    assert not mark.exists()

    # Control: a RUNPATH only root can change is fine.
    reply = agent_exec(astack.agent, agent, {"argv": [str(rootdir / "rpath-ok")], "privileged": True})
    assert reply["ok"] is True, reply
