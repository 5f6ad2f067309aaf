"""common/pathtrust.py and common/interp.py: who besides root can change a path, and a root job's interpreter chain.

Root builds the trees (files owned by a uid that is nobody's, modes set); skipped without root.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from airlock.common import binary, interp, pathtrust
from airlock.common.errors import AirlockError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="building trees owned by another uid needs root")
OTHER = 64999  # nobody's uid: "someone else"


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(f"/run/alpt-{os.getpid()}")  # root's, 0755, no sticky folder above it
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def found(path: Path | str) -> pathtrust.Found:
    f = pathtrust.walk(str(path))
    f.close()
    return f


def test_root_only_file(base: Path) -> None:
    (base / "f").write_text("x")
    f = found(base / "f")
    assert f.problem is None and f.st is not None and f.real == f"{base}/f"


def test_a_folder_of_someone_else_is_named(base: Path) -> None:
    (base / "d").mkdir()
    (base / "d" / "f").write_text("x")
    os.chown(base / "d", OTHER, OTHER)
    f = found(base / "d" / "f")
    assert f.problem == (f"{base}/d", f"is owned by uid {OTHER}, not root")


def test_group_writable_file_is_named(base: Path) -> None:
    (base / "f").write_text("x")
    os.chmod(base / "f", 0o664)
    assert found(base / "f").problem == (f"{base}/f", "is writable by its group (mode 0664)")


def test_a_symlink_is_followed_and_its_target_folder_counts(base: Path) -> None:
    (base / "d").mkdir()
    (base / "d" / "f").write_text("x")
    os.chown(base / "d", OTHER, OTHER)
    os.symlink(f"{base}/d/f", base / "link")
    f = found(base / "link")
    assert f.real == f"{base}/d/f" and f.problem is not None and f.problem[0] == f"{base}/d"
    os.symlink("d/../f2", base / "rel")
    (base / "f2").write_text("y")
    g = found(base / "rel")
    # Passing through d and back (d/..) reads no entry of d: its owner cannot redirect that.
    assert g.real == f"{base}/f2" and g.problem is None


def test_absent_names_count_the_folder_they_would_be_created_in(base: Path) -> None:
    assert found(base / "nothing").problem is None and found(base / "nothing").fd is None
    (base / "d").mkdir()
    os.chown(base / "d", OTHER, OTHER)
    assert found(base / "d" / "nothing").problem == (f"{base}/d", f"is owned by uid {OTHER}, not root")
    assert found("/tmp/alpt-absent-" + os.urandom(4).hex()).problem is not None  # anyone may create it in /tmp


def test_a_symlink_loop_is_an_error(base: Path) -> None:
    os.symlink("b", base / "a")
    os.symlink("a", base / "b")
    with pytest.raises(pathtrust.WalkError):
        pathtrust.walk(str(base / "a"))


def _check(path: Path) -> None:
    fd, _st = binary.open_binary(str(path), trusted=True)
    try:
        interp.check(str(path), fd)
    finally:
        os.close(fd)


def _script(path: Path, first_line: str) -> None:
    path.write_text(f"{first_line}\nexit 0\n")
    path.chmod(0o755)


def test_interpreter_under_someone_elses_folder_is_unsafe(base: Path) -> None:
    (base / "app").mkdir()
    shutil.copy("/usr/bin/dash", base / "app" / "sh")
    os.chown(base / "app", OTHER, OTHER)
    _script(base / "tool", f"#!{base}/app/sh -e")
    with pytest.raises(AirlockError) as info:
        _check(base / "tool")
    assert info.value.code.value == "unsafe_binary" and info.value.details["path"] == f"{base}/app"
    _script(base / "good", "#!/bin/sh")
    _check(base / "good")  # the control: a root-owned interpreter


def test_nested_interpreters_are_walked_and_bounded(base: Path) -> None:
    (base / "app").mkdir()
    os.chown(base / "app", OTHER, OTHER)
    _script(base / "inner", f"#!{base}/app/python3")  # the second level names someone else's folder
    _script(base / "outer", f"#!{base}/inner")
    with pytest.raises(AirlockError) as info:
        _check(base / "outer")
    assert info.value.details["path"] == f"{base}/app"
    previous = "/bin/sh"
    for level in range(6):
        _script(base / f"l{level}", f"#!{previous}")
        previous = f"{base}/l{level}"
    with pytest.raises(AirlockError) as info:
        _check(base / "l5")
    assert "levels deep" in info.value.message


def test_relative_interpreter_is_unsafe(base: Path) -> None:
    _script(base / "tool", "#!sh")
    with pytest.raises(AirlockError, match="not an absolute path"):
        _check(base / "tool")


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build an ELF with a RUNPATH")
def test_runpath_is_walked_with_origin_expanded(base: Path) -> None:
    import subprocess

    src = base / "m.c"
    src.write_text("int main(void) { return 0; }\n")
    (base / "lib").mkdir()
    subprocess.run(["cc", "-o", str(base / "ok"), str(src), "-Wl,-rpath,$ORIGIN/lib:/nonexistent/x"], check=True)
    _check(base / "ok")  # root's folders, and an absent one only root could create
    os.chown(base / "lib", OTHER, OTHER)
    with pytest.raises(AirlockError) as info:
        _check(base / "ok")
    assert info.value.details["path"] == f"{base}/lib" and "RUNPATH" in info.value.message
