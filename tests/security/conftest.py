"""Fixtures the red-team files share (their helpers live in secsupport.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from secsupport import root_dir


@pytest.fixture(scope="module")
def marks() -> Iterator[Path]:
    """A folder only root may write in, where a payload that ran as root leaves its mark."""
    path = root_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
