"""relay/cursor.py: the durable cursor keeps what the channel last delivered (issue 44)."""

from __future__ import annotations

import json
from pathlib import Path

from airlock.relay import cursor

JOURNAL = "a" * 64


def test_what_was_delivered_survives_a_save_and_a_load(tmp_path: Path) -> None:
    path = cursor.path_for(tmp_path, "hook")
    cursor.save(path, cursor.Cursor(12, JOURNAL, frozenset({14}), 14, "2026-12-06T00:00:00Z"))
    loaded = cursor.load(path)
    assert loaded == cursor.Cursor(12, JOURNAL, frozenset({14}), 14, "2026-12-06T00:00:00Z")


def test_an_older_cursor_or_a_bad_delivered_value_loads_without_it(tmp_path: Path) -> None:
    path = cursor.path_for(tmp_path, "hook")
    path.write_text(json.dumps({"seq": 3, "journal": JOURNAL, "done": []}))  # written before issue 44
    assert cursor.load(path) == cursor.Cursor(3, JOURNAL)
    path.write_text(json.dumps({"seq": 3, "journal": JOURNAL, "delivered": True, "delivered_at": "x"}))
    assert cursor.load(path) == cursor.Cursor(3, JOURNAL)  # shown to people only: dropped, not trusted
