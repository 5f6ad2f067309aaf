"""The runner's file operations: ranges, listings, atomic writes, identity drop, SIGKILL."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airlock.common.errors import AirlockError
from airlock.common.fileop_spec import FileSpec
from airlock.runner import fileop_perform, fileop_verbs
from airlock.runner.identity import resolve_identity

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another identity")


def spec(tool: str, path: Path | str, **params: Any) -> FileSpec:
    return FileSpec(tool=tool, path=str(path), privileged=True, uid=0, params=params)


def run(tool: str, path: Path | str, **params: Any) -> dict[str, Any]:
    return fileop_perform.perform(spec(tool, path, **params))


def test_read_byte_ranges_and_next_offset(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"0123456789")
    part = run("files_read", target, offset_bytes=3, length_bytes=4)
    assert part["ok"] is True and base64.b64decode(part["content"]) == b"3456"
    assert part["next_offset_bytes"] == 7 and part["eof"] is False and part["size_bytes"] == 10
    assert part["content_sha256"] == hashlib.sha256(b"3456").hexdigest()
    rest = run("files_read", target, offset_bytes=7)
    assert base64.b64decode(rest["content"]) == b"789" and rest["next_offset_bytes"] is None and rest["eof"] is True
    past = run("files_read", target, offset_bytes=50)
    assert past["ok"] is True and past["content"] == "" and past["eof"] is True


def test_errors_are_outcomes(tmp_path: Path) -> None:
    assert run("files_read", tmp_path / "missing")["error"]["code"] == "not_found"
    assert run("files_read", tmp_path)["error"]["code"] == "is_a_directory"
    assert run("files_list", tmp_path / "missing")["error"]["code"] == "not_found"


def test_inspect_list_find_search(tmp_path: Path) -> None:
    (tmp_path / "a.conf").write_text("listen 80;\nserver_name x;\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.conf").write_text("listen 443;\n")
    (tmp_path / "sub" / "bin").write_bytes(b"\0listen")
    os.chmod(tmp_path / "a.conf", 0o640)
    info = run("files_inspect", tmp_path / "a.conf")
    assert info["type"] == "file" and info["mode"] == "0640" and info["size_bytes"] == 26
    assert info["sha256"] == hashlib.sha256((tmp_path / "a.conf").read_bytes()).hexdigest()
    listing = run("files_list", tmp_path)
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [("a.conf", "file"), ("sub", "directory")]
    assert run("files_list", tmp_path, limit=1)["truncated"] is True
    found = run("files_find", tmp_path, pattern="*.conf")
    assert found["paths"] == [str(tmp_path / "a.conf"), str(tmp_path / "sub" / "b.conf")]
    assert run("files_find", tmp_path, pattern="*.conf", max_depth=1)["paths"] == [str(tmp_path / "a.conf")]
    hits = run("files_search", tmp_path, query="listen")
    assert [(m["path"], m["line"]) for m in hits["matches"]] == [
        (str(tmp_path / "a.conf"), 1),
        (str(tmp_path / "sub" / "b.conf"), 1),
    ]
    assert run("files_search", tmp_path, query=r"listen \d{3};", regex=True)["matches"][0]["text"] == "listen 443;"
    assert run("files_search", tmp_path, query="(", regex=True)["error"]["code"] == "invalid_pattern"


def test_write_creates_and_replaces_keeping_owner_and_mode(tmp_path: Path) -> None:
    target = tmp_path / "new.txt"
    created = run("files_write", target, content=base64.b64encode(b"one\n").decode(), mode=0o600)
    assert created["ok"] is True and created["created"] is True and created["before_sha256"] is None
    assert target.read_bytes() == b"one\n" and (target.stat().st_mode & 0o777) == 0o600
    os.chmod(target, 0o640)
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534)
    replaced = run("files_write", target, content=base64.b64encode(b"two\n").decode())
    assert replaced["before_sha256"] == hashlib.sha256(b"one\n").hexdigest()
    assert replaced["after_sha256"] == hashlib.sha256(b"two\n").hexdigest()
    st = target.stat()
    assert target.read_bytes() == b"two\n" and (st.st_mode & 0o777) == 0o640
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (65534, 65534)
    assert [p.name for p in tmp_path.iterdir()] == ["new.txt"]  # no temp file left behind
    stale = run("files_write", target, content="", expected_sha256="0" * 64)
    assert stale["error"]["code"] == "file_changed" and target.read_bytes() == b"two\n"
    assert run("files_write", tmp_path / "nope", content="", create=False)["error"]["code"] == "not_found"


def test_edit_needs_exactly_one_match(tmp_path: Path) -> None:
    target = tmp_path / "nginx.conf"
    target.write_text("worker_processes 1;\nlisten 80;\nlisten 80;\nuser www;\n")
    none = run("files_edit", target, old_text="listen 8080;", new_text="x")
    assert none["ok"] is False and none["error"]["code"] == "no_match"
    many = run("files_edit", target, old_text="listen 80;", new_text="listen 81;")
    assert many["ok"] is False and many["error"]["code"] == "ambiguous_match"
    one = run("files_edit", target, old_text="user www;", new_text="user nginx;")
    assert one["ok"] is True and "-user www;" in one["diff"] and "+user nginx;" in one["diff"]
    assert target.read_text().endswith("user nginx;\n")
    assert (
        fileop_perform.perform(
            spec("files_edit", target, old_text="worker_processes 1;", new_text="worker_processes 2;"),
            preview_only=True,
        )["diff"].count("+worker_processes 2;")
        == 1
    )
    assert "worker_processes 1;" in target.read_text()  # a preview writes nothing


def test_file_spec_checks_parameters() -> None:
    with pytest.raises(AirlockError):
        FileSpec(tool="files_read", path="relative", privileged=True, uid=0)
    with pytest.raises(AirlockError):
        FileSpec(tool="files_read", path="/x/../etc/shadow", privileged=True, uid=0)
    with pytest.raises(AirlockError):
        FileSpec(tool="files_read", path="/x", privileged=True, uid=0, params={"bogus": 1})
    with pytest.raises(AirlockError):
        FileSpec(tool="files_edit", path="/x", privileged=True, uid=0, params={"new_text": "x"})
    with pytest.raises(AirlockError):
        FileSpec(tool="files_chmod", path="/x", privileged=True, uid=0)
    a = FileSpec(tool="files_read", path="/x", privileged=True, uid=0)
    b = FileSpec(tool="files_read", path="/x", privileged=True, uid=0, params={"offset_bytes": 0})
    assert a.digest() == b.digest()  # defaults are part of the spec
    assert FileSpec.from_dict(a.to_dict()) == a


@needs_root
def test_execute_drops_to_the_user_so_permission_denied_is_an_outcome(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    nobody = resolve_identity(pwd.getpwnam("nobody").pw_uid)
    root = resolve_identity(0)
    denied = asyncio.run(fileop_verbs.execute(spec("files_read", secret), nobody, timeout=10))
    assert denied["ok"] is False and denied["error"]["code"] == "permission_denied"
    assert denied["uid"] == nobody.uid
    allowed = asyncio.run(fileop_verbs.execute(spec("files_read", secret), root, timeout=10))
    assert allowed["ok"] is True and base64.b64decode(allowed["content"]) == b"root only\n"
    write = asyncio.run(fileop_verbs.execute(spec("files_write", tmp_path / "new", content=""), nobody, timeout=10))
    assert write["error"]["code"] == "permission_denied" and not (tmp_path / "new").exists()


_WRITER = """
import sys
from airlock.runner.fileop_write import atomic_write
import os
path = sys.argv[1]
data = bytes([int(sys.argv[2])]) * (64 * 1024 * 1024)
parent = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
st = os.stat(path)
print("go", flush=True)
atomic_write(parent, os.path.basename(path), path, data, st, None)
"""


def test_atomic_write_under_sigkill_leaves_old_or_new_never_partial(tmp_path: Path) -> None:
    target = tmp_path / "target"
    old = b"A" * (64 * 1024 * 1024)
    target.write_bytes(old)
    outcomes = set()
    # From "killed at once" to "long after the rename": both ends are checked.
    for attempt, delay in enumerate((0.0, 0.05, 0.15, 0.3, 0.6, 5.0)):
        current = target.read_bytes()
        marker = 66 + attempt
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), str(marker)], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"go\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        after = target.read_bytes()
        new = bytes([marker]) * len(old)
        assert after in (current, new), "a partial write is visible"
        outcomes.add("new" if after == new else "old")
        for leftover in tmp_path.glob(".target.airlock-*.tmp"):
            leftover.unlink()  # a temp file may remain after SIGKILL; the target never mixes
    assert outcomes == {"old", "new"}


@needs_root
def test_as_root_a_path_through_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "f").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(real)
    (tmp_path / "shadow-like").write_text("secret")
    (real / "swapped").symlink_to(tmp_path / "shadow-like")
    assert run("files_read", link / "f")["error"]["code"] == "not_canonical"
    assert run("files_read", real / "swapped")["error"]["code"] == "not_canonical"
    assert run("files_write", real / "swapped", content="")["error"]["code"] == "not_canonical"
    assert (tmp_path / "shadow-like").read_text() == "secret"
    assert run("files_read", real / "f")["ok"] is True
    assert run("files_inspect", real / "swapped")["type"] == "symlink"  # inspected, not followed


def test_a_fifo_or_device_is_never_opened_as_a_target(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # A blocking open of a FIFO with no writer would hang: these come back at once.
    for tool, params in (
        ("files_read", {}),
        ("files_search", {"query": "x"}),
        ("files_write", {"content": ""}),
        ("files_edit", {"old_text": "a", "new_text": "b"}),
    ):
        assert run(tool, fifo, **params)["error"]["code"] == "not_a_file", tool
    assert stat_kind(fifo) == "fifo"  # still the FIFO: nothing replaced it
    assert run("files_read", "/dev/null")["error"]["code"] == "not_a_file"
    assert run("files_inspect", fifo)["type"] == "fifo"


def stat_kind(path: Path) -> str:
    import stat as st

    mode = os.lstat(path).st_mode
    return "fifo" if st.S_ISFIFO(mode) else "file" if st.S_ISREG(mode) else "other"


def test_special_mode_bits_are_refused_and_an_existing_file_loses_none_it_had(tmp_path: Path) -> None:
    for mode in (0o4755, 0o2755, 0o1777, 0o10000):
        with pytest.raises(AirlockError) as err:
            spec("files_write", tmp_path / "x", content="", mode=mode)
        assert err.value.code.value == "invalid_arguments" and "setuid" in err.value.message
    assert spec("files_write", tmp_path / "x", content="", mode=0o777).params["mode"] == 0o777
    target = tmp_path / "suid"
    target.write_bytes(b"old")
    os.chmod(target, 0o4755)
    assert run("files_write", target, content=base64.b64encode(b"new").decode())["ok"] is True
    assert target.stat().st_mode & 0o7777 == 0o755  # permission bits kept, setuid not


def test_a_symlink_anywhere_in_the_path_is_not_canonical_for_every_tool(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "d").mkdir(parents=True)
    (real / "d" / "f").write_text("x\n")
    (tmp_path / "link").symlink_to(real)
    through = tmp_path / "link" / "d"
    for tool, params in (
        ("files_read", {}),
        ("files_list", {}),
        ("files_find", {}),
        ("files_search", {"query": "x"}),
        ("files_inspect", {}),
        ("files_write", {"content": ""}),
        ("files_edit", {"old_text": "x", "new_text": "y"}),
    ):
        target = through if tool in ("files_list", "files_find", "files_search") else through / "f"
        assert run(tool, target, **params)["error"]["code"] == "not_canonical", tool
    assert (real / "d" / "f").read_text() == "x\n"
    assert run("files_read", str(real) + "//d/f")["error"]["code"] == "not_canonical"


def test_a_write_bound_to_a_pre_state_refuses_a_changed_file(tmp_path: Path) -> None:
    target = tmp_path / "conf"
    target.write_text("reviewed\n")
    reviewed = hashlib.sha256(b"reviewed\n").hexdigest()
    target.write_text("changed\n")
    out = fileop_perform.perform(
        spec("files_write", target, content=base64.b64encode(b"new\n").decode()), expect=reviewed
    )
    assert out["error"]["code"] == "file_changed" and target.read_text() == "changed\n"
    appeared = fileop_perform.perform(spec("files_write", tmp_path / "new", content=""), expect="absent")
    assert appeared["ok"] is True  # absent as approved: created
    again = fileop_perform.perform(spec("files_write", tmp_path / "new", content="eA=="), expect="absent")
    assert again["error"]["code"] == "file_changed" and (tmp_path / "new").read_bytes() == b""
    ok = fileop_perform.perform(
        spec("files_write", target, content=base64.b64encode(b"new\n").decode()),
        expect=hashlib.sha256(b"changed\n").hexdigest(),
    )
    assert ok["ok"] is True and target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf", "new"]  # no temp file left behind


def test_a_catastrophic_regex_is_stopped_by_the_cpu_limit(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a" * 40 + "!\n")
    me = resolve_identity(os.geteuid())
    started = time.monotonic()
    out = asyncio.run(
        fileop_verbs.execute(spec("files_search", tmp_path, query="(a+)+$", regex=True), me, timeout=120, cpu_seconds=1)
    )
    assert out["error"]["code"] == "limit_exceeded"
    assert time.monotonic() - started < 60


def test_the_bound_pre_state_is_checked_before_it_is_enforced() -> None:
    assert fileop_verbs.bound_expectation(None) is None
    assert fileop_verbs.bound_expectation({"sha256": "absent"}) == "absent"
    assert fileop_verbs.bound_expectation({"sha256": "a" * 64}) == "a" * 64
    for bad in ({"sha256": "A" * 64}, {"sha256": None}, {"sha256": "a" * 64, "x": 1}, "absent", {"sha": "absent"}):
        with pytest.raises(AirlockError):
            fileop_verbs.bound_expectation(bad)


def test_the_entry_point_refuses_a_bad_request_and_answers_one_outcome(tmp_path: Path) -> None:
    argv = list(fileop_verbs.fileop_argv())
    bad = subprocess.run(argv, input=b'{"spec": {"kind": "exec"}}', capture_output=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == b"" and b"bad request" in bad.stderr
    (tmp_path / "f").write_text("hello\n")
    request = {
        "spec": spec("files_read", tmp_path / "f").to_dict(),
        "preview": False,
        "expect": None,
        "cpu_seconds": None,
    }
    good = subprocess.run(argv, input=json.dumps(request).encode(), capture_output=True, timeout=60)
    outcome = json.loads(good.stdout)
    assert good.returncode == 0 and base64.b64decode(outcome["content"]) == b"hello\n"


def test_a_write_to_a_long_multibyte_name_works(tmp_path: Path) -> None:
    target = tmp_path / ("é" * 127)  # 254 bytes: the temporary name must be cut by bytes
    assert run("files_write", target, content=base64.b64encode(b"x").decode())["ok"] is True
    assert target.read_bytes() == b"x"


def test_an_answer_over_the_output_cap_is_limit_exceeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f").write_bytes(b"x" * 4096)
    me = resolve_identity(os.geteuid())
    monkeypatch.setattr(fileop_verbs, "OUTPUT_CAP", 1024)
    out = asyncio.run(fileop_verbs.execute(spec("files_read", tmp_path / "f"), me, timeout=60))
    assert out["ok"] is False and out["error"]["code"] == "limit_exceeded" and "1024 bytes" in out["error"]["message"]
