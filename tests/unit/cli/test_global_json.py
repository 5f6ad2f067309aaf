"""`--json` is accepted before the command as well as after it (reference/004: "`--json` on any command")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airlock.cli.main import main, parser


@pytest.mark.parametrize(
    ("argv", "before", "after"),
    [
        (["--json", "status"], True, False),
        (["status", "--json"], False, True),
        (["--json", "events", "--tail", "3"], True, False),
        (["status"], False, False),
    ],
)
def test_json_before_or_after_the_command(argv: list[str], before: bool, after: bool) -> None:
    # Each place is read into its own attribute (main() then merges them), and only where it was given.
    ns = parser().parse_args(argv)
    assert (ns.global_json, ns.json) == (before, after)


def test_global_json_reaches_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake(ns: Any) -> int:
        seen["json"] = ns.json
        return 0

    ns = parser().parse_args(["--json", "status"])
    monkeypatch.setattr("airlock.cli.main.parser", lambda: _Fixed(ns))
    ns.func = fake
    assert main(["--json", "status"]) == 0
    assert seen["json"] is True


def test_global_json_on_a_command_without_json_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--json", "audit", "export"])
    assert exc.value.code == 2


class _Fixed:
    """A parser stand-in that returns a prepared namespace."""

    def __init__(self, ns: object) -> None:
        self.ns = ns

    def parse_args(self, argv: list[str] | None = None) -> object:
        return self.ns

    def error(self, message: str) -> None:
        raise SystemExit(2)

    def print_help(self, file: object = None) -> None:
        pass


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["status", "--json", "--socket", "SOCK"], 1),
        (["--json", "events", "--tail", "1", "--socket", "SOCK"], 1),
        (["show", "x", "--json", "--socket", "SOCK"], 1),
        (["wait", "op-x", "--json", "--socket", "SOCK"], 1),
        (["run", "--json", "--socket", "SOCK", "--", "true"], 125),
    ],
)
def test_an_unreachable_daemon_is_a_daemon_unavailable_envelope_with_json(
    argv: list[str], status: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # reference/004's closed list names daemon_unavailable; with --json a script
    # must get an envelope on stdout, not an empty line.
    absent = str(tmp_path / "absent.sock")
    assert main([absent if a == "SOCK" else a for a in argv]) == status
    out, err = capsys.readouterr()
    envelope = json.loads(out)
    assert envelope["ok"] is False and "data" not in envelope
    assert envelope["error"]["code"] == "daemon_unavailable" and absent in envelope["error"]["message"]
    assert envelope["error"]["details"] == {} and "id" in envelope
    assert "no airlock socket" in err


def test_an_unreachable_daemon_without_json_prints_nothing_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--socket", str(tmp_path / "absent.sock")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "no airlock socket" in err
