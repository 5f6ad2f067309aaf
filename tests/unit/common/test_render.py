"""What reaches an operator's terminal: nothing an agent typed can repaint or hide it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airlock.common.render import Style, command_line, duration, parse_ttl, sanitise, table


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text", "plain text"),
        ("\x1b[2J\x1b[Hfake", "\\x1b[2J\\x1b[Hfake"),
        ("a\rb", "a\\x0db"),
        ("tab\there", "tab\\x09here"),
        ("abc\u202egnp.exe", "abc\\u202egnp.exe"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("wide 日本", "wide \\u65e5\\u672c"),
        ("nbsp\u00a0here", "nbsp\\xa0here"),
        ("combining e\u0301", "combining e\\u0301"),
        ("back\\slash", "back\\\\slash"),
        ("café", "café"),
        ("\x9b31m", "\\x9b31m"),
        ("emoji \U0001f600", "emoji \\U0001f600"),
    ],
)
def test_sanitise_escapes_what_could_make_the_screen_lie(text: str, shown: str) -> None:
    assert sanitise(text) == shown


def test_strict_escapes_every_non_ascii_character() -> None:
    assert sanitise("/usr/bin/\u0430pt", strict=True) == "/usr/bin/\\u0430pt"  # Cyrillic a
    assert sanitise("café", strict=True) == "caf\\xe9"


@given(st.text())
def test_sanitised_text_is_printable_ascii_or_visible_letters(text: str) -> None:
    out = sanitise(text)
    for ch in out:
        assert ch >= " " and ch != "\x7f"
        assert not ("\u0080" <= ch <= "\u009f")
        assert ch not in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200b\u200c\u200d\u200e\u200f\ufeff"
    assert all(" " <= ch <= "~" for ch in sanitise(text, strict=True))


def test_command_line_quotes_and_sanitises() -> None:
    assert command_line(["sh", "-c", "echo hi; rm x"]) == "sh -c 'echo hi; rm x'"
    assert command_line(["echo", "a\x1bb"]) == "echo 'a\\x1bb'"


def test_table_aligns_sanitised_cells() -> None:
    out = table([["a\x1b", "x"], ["bbbb", "y"]], ["K", "V"])
    assert out.splitlines() == ["K      V", "a\\x1b  x", "bbbb   y"]


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("1h", 3600), ("2d", 172800)])
def test_parse_ttl(text: str, seconds: int) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "0", "-5m", "1.5h", "soon", "1w"])
def test_parse_ttl_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_ttl(text)


def test_duration() -> None:
    assert [duration(x) for x in (0, 59, 125, 7300)] == ["0s", "59s", "2m05s", "2h01m"]


def test_a_pending_file_write_shows_the_sha256_it_is_approved_against() -> None:
    from airlock.cli.watch import describe
    from airlock.common.render import file_review

    digest = "ab" * 32
    request = {
        "tool": "files_edit",
        "path": "/etc/app.conf",
        "privileged": True,
        "before_sha256": digest,
        "after_sha256": "cd" * 32,
        "diff": "--- /etc/app.conf\n+++ /etc/app.conf\n-a\n+b\x1b[2J\n",
    }
    pairs = dict(file_review(request))
    assert pairs["against"] == f"sha256 {digest}" and pairs["after"] == f"sha256 {'cd' * 32}"
    assert dict(file_review(request | {"before_sha256": "absent"}))["against"].startswith("absent")
    unbound = dict(
        file_review({"tool": "files_write", "path": "/x", "diff": None, "preview_error": {"code": "too_large"}})
    )
    assert "too_large" in unbound["against"] and "not bound" in unbound["against"]
    assert file_review({"spec": {"stages": []}}) == []  # a command: nothing to add
    shown = describe(
        {
            "request_id": "r1",
            "peer": {"user": "a", "uid": 1, "pid": 2},
            "privileged": True,
            "request": request,
            "rule": "ask-edits",
            "operation_id": "op",
        },
        Style(False),
        1,
        1,
    )
    assert f"sha256 {digest}" in shown and "+b\\x1b[2J" in shown and "\x1b" not in shown


def test_watch_flags_a_root_jobs_changeable_argument() -> None:
    """Issue 27: the console names an argument the agent can change, with the bound hash, sanitised."""
    from airlock.cli.watch import describe

    item = {
        "stage": 0,
        "index": 1,
        "path": "/home/a/task.sh\x1b[2J",
        "kind": "file",
        "script": True,
        "sha256": "ef" * 32,
        "changeable": {"path": "/home/a", "why": "is owned by uid 1000, not root"},
    }
    pending = {
        "request_id": "r1",
        "peer": {"user": "a", "uid": 1000, "pid": 2},
        "privileged": True,
        "request": {"spec": {"stages": [["sh", "/home/a/task.sh"]]}},
        "stages": [{"argv": ["sh", "/home/a/task.sh"], "binary": "/usr/bin/dash", "resolved": "/usr/bin/dash"}],
        "rule": "scripts",
        "operation_id": "op",
    }
    shown = describe(pending | {"arguments": [item]}, Style(False), 1, 1)
    assert "CHANGEABLE" in shown and "sha256 efefefefefefefef" in shown and "/home/a is owned by uid 1000" in shown
    assert "\x1b" not in shown
    assert "CHANGEABLE" not in describe(pending, Style(False), 1, 1)
