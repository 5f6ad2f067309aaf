"""fanotify exec events: parsing the kernel's records and one program per exec (issue 35)."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Any

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


def test_every_mount_a_program_can_run_from_is_marked_and_none_other() -> None:
    """Issue 51: tmpfs /dev/shm and /run are filesystems a job can execute from; noexec and /proc are not."""
    info = (
        b"22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
        b"23 22 0:5 / /dev/shm rw,nosuid,nodev shared:2 - tmpfs tmpfs rw\n"
        b"24 22 0:24 / /run rw,nosuid,nodev shared:3 - tmpfs tmpfs rw,mode=755\n"
        b"25 22 0:25 / /run/lock rw,nosuid,nodev,noexec shared:4 - tmpfs tmpfs rw\n"
        b"26 22 0:4 / /proc rw,nosuid,nodev - proc proc rw\n"
        b"27 22 0:40 / /mnt/with\\040space rw - tmpfs tmpfs rw\n"
        b"garbage line\n"
    )
    assert fanotify.exec_mounts(info) == [
        (os.makedev(254, 1), "/"),
        (os.makedev(0, 5), "/dev/shm"),
        (os.makedev(0, 24), "/run"),
        (os.makedev(0, 40), "/mnt/with space"),
    ]


def test_a_tree_says_why_it_is_incomplete_and_what_no_mark_covers() -> None:
    from airlock.cli.show import tree_lines
    from airlock.runner.execwatch import Watch, settle_unwatched

    w = Watch(units=("airlock-job-x.service",))
    w.source = "fanotify"
    w.unwatched = dict(fanotify.BLIND)
    ident = {"dev": 1, "ino": 2, "size": 3, "mtime": "t"}
    # The event was the program's ld.so; /proc/PID/exe named a memfd, which no mark covers.
    entry: dict[str, Any] = {"pid": 7, "parent": None, "exe": "/usr/lib/ld-linux.so.2", "not_read": "x"}
    entry["unwatched_exe"] = {"argv": ["payload"], "exe": "/memfd:payload (deleted)", "exe_id": ident, "uid": 0}
    w.execs.append(entry)
    settle_unwatched(entry, w)
    assert entry["exe"] == "/memfd:payload (deleted)" and entry["unwatched"] is True and "not_read" not in entry
    assert entry["opened"] == "/usr/lib/ld-linux.so.2"
    record = w.record(1 << 16)
    assert record["complete"] is False and record["unwatched"] == fanotify.BLIND
    assert record["incomplete"] == ["/memfd:payload (deleted) was executed from a filesystem that is not watched"]
    lines = tree_lines(record)
    assert "INCOMPLETE: /memfd:payload (deleted) was executed from a filesystem that is not watched" in lines[0]
    assert any(line.startswith("  not watched: memfd: programs run from a memfd") for line in lines), lines
    assert "ino 2 NOT WATCHED: its filesystem has no mark uid 0" in lines[-1], lines
    # Control: a program read through its own event is not flagged, and each reason is said once.
    plain: dict[str, Any] = {"pid": 8, "parent": None, "exe": "/usr/bin/id", "argv": ["id"]}
    settle_unwatched(plain, w)
    assert "unwatched" not in plain
    w.miss("events were lost")
    w.miss("events were lost")
    assert w.record(1 << 16)["incomplete"][-1:] == ["events were lost"] and len(w.missed) == 2
