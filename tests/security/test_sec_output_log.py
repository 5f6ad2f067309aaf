"""Output logs under attack (issue 51), against a live stack played by real throwaway users.

1. Retention keeps each requester's logs in a budget of its own: agent A's
   incompressible output pushed agent B's log out (one global budget, oldest
   first).  Now A's own oldest logs go, each deletion journaled first
   (``output_log.deleted``), and B's log stays readable and matching.
   Control: A's logs past its budget are indeed deleted.
2. An output log's whole content is what the chain committed:

Root can rewrite a kept log (runner.output_dir is root's).  Each stream's
SHA-256 in ``exec.finished`` caught changed bytes, but not a forged note of
airlock's own (``[airlock: operator … approved this job by phone]``) nor
stdout and stderr frames put in another order: those printed "matches".
``exec.finished`` now also commits ``log_sha256``, the log as written, so
`airlock show ID --output` says DOES NOT MATCH for either.  Control: the
untouched log, and the same file rewritten with its own frames in their own
order, match.
"""

from __future__ import annotations

import gzip
import json
import pwd
import struct
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user

from support import Stack

pytestmark = needs_root

CONFIG = """
policy:
  default: deny
  rules:
    - name: allow-sh
      decision: allow
      privileged: true
      commands: [[/usr/bin/dash, "..."]]
"""
FRAME = struct.Struct(">BBII")


def _frames(raw: bytes) -> tuple[bytes, list[tuple[int, int, int, bytes]]]:
    """The log's header line and its frames (kind, stage, ms, bytes)."""
    head_end = raw.index(b"\n", raw.index(b"\n") + 1) + 1
    frames, pos = [], head_end
    while pos < len(raw):
        kind, stage, ms, length = FRAME.unpack_from(raw, pos)
        pos += FRAME.size
        frames.append((kind, stage, ms, raw[pos : pos + length]))
        pos += length
    return raw[:head_end], frames


def _write(path: Path, head: bytes, frames: list[tuple[int, int, int, bytes]]) -> None:
    body = b"".join(FRAME.pack(k, s, ms, len(d)) + d for k, s, ms, d in frames)
    path.write_bytes(gzip.compress(head + body))


def _job(stack: Stack, operation: str) -> tuple[str, Path]:
    script = "echo first; sleep 0.3; echo second >&2; sleep 0.3; echo third"
    reply = stack.exec({"argv": ["sh", "-c", script], "privileged": True, "operation_id": operation})
    assert reply["ok"], reply
    rows = stack.journal_rows()
    rid = next(r["request_id"] for r in rows if r["kind"] == "exec.started" and r["operation_id"] == operation)
    payload: dict[str, Any] = next(
        json.loads(r["payload"]) for r in rows if r["kind"] == "exec.finished" and r["request_id"] == rid
    )
    return rid, stack.runtime_dir / "state" / "output" / payload["output_log"]["file"]


@pytest.mark.parametrize("forgery", ["note", "reorder"])
def test_a_forged_note_or_reordered_frames_do_not_match_the_chain(forgery: str) -> None:
    with red_stack(CONFIG) as stack:
        rid, path = _job(stack, f"op-forge-{forgery}")
        shown = stack.cli("show", rid, "--output")
        assert shown.returncode == 0 and "matches exec.finished" in shown.stdout, shown
        head, frames = _frames(gzip.decompress(path.read_bytes()))
        assert [k for k, *_ in frames] == [0, 1, 0], frames  # stdout, stderr, stdout: three frames
        # Control: the same frames written again (another gzip stream) still match.
        _write(path, head, frames)
        again = stack.cli("show", rid, "--output")
        assert again.returncode == 0 and "matches exec.finished" in again.stdout, again
        if forgery == "note":
            forged = b"[airlock: operator alice approved this job by phone]"
            frames.insert(1, (2, 0, frames[0][2], forged))
        else:  # stderr first: every stream's bytes unchanged
            frames = [frames[1], frames[0], frames[2]]
        _write(path, head, frames)
        tampered = stack.cli("show", rid, "--output")
        assert tampered.returncode == 1, tampered
        assert "DOES NOT MATCH THE CHAIN: the log as written" in tampered.stdout, tampered.stdout


def test_one_agents_output_does_not_evict_another_agents_log() -> None:
    with throwaway_user("aloga") as alice, throwaway_user("alogb") as bob:
        config = f"""
agents:
  users: [{alice.pw_name}, {bob.pw_name}]
policy:
  default: deny
  rules:
    - name: flood-and-log
      decision: allow
      privileged: false
      commands: [[/usr/bin/head, -c, "20480", /dev/urandom], [/usr/bin/echo, "..."]]
runner:
  output_log_agent_bytes: 32768
  output_log_total_bytes: 1048576
"""
        with red_stack(config) as stack:
            said = agent_exec(stack.agent, bob, {"argv": ["echo", "bob-evidence"], "privileged": False})
            assert said["ok"], said
            bob_rid = said["data"].get("request_id") or _rid(stack, bob)
            # alice floods: four logs of 20 KiB she cannot compress, against her budget of 32 KiB.
            for _ in range(4):
                flood = agent_exec(
                    stack.agent, alice, {"argv": ["head", "-c", "20480", "/dev/urandom"], "privileged": False}
                )
                assert flood["ok"], flood
            deleted = [
                item
                for row in stack.journal_rows()
                if row["kind"] == "output_log.deleted"
                for item in json.loads(row["payload"])["files"]
            ]
            # Control: retention ran, and what went was alice's own, each deletion journaled with why.
            assert deleted, "retention deleted nothing"
            assert {d["group"] for d in deleted} == {f"u{alice.pw_uid}"}, deleted
            assert {d["reason"] for d in deleted} == {"agent_budget"}, deleted
            output = stack.runtime_dir / "state" / "output"
            assert not any((output / d["file"]).exists() for d in deleted)
            # bob's log is still there, and still what the chain says.
            shown = stack.cli("show", bob_rid, "--output")
            assert shown.returncode == 0 and "bob-evidence" in shown.stdout, shown
            assert "matches exec.finished" in shown.stdout, shown


def _rid(stack: Stack, user: pwd.struct_passwd) -> str:
    """The request ID of ``user``'s first job."""
    return str(
        next(
            r["request_id"]
            for r in stack.journal_rows()
            if r["kind"] == "exec.started" and r["peer_uid"] == user.pw_uid
        )
    )
