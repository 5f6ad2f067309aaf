"""A binary's identity (common/binary.py) and the root job environment rule (common/envrule.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from airlock.common import binary, envrule
from airlock.common.errors import AirlockError, ErrorCode


def _stat(uid: int = 0, mode: int = 0o100755) -> os.stat_result:
    return os.stat_result((mode, 1, 2, 1, uid, 0, 0, 0, 0, 0))


# --- comparing identities -------------------------------------------------------


def test_same_file_matches() -> None:
    bound = {"path": "/usr/bin/true", "dev": 2, "ino": 1}
    assert binary.mismatch(bound, {"path": "/usr/bin/true", "dev": 2, "ino": 1}) == []


@pytest.mark.parametrize("field", ["dev", "ino", "uid", "mode", "path"])
def test_any_changed_field_is_named(field: str) -> None:
    bound = {"path": "/usr/bin/true", "dev": 2, "ino": 1, "uid": 0, "mode": 0o100755}
    now = dict(bound) | {field: "/usr/bin/false" if field == "path" else 99}
    assert binary.mismatch(bound, now) == [field]


def test_an_unprivileged_binding_does_not_cover_a_root_job() -> None:
    # Bound without owner and mode (an unprivileged job), presented for a root one.
    assert binary.mismatch(
        {"path": "/x", "dev": 2, "ino": 1}, {"path": "/x", "dev": 2, "ino": 1, "uid": 0, "mode": 1}
    ) == [
        "uid",
        "mode",
    ]


def test_identity_of_records_owner_and_mode_only_for_root_jobs() -> None:
    st = _stat(uid=0)
    assert binary.identity_of("/x", st, privileged=False) == {"path": "/x", "dev": 2, "ino": 1}
    assert binary.identity_of("/x", st, privileged=True) == {
        "path": "/x",
        "dev": 2,
        "ino": 1,
        "uid": 0,
        "mode": 0o100755,
    }


@pytest.mark.parametrize(
    "bound",
    [
        None,
        [],
        [{"path": "/x", "dev": 1}],
        [{"path": "/x", "dev": True, "ino": 1}],
        ["x"],
        [{"path": 1, "dev": 1, "ino": 1}],
    ],
)
def test_parse_bound_refuses_what_is_not_one_identity_per_stage(bound: object) -> None:
    with pytest.raises(AirlockError) as caught:
        binary.parse_bound(bound, 1)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS


# --- who may change a root job's binary ----------------------------------------------


def test_trust_rules() -> None:
    assert binary.trust_problem(_stat(0, stat.S_IFREG | 0o755), is_dir=False) is None
    assert "owned by uid 1000" in str(binary.trust_problem(_stat(1000, stat.S_IFREG | 0o755), is_dir=False))
    assert "writable by its group" in str(binary.trust_problem(_stat(0, stat.S_IFREG | 0o775), is_dir=False))
    assert "writable by others" in str(binary.trust_problem(_stat(0, stat.S_IFDIR | 0o757), is_dir=True))
    # /tmp: sticky, so a root-owned entry in it cannot be renamed or removed by others.
    sticky = _stat(0, stat.S_IFDIR | 0o1777)
    assert binary.trust_problem(sticky, is_dir=True, next_owner=0) is None
    assert binary.trust_problem(sticky, is_dir=True, next_owner=1000) is not None


# --- opening the binary ------------------------------------------------------------------


def test_open_binary_opens_the_canonical_file() -> None:
    real = os.path.realpath("/usr/bin/true")
    fd, st = binary.open_binary(real, trusted=True)
    try:
        assert (st.st_dev, st.st_ino) == (os.stat(real).st_dev, os.stat(real).st_ino)
    finally:
        os.close(fd)


def test_a_symlink_on_the_path_is_a_change(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "tool-link").symlink_to(tmp_path / "real" / "tool")
    for path in (tmp_path / "link" / "tool", tmp_path / "tool-link", tmp_path / "gone"):
        with pytest.raises(AirlockError) as caught:
            binary.open_binary(str(path), trusted=False)
        assert caught.value.code is ErrorCode.BINARY_CHANGED


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own a file by another uid")
def test_a_root_job_refuses_a_binary_others_can_change(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    os.chmod(tool, 0o757)
    with pytest.raises(AirlockError) as caught:
        binary.open_binary(str(tool), trusted=True)
    assert caught.value.code is ErrorCode.UNSAFE_BINARY and caught.value.details["path"] == str(tool)
    os.chmod(tool, 0o755)
    os.chown(tool, 65534, 0)
    with pytest.raises(AirlockError) as caught:
        binary.open_binary(str(tool), trusted=True)
    assert caught.value.code is ErrorCode.UNSAFE_BINARY
    fd, _ = binary.open_binary(str(tool), trusted=False)  # an unprivileged job may run it
    os.close(fd)


# --- the environment of a root job -------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PERL5OPT",
        "BASH_ENV",
        "ENV",
        "IFS",
        "GCONV_PATH",
        "GIT_CONFIG_GLOBAL",
        "BASH_FUNC_x%%",
    ],
)
def test_root_jobs_refuse_variables_that_change_what_runs(name: str) -> None:
    assert envrule.refusal(name) is not None


@pytest.mark.parametrize("name", ["LANG", "LC_ALL", "TZ", "TERM", "DEBIAN_FRONTEND", "MY_SETTING"])
def test_ordinary_variables_pass(name: str) -> None:
    assert envrule.refusal(name) is None


# --- a path that changes while it is resolved -----------------------------------------


def test_a_racing_path_is_refused_not_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from airlock.approval import match
    from airlock.common import resolve

    def racing(path: str) -> str:
        raise OSError(22, "Invalid argument")  # readlink after the link became a file

    monkeypatch.setattr(os.path, "realpath", racing)
    assert resolve.resolve_executable("/usr/bin/true", "") is None  # policy: unresolved, denied
    with pytest.raises(AirlockError) as caught:
        match.canonical_head("/etc/hostname")
    assert (
        caught.value.code is ErrorCode.INVALID_ARGUMENTS
        and "changed while it was being resolved" in caught.value.message
    )
