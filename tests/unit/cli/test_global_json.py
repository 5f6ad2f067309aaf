"""`--json` is accepted before the command as well as after it (reference/004: "`--json` on any command")."""

from __future__ import annotations

import pytest

from airlock.cli.main import main, parser


@pytest.mark.parametrize("argv", [["--json", "status"], ["status", "--json"], ["--json", "events", "--tail", "3"]])
def test_json_before_or_after_the_command(argv: list[str]) -> None:
    ns = parser().parse_args(argv)
    assert ns.json or ns.global_json


def test_global_json_reaches_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake(ns: object) -> int:
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
