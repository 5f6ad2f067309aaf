"""Linters as tests: ruff and strict mypy over the package, and the purity rule.

The protocol core must do no I/O (h11's split): a module whose docstring says
"Pure: no I/O" may not import asyncio, socket, os, subprocess, selectors or
sqlite3.  Services are the thin shells that move bytes.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "services" / "airlock"
# How a module claims to be a protocol core (h11's split): its docstring says it, in these words.
PURE_MARK = "Pure: no I/O"
IO_MODULES = {"asyncio", "socket", "os", "subprocess", "selectors", "sqlite3"}
# Modules whose docstrings say "pure" or "no I/O" of another module or of a part of themselves, not of
# the whole module (each says which): the drift test accepts these without the mark.
PURE_ELSEWHERE = {
    "services/airlock/approval/decide.py": "the verdict is `verdict` (pure); decide journals and acts",
    "services/airlock/approval/granting.py": "the grants themselves are `grants` (pure); this holds the live set",
    "services/airlock/approval/policyfields.py": "pure apart from looking at binaries and credential files",
    "services/airlock/approval/policyfile.py": "pure apart from what policyfields looks at",
    "services/airlock/journal/anchors.py": "the comparison is `chain.check_anchors` (pure)",
    "services/airlock/journal/journalfiles.py": "the checks are `fleet` (pure); this reads journal files",
    "services/airlock/runner/fileop_child.py": "imports the pure `fileop_spec`; it is a process of its own",
    "services/airlock/runner/scope.py": "building arguments is pure; the rest talks to systemd and cgroups",
    "services/airlock/cli/agenthooks.py": "deciding a hook's answer is pure; `main` reads stdin and the PATH",
    "services/airlock/cli/sudoops.py": "naming an operation is pure; `load` and `save` keep the per-user record",
    "services/airlock/runner/outputkeep.py": "`plan` is a pure function; the module deletes the files it names",
}


def _docstring(path: Path) -> str:
    return " ".join((ast.get_docstring(ast.parse(path.read_text()), clean=False) or "").split())


def _pure_modules() -> list[str]:
    """The modules whose docstrings claim purity: docs and this test read the same words."""
    return sorted(
        str(path.relative_to(REPO)) for path in sorted(PACKAGE.rglob("*.py")) if PURE_MARK in _docstring(path)
    )


PURE_MODULES = _pure_modules()


def _io_imports(source: str) -> set[str]:
    """The I/O modules ``source`` imports (anywhere: a deferred import is still one)."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    return imported & IO_MODULES


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
    io = _io_imports((REPO / module).read_text())
    assert not io, f"{module} says {PURE_MARK!r} but imports {sorted(io)}"


def test_the_pure_modules_are_read_from_their_docstrings() -> None:
    """Issue 47: the list is derived, so a core the docs call pure cannot be missing from the rule."""
    cores = {"approval/verdict", "approval/asked", "approval/refs", "approval/webauthn", "common/checkpoint"}
    cores |= {"common/codec", "common/framing", "journal/chain", "common/wire/message", "intake/request"}
    assert {f"services/airlock/{core}.py" for core in cores} <= set(PURE_MODULES)


def test_the_rule_refuses_a_module_that_claims_purity_and_does_io() -> None:
    source = f'"""A core.\n\n{PURE_MARK}.\n"""\n\nimport json\n\n\ndef f() -> None:\n    import os.path\n'
    assert PURE_MARK in " ".join((ast.get_docstring(ast.parse(source)) or "").split())
    assert _io_imports(source) == {"os"}


def test_purity_is_claimed_in_one_form() -> None:
    """A docstring that calls its module pure (or free of I/O) says it as `PURE_MARK`, so the rule sees it."""
    loose = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = _docstring(path)
        if PURE_MARK not in doc and re.search(r"\bpure\b|\bno I/O\b", doc, re.IGNORECASE):
            loose.add(str(path.relative_to(REPO)))
    assert loose == set(PURE_ELSEWHERE), (
        f"say {PURE_MARK!r} in the docstring of a pure module, or list it in PURE_ELSEWHERE with why: "
        f"{sorted(loose ^ set(PURE_ELSEWHERE))}"
    )


MAX_MODULE_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    """Issue 36: a module is one idea a reader can hold; past 500 lines it is two (split by idea)."""
    long = {
        str(path.relative_to(REPO)): n
        for path in sorted((REPO / "services" / "airlock").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
