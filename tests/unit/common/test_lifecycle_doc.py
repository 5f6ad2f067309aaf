"""docs/architecture.md prints the lifecycle tables exactly as common/lifecycle.py has them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airlock.common import lifecycle

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"


@pytest.mark.parametrize(
    ("name", "render"), [("states", lifecycle.states_markdown), ("table", lifecycle.table_markdown)]
)
def test_the_architecture_doc_prints_the_lifecycle_table(name: str, render: object) -> None:
    text = DOC.read_text()
    found = re.search(rf"<!-- lifecycle:{name} -->\n(.*?)\n<!-- /lifecycle:{name} -->", text, re.S)
    assert found is not None, f"docs/architecture.md has no lifecycle:{name} block"
    assert callable(render)
    assert found.group(1) == render(), (
        f"docs/architecture.md's lifecycle:{name} block differs from common/lifecycle.py; paste:\n{render()}"
    )
