"""common/arguments.py: which argv elements of a root job may name a path, and the bound list read back."""

from __future__ import annotations

from typing import Any

import pytest

from airlock.common.arguments import Candidate, candidates, describe, parse_bound, worth_inspecting
from airlock.common.errors import AirlockError


def texts(argv: list[str], program: str = "/usr/bin/x", cwd_given: bool = False) -> list[tuple[str, bool, bool]]:
    return [(c.text, c.option, c.script) for c in candidates([argv], [program], cwd_given=cwd_given)]


def test_true_alone_costs_nothing() -> None:
    assert not worth_inspecting([["true"]], ["/usr/bin/true"], cwd_given=False)
    assert not worth_inspecting([["systemctl", "status", "cron"]], ["/usr/bin/systemctl"], cwd_given=False)


def test_paths_and_option_values() -> None:
    argv = ["tar", "-xf", "/home/a/f.tar", "--directory=/srv/x", "-I/home/a/inc", "word", "rel/p", "-v"]
    assert texts(argv) == [
        ("/home/a/f.tar", False, False),
        ("/srv/x", True, False),
        ("/home/a/inc", True, False),
        ("rel/p", False, False),
    ]


def test_bare_words_count_where_the_request_chose_its_folder() -> None:
    assert texts(["cat", "notes"], cwd_given=True) == [("notes", False, False)]
    assert texts(["cat", "notes"]) == []


def test_an_interpreters_operands_may_be_its_script() -> None:
    assert texts(["sh", "task.sh", "arg"], "/usr/bin/dash") == [("task.sh", False, True), ("arg", False, True)]
    assert texts(["python3", "-W", "ignore", "/h/x.py"], "/usr/bin/python3.11") == [
        ("ignore", False, True),
        ("/h/x.py", False, True),
    ]


@pytest.mark.parametrize(
    "argv",
    [["sh", "-c", "echo hi", "/h/x"], ["bash", "-ec", "echo", "/h/x"], ["python3", "-m", "http.server", "/h/x"]],
)
def test_command_mode_has_no_script(argv: list[str]) -> None:
    assert all(not script for _t, _o, script in texts(argv, f"/usr/bin/{argv[0]}"))


def test_the_program_text_of_command_mode_is_not_a_path() -> None:
    assert texts(["sh", "-c", "cat /etc/x", "/h/x"], "/usr/bin/dash", cwd_given=True) == [("/h/x", False, False)]
    assert texts(["python3", "-c", "import os; os.remove('/h/y')"], "/usr/bin/python3.11") == []


def test_a_wrappers_first_path_may_be_a_script_if_it_starts_with_shebang() -> None:
    found = candidates([["timeout", "5", "/h/x.sh"]], ["/usr/bin/timeout"], cwd_given=False)
    assert found == [Candidate(0, 2, "/h/x.sh", option=False, script=True, exec_only=True)]


def test_too_many_is_refused() -> None:
    with pytest.raises(AirlockError, match="at most"):
        candidates([["cat", *[f"/f{i}" for i in range(1025)]]], ["/usr/bin/cat"], cwd_given=False)


GOOD: dict[str, Any] = {
    "stage": 0,
    "index": 1,
    "arg": "/h/x.sh",
    "path": "/h/x.sh",
    "kind": "file",
    "script": True,
    "dev": 1,
    "ino": 2,
    "sha256": "a" * 64,
    "changeable": {"path": "/h", "why": "is owned by uid 1000, not root"},
}


def test_parse_bound_accepts_what_the_runner_returns() -> None:
    assert parse_bound([GOOD], [["sh", "/h/x.sh"]]) == [GOOD]
    assert parse_bound(None, [["sh"]]) == []


@pytest.mark.parametrize(
    "change",
    [
        {"stage": 1},
        {"index": 0},
        {"index": True},
        {"path": "rel"},
        {"kind": "fifo"},
        {"dev": None},
        {"sha256": None},
        {"arg": "/h/other.sh"},
    ],
)
def test_parse_bound_refuses_what_does_not_fit_the_spec(change: dict[str, Any]) -> None:
    with pytest.raises(AirlockError) as info:
        parse_bound([GOOD | change], [["sh", "/h/x.sh"]])
    assert info.value.code.value == "invalid_arguments"


def test_describe_flags_what_and_who() -> None:
    assert describe(GOOD) == (
        "stage 1 arg 1 /h/x.sh (script, sha256 aaaaaaaaaaaaaaaa, changeable: /h is owned by uid 1000, not root)"
    )
