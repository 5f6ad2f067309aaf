"""Identity, environment and working-directory checks."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path
from typing import Any

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.resolve import ROOT_PATH, USER_PATH
from airlock.runner.identity import (
    Identity,
    build_env,
    check_cwd,
    check_executable,
    default_cwd,
    open_cwd,
    resolve_identity,
)

from runner_testlib import ScratchUser, needs_root

NOBODY = Identity(uid=65534, gid=65534, groups=(65534,), user="nobody", home="/nonexistent")


def test_resolve_root() -> None:
    root = resolve_identity(0)
    assert (root.uid, root.gid, root.user) == (0, 0, "root")
    assert 0 in root.groups


def test_resolve_unknown_uid() -> None:
    with pytest.raises(AirlockError) as caught:
        resolve_identity(3_999_999_999)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS
    assert "3999999999" in caught.value.message


def test_resolve_includes_supplementary_groups(test_user: ScratchUser) -> None:
    identity = test_user.identity
    assert identity.gid in identity.groups
    assert test_user.supplementary_gid in identity.groups


def test_env_is_built_from_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("LISTEN_FDS", "1")
    env = build_env(NOBODY, {}, {})
    assert env == {
        "HOME": "/nonexistent",
        "USER": "nobody",
        "LOGNAME": "nobody",
        "SHELL": NOBODY.shell,
        "PATH": USER_PATH,
    }
    assert build_env(resolve_identity(0), {}, {})["PATH"] == ROOT_PATH


def test_request_home_wins_and_protected_overrides() -> None:
    env = build_env(NOBODY, {"HOME": "/srv/x", "A": "request", "B": "b"}, {"A": "secret"})
    assert env["HOME"] == "/srv/x"
    assert env["A"] == "secret"
    assert env["B"] == "b"


@pytest.mark.parametrize("name", ["HOME", "PATH", "SHELL", "LD_PRELOAD", "BASH_ENV", "APT_CONFIG", "TZ", "LANG"])
@pytest.mark.parametrize("source", ["request", "protected"])
def test_a_root_job_refuses_what_env_reset_sets_or_a_dangerous_variable(name: str, source: str) -> None:
    # The runner's own re-check of intake's rule (defence in depth).
    given = {name: "/home/agent"}
    with pytest.raises(AirlockError) as caught:
        build_env(resolve_identity(0), given if source == "request" else {}, given if source == "protected" else {})
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS and caught.value.details == {"field": f"env.{name}"}
    root = build_env(resolve_identity(0), {}, {})
    assert root["HOME"] == pwd.getpwuid(0).pw_dir and root["SHELL"] == pwd.getpwuid(0).pw_shell


@pytest.mark.parametrize("name", ["NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_USEC"])
def test_service_manager_variables_are_refused(name: str) -> None:
    with pytest.raises(AirlockError) as caught:
        build_env(NOBODY, {name: "x"}, {})
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS
    assert name in caught.value.message


@pytest.mark.parametrize(("name", "value"), [("", "x"), ("A=B", "x"), ("A", "x\0y"), ("A", "\ud800"), ("\ud800", "x")])
def test_malformed_variables_are_refused(name: str, value: str) -> None:
    with pytest.raises(AirlockError) as caught:
        build_env(NOBODY, {name: value}, {})
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS


def test_default_cwd() -> None:
    assert default_cwd(resolve_identity(0)) == "/"
    assert default_cwd(NOBODY) == "/"  # /nonexistent does not exist
    assert default_cwd(Identity(1, 1, (1,), "x", "/tmp")) == "/tmp"


@pytest.mark.parametrize("cwd", ["relative/dir", "", "/a\0b", "/tmp/\ud800"])
def test_cwd_must_be_absolute(cwd: str) -> None:
    with pytest.raises(AirlockError) as caught:
        check_cwd(NOBODY, cwd)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS


def test_cwd_missing_or_not_a_directory(world_dir: str) -> None:
    with pytest.raises(AirlockError) as caught:
        check_cwd(NOBODY, f"{world_dir}/missing")
    assert caught.value.code is ErrorCode.SPAWN_FAILED
    assert "does not exist" in caught.value.message
    path = os.path.join(world_dir, "file")
    open(path, "w").close()
    with pytest.raises(AirlockError, match="is not a directory"):
        check_cwd(resolve_identity(0), path)


def test_root_enters_anything(world_dir: str) -> None:
    locked = os.path.join(world_dir, "locked")
    os.mkdir(locked, 0o000)
    check_cwd(Identity(0, 0, (0,), "root", "/root"), locked)


def _tree(world_dir: str, mode: int, gid: int = 0) -> str:
    needs_root()
    outer = os.path.join(world_dir, "outer")
    inner = os.path.join(outer, "inner")
    os.makedirs(inner)
    os.chmod(inner, 0o777)
    os.chown(outer, 0, gid)
    os.chmod(outer, mode)
    return inner


def test_every_component_needs_search_permission(world_dir: str) -> None:
    inner = _tree(world_dir, 0o700)
    with pytest.raises(AirlockError) as caught:
        check_cwd(NOBODY, inner)
    assert caught.value.code is ErrorCode.SPAWN_FAILED
    assert "no permission to enter" in caught.value.message and "outer" in caught.value.message
    assert "nobody" in caught.value.message


def test_other_search_bit_is_enough(world_dir: str) -> None:
    check_cwd(NOBODY, _tree(world_dir, 0o701))


def test_supplementary_group_grants_entry(world_dir: str, test_user: ScratchUser) -> None:
    inner = _tree(world_dir, 0o710, gid=test_user.supplementary_gid)
    check_cwd(test_user.identity, inner)
    with pytest.raises(AirlockError):
        check_cwd(NOBODY, inner)


def test_owner_bits_apply_to_the_owner_only(world_dir: str, test_user: ScratchUser) -> None:
    inner = _tree(world_dir, 0o070)  # group root: rwx, owner (root) and others nothing
    os.chown(os.path.dirname(inner), test_user.identity.uid, 0)
    with pytest.raises(AirlockError):
        check_cwd(test_user.identity, inner)  # owner bits are ---, group bits do not apply to the owner


def test_symlinks_are_followed(world_dir: str) -> None:
    inner = _tree(world_dir, 0o700)
    link = os.path.join(world_dir, "link")
    os.symlink(inner, link)
    with pytest.raises(AirlockError):
        check_cwd(NOBODY, link)
    open_dir = os.path.join(world_dir, "open")
    os.mkdir(open_dir, 0o755)
    relative = os.path.join(world_dir, "rel")
    os.symlink("open/../open", relative)
    check_cwd(NOBODY, relative)
    check_cwd(NOBODY, os.path.join(world_dir, ".", "open", "..", "open"))


def test_open_cwd_holds_the_directory_it_walked_to_whatever_the_path_names_later(world_dir: str) -> None:
    open_dir = os.path.join(world_dir, "open")
    os.mkdir(open_dir, 0o755)
    link = os.path.join(world_dir, "link")
    os.symlink("open", link)
    held = open_cwd(NOBODY, link)  # through a symlink: the directory it leads to
    try:
        assert (held.st.st_ino, held.real) == (os.stat(open_dir).st_ino, open_dir)
        os.rename(open_dir, open_dir + ".moved")
        os.mkdir(open_dir, 0o755)  # the path now names another directory ...
        assert os.stat(link).st_ino != held.st.st_ino
        # ... and the fd still holds the one checked, which is what a job enters.
        assert os.stat(f"/proc/self/fd/{held.fd}").st_ino == held.st.st_ino
        assert os.path.realpath(f"/proc/self/fd/{held.fd}") == open_dir + ".moved"
    finally:
        held.close()


def test_check_executable(world_dir: str, test_user: ScratchUser) -> None:
    tool = os.path.join(world_dir, "tool")
    open(tool, "w").close()
    os.chown(tool, 0, test_user.supplementary_gid)
    os.chmod(tool, 0o710)
    check_executable(test_user.identity, tool)  # through the supplementary group
    with pytest.raises(AirlockError, match="no permission to execute"):
        check_executable(NOBODY, tool)
    check_executable(resolve_identity(0), tool)
    os.chmod(tool, 0o600)
    with pytest.raises(AirlockError, match="no permission to execute"):
        check_executable(resolve_identity(0), tool)  # root too needs one x bit
    with pytest.raises(AirlockError, match="not a regular file"):
        check_executable(NOBODY, world_dir)
    locked = os.path.join(world_dir, "locked")
    os.mkdir(locked, 0o700)
    os.symlink("/bin/true", os.path.join(locked, "true"))
    with pytest.raises(AirlockError, match="no permission to enter"):
        check_executable(NOBODY, os.path.join(locked, "true"))


def test_identities_are_cached_until_passwd_or_group_change_or_the_ttl_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: one lookup per uid while the databases stay the same; an edit is seen at the next exec."""
    from airlock.runner import identity as ident

    passwd, group = tmp_path / "passwd", tmp_path / "group"
    passwd.write_text("a\n")
    group.write_text("b\n")
    monkeypatch.setattr(ident, "_DATABASES", (str(passwd), str(group)))
    monkeypatch.setattr(ident, "_cache", {})
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    lookups: list[int] = []
    real = ident._lookup_identity

    def counted(uid: int) -> Any:
        lookups.append(uid)
        return real(uid)

    monkeypatch.setattr(ident, "_lookup_identity", counted)
    first = ident.resolve_identity(0)
    assert ident.resolve_identity(0) is first and lookups == [0]
    group.write_text("b\nwheel:x:10:someone\n")  # gpasswd -a: the next resolve looks again
    assert ident.resolve_identity(0) == first and lookups == [0, 0]
    assert ident.resolve_identity(0) is not None and lookups == [0, 0]
    clock[0] += ident.IDENTITY_TTL_SECONDS - 0.1
    ident.resolve_identity(0)
    assert lookups == [0, 0]  # still fresh
    clock[0] += 0.2
    ident.resolve_identity(0)
    assert lookups == [0, 0, 0]  # expired: looked up again
