"""runner/arguments.py: classify a root job's path arguments, check them again, seal scripts (root: real files)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from airlock.common.errors import AirlockError
from airlock.runner import arguments

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files owned by another uid need root")
OTHER = 64998


@pytest.fixture
def tree() -> Iterator[Path]:
    base = Path(f"/run/alarg-{os.getpid()}")
    base.mkdir(mode=0o755)
    (base / "agent").mkdir()
    os.chown(base / "agent", OTHER, OTHER)
    (base / "agent" / "task.sh").write_text("echo hi\n")
    (base / "agent" / "data").write_text("data\n")
    (base / "root.sh").write_text("echo root\n")
    yield base
    shutil.rmtree(base, ignore_errors=True)


def inspect(argv: list[str], cwd: str = "/", program: str = "/usr/bin/dash") -> list[dict[str, object]]:
    return arguments.inspect([argv], [program], cwd, cwd_given=cwd != "/")


def test_only_what_someone_else_can_change_is_returned(tree: Path) -> None:
    assert inspect(["sh", str(tree / "root.sh")]) == []
    [item] = inspect(["sh", str(tree / "agent" / "task.sh"), str(tree / "root.sh")])
    assert item["script"] is True and item["kind"] == "file" and item["index"] == 1
    assert item["sha256"] == hashlib.sha256(b"echo hi\n").hexdigest()
    assert item["changeable"] == {"path": str(tree / "agent"), "why": f"is owned by uid {OTHER}, not root"}


def test_relative_names_and_absent_paths(tree: Path) -> None:
    found = inspect(["cat", "data", "missing", "./new"], cwd=str(tree / "agent"), program="/usr/bin/cat")
    assert [(i["arg"], i["kind"], i["script"]) for i in found] == [("data", "file", False), ("./new", "absent", False)]


def test_check_passes_unchanged_and_returns_the_script_bytes(tree: Path) -> None:
    bound = inspect(["sh", str(tree / "agent" / "task.sh"), str(tree / "agent" / "data")])
    [script] = arguments.check(bound)
    assert (script.stage, script.index, script.data) == (0, 1, b"echo hi\n")


@pytest.mark.parametrize("how", ["rewrite", "replace", "remove"])
def test_check_refuses_a_changed_argument(tree: Path, how: str) -> None:
    target = tree / "agent" / "data"
    bound = inspect(["cat", str(target)], program="/usr/bin/cat")
    if how == "rewrite":
        target.write_text("other\n")
    elif how == "replace":
        (tree / "agent" / "new").write_text("data\n")
        os.rename(tree / "agent" / "new", target)
    else:
        target.unlink()
    with pytest.raises(AirlockError) as info:
        arguments.check(bound)
    assert info.value.code.value == "argument_changed" and info.value.details["path"] == str(target)


def test_check_refuses_an_absent_path_created_since(tree: Path) -> None:
    bound = inspect(["touch", str(tree / "agent" / "later")], program="/usr/bin/touch")
    assert bound[0]["kind"] == "absent"
    arguments.check(bound)
    (tree / "agent" / "later").write_text("")
    with pytest.raises(AirlockError, match="exists now"):
        arguments.check(bound)


def test_a_sealed_script_cannot_be_changed() -> None:
    fd = arguments.seal(arguments.Script(0, 1, b"echo sealed\n", ""))
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL
        with open(arguments.held_path(fd), "rb") as f:
            assert f.read() == b"echo sealed\n"
        with pytest.raises(PermissionError):
            os.write(fd, b"x")
    finally:
        os.close(fd)
