"""fanotify exec events: parsing the kernel's records and one program per exec (issue 35)."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

from airlock.runner import fanotify
from airlock.runner.fanotify import FAN_OPEN_EXEC, FAN_Q_OVERFLOW, METADATA, Event, Follow, file_seen, parse_events


def _record(mask: int, fd: int, pid: int, extra: bytes = b"") -> bytes:
    return METADATA.pack(METADATA.size + len(extra), 3, 0, METADATA.size, mask, fd, pid) + extra


def test_events_are_parsed_as_the_kernel_lays_them_out() -> None:
    assert METADATA.size == 24  # struct fanotify_event_metadata
    buf = _record(FAN_OPEN_EXEC, 7, 1234) + _record(FAN_Q_OVERFLOW, -1, 0) + _record(FAN_OPEN_EXEC, 9, 5, b"\0" * 8)
    assert parse_events(buf) == [
        Event(FAN_OPEN_EXEC, 7, 1234),
        Event(FAN_Q_OVERFLOW, -1, 0),
        Event(FAN_OPEN_EXEC, 9, 5),
    ]


def test_a_short_tail_or_another_version_is_not_read_as_an_event() -> None:
    assert parse_events(_record(FAN_OPEN_EXEC, 7, 1)[:20]) == []
    assert parse_events(METADATA.pack(24, 2, 0, 24, FAN_OPEN_EXEC, 7, 1)) == []
    assert parse_events(struct.pack("=IBBHQii", 4, 3, 0, 24, FAN_OPEN_EXEC, 7, 1)) == []  # a length that cannot be


def _seen(path: str) -> fanotify.FileSeen:
    fd = os.open(path, os.O_RDONLY)
    try:
        seen = file_seen(fd)
    finally:
        os.close(fd)
    assert seen is not None
    return seen


def _loader() -> str:
    interp = _seen(os.path.realpath(shutil.which("id") or "/usr/bin/id")).interp
    assert interp is not None  # Debian's id is dynamically linked
    return interp


def test_the_event_file_names_its_identity_and_its_interpreter(tmp_path: Path) -> None:
    ident = os.path.realpath(shutil.which("id") or "/usr/bin/id")
    seen = _seen(ident)
    st = os.stat(ident)
    assert (seen.path, seen.dev, seen.ino, seen.size) == (ident, st.st_dev, st.st_ino, st.st_size)
    assert not seen.script and seen.interp is not None and "ld-linux" in seen.interp
    script = tmp_path / "s"
    script.write_text("#!/bin/sh -e\necho hi\n")
    assert (_seen(str(script)).script, _seen(str(script)).interp) == (True, "/bin/sh")
    (tmp_path / "data").write_bytes(b"\x7fELF" + b"\0" * 60)  # an ELF header that says nothing
    assert _seen(str(tmp_path / "data")).interp is None


def test_an_elf_programs_loader_is_the_same_exec_and_its_next_exec_is_new() -> None:
    follow = Follow()
    ident, loader = _seen(os.path.realpath("/usr/bin/id")), _seen(os.path.realpath(_loader()))
    assert follow.is_new_exec(10, ident, 0.0) is True
    assert follow.is_new_exec(10, loader, 0.001) is False  # ld.so of the same execve
    assert follow.is_new_exec(10, ident, 0.002) is True  # the same pid executing again (sh's exec)
    assert follow.is_new_exec(11, loader, 0.003) is True  # another pid's: not expected, so a program


def test_a_scripts_interpreter_and_its_loader_are_the_same_exec(tmp_path: Path) -> None:
    script = tmp_path / "s"
    script.write_text("#!/bin/sh\necho hi\n")
    follow = Follow()
    sh, loader = _seen(os.path.realpath("/bin/sh")), _seen(os.path.realpath(_loader()))
    assert follow.is_new_exec(20, _seen(str(script)), 0.0) is True
    assert follow.is_new_exec(20, sh, 0.001) is False
    assert follow.is_new_exec(20, loader, 0.002) is False
    assert follow.is_new_exec(20, sh, 0.003) is True  # then sh executes sh: a program of its own


def test_an_exec_that_failed_half_way_does_not_swallow_the_next_program() -> None:
    follow = Follow()
    ident, uname = _seen(os.path.realpath("/usr/bin/id")), _seen(os.path.realpath("/usr/bin/uname"))
    assert follow.is_new_exec(30, ident, 0.0) is True
    # Its loader never came (the exec failed); the next open by that pid is another program.
    assert follow.is_new_exec(30, uname, 0.001) is True
    # And an expectation goes stale: a loader open long after is a program (ld.so run by hand).
    loader = _seen(os.path.realpath(_loader()))
    assert follow.is_new_exec(30, loader, 5.0) is True


def test_show_says_the_tree_is_from_fanotify_and_names_what_exited_before_it_was_read() -> None:
    from airlock.cli.show import tree_lines

    ident = {"dev": 1, "ino": 2, "size": 3, "mtime": "t"}
    tree = {
        "source": "fanotify",
        "scope": "cgroup",
        "complete": True,
        "processes": [
            {"pid": 5, "parent": None, "argv": ["/tmp/job.sh"], "exe": "/tmp/job.sh", "exe_id": ident, "uid": 0}
            | {"euid": 0, "script": True, "interpreter": "/usr/bin/dash"},
            {"pid": 6, "parent": 0, "exe": "/usr/bin/id", "exe_id": ident, "exited_before_read": True},
        ],
        "more": 0,
        "ppid": "best effort",
    }
    lines = tree_lines(tree)
    assert "from fanotify exec opens, parents best effort" in lines[0]
    assert "via /usr/bin/dash uid 0]" in lines[1]
    assert lines[2].endswith("6 ?  [exited before it could be read; was /usr/bin/id dev 1 ino 2]"), lines
