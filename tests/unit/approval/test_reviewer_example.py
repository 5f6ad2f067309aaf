"""The shipped example reviewer reads journalctl's argv as journalctl does (issue 45 item 4).

journalctl parses its arguments with getopt_long: any unambiguous abbreviation of a long option is
that option, short options combine, values attach.  Every abbreviation of every option the example
does not allow (what writes, deletes, follows forever or reads another root), in every form, must
leave the request to a person; the example's resolution is checked against the real journalctl of
this machine (systemd 252 on Debian 12), whose getopt error names the option it resolved (no
side effect: it exits before acting).  Controls: the read-only requests, abbreviated too, are allowed.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airlock.approval import reviewer

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "reviewer-example.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reviewer_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EX = _load()
NOT_READ_ONLY = sorted(set(EX.JOURNALCTL_LONG) - EX.JOURNALCTL_READ_ONLY)
WRITING = ["rotate", "vacuum-size", "vacuum-files", "vacuum-time", "flush", "sync", "relinquish-var"]
WRITING += ["smart-relinquish-var", "setup-keys", "update-catalog", "cursor-file"]


def says(argv: list[str]) -> str:
    statement: dict[str, Any] = reviewer.statement(
        request_id="r-1",
        request={"reason": "look"},
        spec={"stages": [argv], "privileged": True},
        peer={"uid": 1000, "user": "agent", "groups": []},
        run_as={"uid": 0, "user": "root"},
        policy={"stages": [{"resolved": "/usr/bin/" + argv[0]}]},
        rule="ops-reads",
        may="allow",
        bound={},
    )
    decision, _reason = EX.answer(statement)
    return str(decision)


def abbreviations(name: str) -> list[str]:
    """Every spelling getopt_long reads as ``--name``: the name, and each prefix no other option shares."""
    return [name[:n] for n in range(1, len(name) + 1) if name[:n] == name or not _taken(name[:n], name)]


def _taken(prefix: str, name: str) -> bool:
    """Whether ``prefix`` is another option's exact name or also a prefix of another option."""
    return prefix in EX.JOURNALCTL_LONG or any(o.startswith(prefix) for o in EX.JOURNALCTL_LONG if o != name)


def test_the_writing_options_are_outside_the_allowlist() -> None:
    assert set(WRITING) <= set(NOT_READ_ONLY)
    for name in ("follow", "directory", "file", "root", "image", "machine"):
        assert name in NOT_READ_ONLY


@pytest.mark.parametrize("name", NOT_READ_ONLY)
def test_every_abbreviation_of_every_option_not_allowed_asks(name: str) -> None:
    takes = EX.JOURNALCTL_LONG[name]
    spellings = abbreviations(name)
    assert spellings and spellings[-1] == name
    for abbr in spellings:
        forms = [[f"--{abbr}=/tmp/x"], [f"--{abbr}", "/tmp/x"]] if takes else [[f"--{abbr}"]]
        for form in forms:
            for around in ([], ["-u", "nginx"], ["_PID=1"], ["-r"]):
                argv = ["journalctl", *around, *form]
                assert EX.getopt_long(argv[1:], EX.JOURNALCTL_SHORT, EX.JOURNALCTL_LONG) is not None, argv
                assert says(argv) == "ask", argv
                assert says(["journalctl", *form, *around]) == "ask", argv


@pytest.mark.parametrize(
    "argv",
    [
        ["journalctl", "-rD", "/tmp/x"],
        ["journalctl", "-rD/tmp/x"],
        ["journalctl", "-D", "/tmp/x"],
        ["journalctl", "-fr"],
        ["journalctl", "-rf"],
        ["journalctl", "-ruf", "nginx"],  # -u takes "f" as its value: no --follow (allowed)
        ["journalctl", "-qM", "other"],
        ["journalctl", "-n", "5", "--rot"],
        ["journalctl", "-b", "-1", "--flu"],
        ["journalctl", "--", "--rotate"],  # after --, a match, not an option (allowed)
        ["journalctl", "--use", "x"],  # ambiguous (--user, --user-unit): the program refuses it
        ["journalctl", "--cursor-fi=/tmp/c", "--director=/tmp/d"],
        ["journalctl", "--setup-k"],
        ["journalctl", "--update-cat"],
    ],
)
def test_combined_and_attached_short_options_are_read_as_journalctl_reads_them(argv: list[str]) -> None:
    expected = {"-ruf": "allow", "--": "allow"}
    assert says(argv) == next((v for k, v in expected.items() if k in argv), "ask"), argv


def test_read_only_requests_are_allowed_abbreviated_or_not() -> None:
    for argv in (
        ["journalctl", "-u", "nginx", "--since", "-1h"],
        ["journalctl", "-u", "nginx", "-n", "50", "--no-pager"],
        ["journalctl", "--sin=-1h", "--no-pa", "-rn5"],
        ["journalctl", "-b", "-1", "-p", "err", "-o", "json"],
        ["journalctl", "--lines", "20", "_SYSTEMD_UNIT=ssh.service"],
    ):
        assert says(argv) == "allow", argv


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="no journalctl on this machine")
@pytest.mark.parametrize("name", [n for n in NOT_READ_ONLY if EX.JOURNALCTL_LONG[n] != 2])
def test_the_table_resolves_as_the_real_journalctl(name: str, tmp_path: Path) -> None:
    """Each abbreviation as this machine's journalctl resolves it: its error names the option (it acts on none)."""
    takes = EX.JOURNALCTL_LONG[name]
    for abbr in abbreviations(name):
        argv = [f"--{abbr}=x"] if takes == 0 else [f"--{abbr}"]
        done = subprocess.run(["journalctl", *argv], capture_output=True, text=True, cwd=tmp_path, timeout=10)
        expected = "doesn't allow an argument" if takes == 0 else "requires an argument"
        assert f"option '--{name}' {expected}" in done.stderr, (abbr, done.stderr)
        assert done.returncode != 0
        resolved = EX.getopt_long(argv if takes == 0 else [*argv, "v"], EX.JOURNALCTL_SHORT, EX.JOURNALCTL_LONG)
        assert resolved is None if takes == 0 else resolved == [(name, "v")]
    assert not list(tmp_path.iterdir())


def test_the_docs_ops_reads_rule_loads_and_is_confined() -> None:
    from airlock.approval.policyfile import parse_policy_text

    doc = (EXAMPLE.parents[1] / "policy.md").read_text()
    block = next(b.split("```")[0] for b in doc.split("```yaml\n")[1:] if "name: ops-reads" in b)
    rules = {r.name: r for r in parse_policy_text(block, "docs/policy.md", main=False).rules}
    sandbox = rules["ops-reads"].sandbox or {}
    assert sandbox.get("read_only") is True and rules["ops-reads"].reviewer == "allow"
