"""Writes keep what protects a file (ACL, xattrs), and diffs never hide a byte-level change (issue 39)."""

from __future__ import annotations

import base64
import errno
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airlock.common.fileop_spec import FileSpec
from airlock.runner import fileop_diff, fileop_perform, fileop_write

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="keeping owners and security.* attributes needs root")
needs_acl = pytest.mark.skipif(
    shutil.which("setfacl") is None or shutil.which("getfacl") is None,
    reason="setfacl/getfacl missing (Debian package acl, in the Makefile's DEB_PACKAGES)",
)


def write(path: Path, content: bytes, **params: Any) -> dict[str, Any]:
    spec = FileSpec(
        tool="files_write",
        path=str(path),
        privileged=True,
        uid=0,
        params={"content": base64.b64encode(content).decode()} | params,
    )
    return fileop_perform.perform(spec)


def preview(path: Path, content: bytes) -> dict[str, Any]:
    spec = FileSpec(
        tool="files_write",
        path=str(path),
        privileged=True,
        uid=0,
        params={"content": base64.b64encode(content).decode()},
    )
    return fileop_perform.perform(spec, preview_only=True)


def getfacl(path: Path) -> str:
    return subprocess.run(
        ["getfacl", "--absolute-names", "--omit-header", "--numeric", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def setfacl(*args: str) -> None:
    subprocess.run(["setfacl", *args], check=True, capture_output=True)


@needs_root
@needs_acl
def test_a_replaced_file_keeps_its_acl_and_its_group_stays_masked(tmp_path: Path) -> None:
    target = tmp_path / "secret.conf"
    target.write_bytes(b"old\n")
    os.chown(target, 0, 4)  # root:adm
    os.chmod(target, 0o640)
    # The owning group may not read; one named user may: the group bits of the mode are the mask (r).
    setfacl("-m", "g::---,u:65534:r,m::r", str(target))
    acl_before, mode_before = getfacl(target), stat.S_IMODE(target.stat().st_mode)
    assert "group::---" in acl_before and mode_before == 0o640
    out = write(target, b"new\n")
    assert out["ok"] is True, out
    assert target.read_bytes() == b"new\n"
    assert getfacl(target) == acl_before
    st = target.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 0, 4)


@needs_root
def test_user_and_security_attributes_are_kept_capabilities_are_not(tmp_path: Path) -> None:
    target = tmp_path / "labelled"
    target.write_bytes(b"old")
    os.setxattr(target, "user.origin", b"vendor")
    os.setxattr(target, "security.airlock-test", b"label")
    # A file capability is privilege for the old content, dropped like the setuid bit.
    os.setxattr(target, "security.capability", bytes.fromhex("0100000200100000000000000000000000000000"))
    out = write(target, b"new")
    assert out["ok"] is True, out
    assert os.getxattr(target, "user.origin") == b"vendor"
    assert os.getxattr(target, "security.airlock-test") == b"label"
    assert "security.capability" not in os.listxattr(target)


@needs_root
@needs_acl
def test_a_new_file_gets_the_directory_default_acl_not_a_wider_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    setfacl("-d", "-m", "u::rw,g::---,o::---,u:65534:r", str(shared))
    out = write(shared / "new.conf", b"x")
    assert out["ok"] is True, out
    acl = getfacl(shared / "new.conf")
    # As open(O_CREAT, 0644) gets it: other has nothing, as the default ACL says (the old fchmod gave r).
    assert "other::---" in acl and "user:65534:r--" in acl, acl
    assert stat.S_IMODE((shared / "new.conf").stat().st_mode) & 0o007 == 0
    # Control: without a default ACL the umask applies, as before.
    plain = write(tmp_path / "plain.conf", b"x")
    assert plain["ok"] is True and stat.S_IMODE((tmp_path / "plain.conf").stat().st_mode) == 0o644


@needs_root
@needs_acl
def test_a_file_without_an_acl_does_not_get_the_directorys_default(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "plain"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    setfacl("-d", "-m", "u:65534:rw", str(shared))  # after the file was made: it has no ACL
    assert fileop_write._ACL not in os.listxattr(target)
    assert write(target, b"new")["ok"] is True
    assert fileop_write._ACL not in os.listxattr(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@needs_root
@needs_acl
def test_an_inherited_acl_that_cannot_be_removed_refuses_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "plain"
    target.write_bytes(b"old")
    setfacl("-d", "-m", "u:65534:rw", str(shared))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "removexattr", refuse)
    out = write(target, b"new")
    assert out["ok"] is False and out["error"]["code"] == "metadata_not_kept", out
    assert target.read_bytes() == b"old" and fileop_write._ACL not in os.listxattr(target)
    assert sorted(p.name for p in shared.iterdir()) == ["plain"]


@needs_root
def test_an_attribute_the_filesystem_refuses_refuses_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    os.setxattr(target, "user.keep", b"1")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "setxattr", refuse)
    out = write(target, b"new")
    assert out["ok"] is False and out["error"]["code"] == "metadata_not_kept", out
    assert "user.keep" in out["error"]["message"] and "nothing was written" in out["error"]["message"]
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    # Control: with the attribute gone there is nothing to keep, and the same write is made.
    os.removexattr(target, "user.keep")
    assert write(target, b"new")["ok"] is True and target.read_bytes() == b"new"


# --- diffs ----------------------------------------------------------------------------------


def test_a_change_of_bytes_that_are_not_utf8_is_a_binary_change_never_an_empty_diff(tmp_path: Path) -> None:
    target = tmp_path / "blob"
    target.write_bytes(b"head \xff\xfe tail\n")
    out = preview(target, b"head \xff\xfd tail\n")
    assert out["ok"] is True, out
    diff = out["diff"]
    assert out["before_sha256"] != out["after_sha256"]
    assert "binary change (not UTF-8 text): 13 -> 13 bytes; from byte 6 (0x6), 1 bytes replaced by 1" in diff
    assert "-00000000  68 65 61 64 20 ff fe 20" in diff and "+00000000  68 65 61 64 20 ff fd 20" in diff
    # Control: the old decoding (errors="replace") made both sides the same text: no diff at all.
    assert target.read_bytes().decode("utf-8", "replace") == b"head \xff\xfd tail\n".decode("utf-8", "replace")


def test_binary_excerpts_are_bounded_and_say_what_is_left_out() -> None:
    before, after = bytes(range(256)) * 4, bytes(range(256)) * 2 + b"\x00" * 512
    diff = fileop_diff.unified_diff("/b", before, after)
    assert "from byte 513 (0x201), 511 bytes replaced by 511" in diff
    rows = diff.splitlines()
    assert [r[:9] for r in rows if r[:1] in "-+" and "  " in r][:2] == ["-00000200", "-00000210"]
    assert "[448 more changed bytes]" in diff and len(diff) < 2000


def test_a_new_binary_file_and_text_diffs() -> None:
    created = fileop_diff.unified_diff("/n", None, b"\x00\xff")
    assert created.startswith("--- /dev/null\n+++ /n\n") and "+00000000  00 ff" in created
    # Text stays a unified diff; a missing last newline is marked, not run into the next line.
    text = fileop_diff.unified_diff("/t", b"a\nb\n", b"a\nb")
    assert text.endswith("-b\n+b\n\\ No newline at end of file\n"), text
    assert fileop_diff.unified_diff("/t", b"same\n", b"same\n") == ""
