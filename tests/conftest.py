"""Shared fixtures; the helpers live in support.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ci_gate import pytest_sessionfinish  # noqa: F401  (a hook: pytest finds it here)

from support import Stack, start_stack, stop_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Unix socket paths are limited to 108 bytes: keep the folder short.
    runtime = Path(tmp_path_factory.mktemp("al"))
    s = start_stack(runtime)
    try:
        yield s
    finally:
        stop_stack(s)
