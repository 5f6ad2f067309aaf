"""Linters as tests: ruff and strict mypy over the package, and the purity rule.

The protocol core must do no I/O (h11's split): its modules may not import
asyncio, socket or os.  Services are the thin shells that move bytes.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PURE_MODULES = [
    "services/airlock/common/codec.py",
    "services/airlock/common/framing.py",
    "services/airlock/common/errors.py",
    "services/airlock/common/validate.py",
    "services/airlock/common/spec.py",
    "services/airlock/common/envrule.py",
    "services/airlock/intake/request.py",
    "services/airlock/intake/sudo_proxy.py",
    "services/airlock/journal/chain.py",
    "services/airlock/common/kinds.py",
    "services/airlock/gateway/protocol.py",
    "services/airlock/gateway/params.py",
    "services/airlock/gateway/fileop_execute.py",
    "services/airlock/gateway/evidence.py",
    "services/airlock/common/fileop_spec.py",
    "services/airlock/intake/fileop_request.py",
    "services/airlock/approval/tokens.py",
    "services/airlock/common/trail.py",
    "services/airlock/common/lifecycle.py",
    "services/airlock/approval/statement.py",
    "services/airlock/approval/quorum.py",
    "services/airlock/approval/grants.py",
    "services/airlock/common/yamlnodes.py",
    "services/airlock/common/webhold.py",
]
IO_MODULES = {"asyncio", "socket", "os", "subprocess", "selectors", "sqlite3"}


def _tool(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (make test installs it)")
    return found


def test_ruff_is_clean() -> None:
    result = subprocess.run(
        [_tool("ruff"), "check", "services", "tests", "bench"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tree_is_formatted() -> None:
    # `make fmt` formats it; a diff here means someone skipped it.
    result = subprocess.run(
        [_tool("ruff"), "format", "--check", "services", "tests", "bench"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = subprocess.run([_tool("mypy")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("directory", ["tests/unit", "tests/integration", "tests/security", "tests/conformance"])
def test_mypy_strict_is_clean_on_the_tests(directory: str) -> None:
    # The test directories hold no packages: each support module is found through MYPYPATH
    # (one directory per run: each has a conftest of its own).
    support = "services:tests:tests/unit/journal:tests/unit/runner:tests/integration:tests/security:tests/conformance"
    result = subprocess.run(
        [_tool("mypy"), "--strict", "--explicit-package-bases", "--no-warn-unused-ignores", directory],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"MYPYPATH": support},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_test_file_basenames_are_unique() -> None:
    # pytest imports test files by basename (rootdir-relative, no packages): a second one would not load.
    names = [p.name for p in (REPO / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.parametrize("module", PURE_MODULES)
def test_protocol_core_does_no_io(module: str) -> None:
    tree = ast.parse((REPO / module).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & IO_MODULES, f"{module} imports {sorted(imported & IO_MODULES)}"


MAX_MODULE_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    """Issue 36: a module is one idea a reader can hold; past 500 lines it is two (split by idea)."""
    long = {
        str(path.relative_to(REPO)): n
        for path in sorted((REPO / "services" / "airlock").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
