"""sudo's command line read with sudo's own rules (cli/sudoargs.py, issue 48): pure, no stack."""

from __future__ import annotations

import pytest

from airlock.cli import sudoargs
from airlock.cli.sudoargs import Invocation, Refusal, parse


def test_options_stop_at_the_first_word_that_is_not_one() -> None:
    inv = parse(["-n", "ls", "-la", "/root"])
    assert inv == Invocation("run", command=("ls", "-la", "/root"), non_interactive=True)


@pytest.mark.parametrize(
    "line",
    [
        ["-u", "postgres", "id"],
        ["-upostgres", "id"],
        ["--user", "postgres", "id"],
        ["--user=postgres", "id"],
        ["--us=postgres", "id"],
        ["-nupostgres", "id"],
    ],
)
def test_a_value_attached_separate_or_long(line: list[str]) -> None:
    assert parse(line).user == "postgres" and parse(line).command == ("id",)


def test_clustered_switches_and_the_end_of_options() -> None:
    inv = parse(["-EHn", "--", "-weird", "arg"])
    assert inv.preserve_env and inv.set_home and inv.non_interactive and inv.command == ("-weird", "arg")


def test_variable_words_before_the_command_are_its_environment() -> None:
    inv = parse(["DEBIAN_FRONTEND=noninteractive", "LC_ALL=C", "apt-get", "install", "X=1"])
    assert inv.env == (("DEBIAN_FRONTEND", "noninteractive"), ("LC_ALL", "C"))
    assert inv.command == ("apt-get", "install", "X=1")


def test_preserve_env_with_and_without_a_list() -> None:
    assert parse(["-E", "env"]).preserve_env
    inv = parse(["--preserve-env=TZ,LANG", "--preserve-env=TERM", "env"])
    assert not inv.preserve_env and inv.preserve_names == ("TZ", "LANG", "TERM")


@pytest.mark.parametrize(("value", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("1h30m", 5400), ("2d", 172800)])
def test_command_timeout_spans(value: str, seconds: int) -> None:
    assert parse(["-T", value, "sleep", "1"]).timeout_seconds == seconds


@pytest.mark.parametrize(
    ("line", "mode"),
    [
        (["-h"], "help"),
        (["-V"], "version"),
        (["-K"], "reset"),
        (["-k"], "reset"),
        (["-v"], "validate"),
        (["-l"], "list"),
        (["-ll", "id"], "list"),
        (["-e", "/etc/x"], "edit"),
    ],
)
def test_modes(line: list[str], mode: str) -> None:
    assert parse(line).mode == mode


def test_sudoedit_is_sudo_e_and_list_counts() -> None:
    assert parse(["/etc/hosts"], program="sudoedit") == Invocation("edit", command=("/etc/hosts",))
    assert parse(["-l", "-l", "id"]).list_level == 2


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (["-i"], "no login shells"),
        (["-s"], "no interactive shells"),
        (["-S", "id"], "there is no password"),
        (["-b", "id"], "sudo CMD &"),
        (["su", "-"], "does not switch users"),
        (["/bin/su", "postgres"], "does not switch users"),
        (["-Z", "id"], "invalid option -- 'Z'"),
        (["--frobnicate", "id"], "unrecognized option '--frobnicate'"),
        (["--pre", "id"], "ambiguous option '--pre'"),
        (["-u"], "option requires an argument -- 'u'"),
        (["-T", "soon", "id"], "invalid timeout value"),
        (["-V", "id"], "take no other options"),
        (["-e", "-l", "x"], "Only one of"),
        ([], "a command is required"),
    ],
)
def test_refusals_in_sudo_style(line: list[str], words: str) -> None:
    with pytest.raises(Refusal) as refused:
        parse(line)
    printed = "\n".join(refused.value.lines())
    assert printed.startswith("sudo: ") and words in printed


def test_every_refused_option_says_what_airlock_does_instead() -> None:
    for short, long, _arg, what in sudoargs.OPTIONS:
        if what.startswith("refuse:"):
            reason = what.split(":", 2)[2]
            assert len(reason) > 20, (short, long)


@pytest.mark.parametrize(
    ("command", "needs"),
    [
        (("bash",), True),
        (("sh", "-l"), True),
        (("vim", "/etc/hosts"), True),
        (("bash", "-c", "ls"), False),
        (("bash", "script.sh"), False),
        (("ls",), False),
        (("sh", "-ec", "ls"), False),
    ],
)
def test_what_needs_a_terminal(command: tuple[str, ...], needs: bool) -> None:
    assert (sudoargs.needs_terminal(command) is not None) is needs
