"""docs/protocol.md's and docs/architecture.md's verb tables are the declarations (common/wire), generated.

Like the settings table (test_config.py): the docs carry each table between
``<!-- wire:NAME -->`` and ``<!-- /wire:NAME -->``, and this test holds them
equal to what `airlock.common.wire.registry` renders.  Run as a script, it
rewrites them: ``.venv/bin/python tests/unit/common/test_wire_docs.py``.
The front doors' hand-written tables (with every field spelled out) must name
exactly the declared verbs.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from airlock.common.wire import registry
from airlock.common.wire.verb import Caller, DoorName, Empty, declared

DOCS = Path(__file__).resolve().parents[3] / "docs"
INTERNAL = (DoorName.JOURNAL, DoorName.RUNNER, DoorName.APPROVAL, DoorName.EXECTREE)
# Each generated region: the file it is in and what renders it.
REGIONS: dict[str, tuple[str, Callable[[], str]]] = {
    **{door.value: ("protocol.md", functools.partial(registry.table, door)) for door in INTERNAL},
    "hallways": ("architecture.md", registry.hallways),
}


def _region(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- wire:{re.escape(name)} -->\n)(.*?)(<!-- /wire:{re.escape(name)} -->)", re.S)


def _rewrite(doc: str, name: str, table: str) -> str:
    return _region(name).sub(lambda m: m.group(1) + table + "\n" + m.group(3), doc)


def render(doc: str, file: str) -> str:
    """``doc`` with each of its generated regions rewritten from the declarations."""
    for name, (where, make) in REGIONS.items():
        if where == file:
            doc = _rewrite(doc, name, make())
    return doc


@pytest.mark.parametrize("name", sorted(REGIONS))
def test_the_docs_carry_the_generated_table(name: str) -> None:
    file, make = REGIONS[name]
    found = _region(name).search((DOCS / file).read_text())
    assert found, f"docs/{file} has no <!-- wire:{name} --> region"
    assert found.group(2) == make() + "\n", (
        f"docs/{file}'s {name} table must read (run tests/unit/common/test_wire_docs.py to rewrite it):\n" + make()
    )


def _first_column(section: str) -> set[str]:
    """The verbs a hand-written table's first column names (``| `approve` / `deny` | ...``)."""
    names: set[str] = set()
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and "`" in cells[1]:
            names |= set(re.findall(r"`([a-z_.]+)`", cells[1]))
    return names


def _section(doc: str, heading: str) -> str:
    start = doc.index(heading)
    end = doc.find("\n## ", start + len(heading))
    return doc[start : end if end >= 0 else len(doc)]


def test_the_front_doors_tables_name_exactly_the_declared_verbs() -> None:
    doc = (DOCS / "protocol.md").read_text()
    operator = _first_column(_section(doc, "## Operator verbs (`operator.sock`)"))
    assert operator == set(declared(DoorName.OPERATOR))
    # The agent table lists the verbs but the file operations, which have their own section.
    agent = _first_column(_section(doc, "### Agent verbs (`agent.sock`)").split("\n### ", 1)[0])
    files = _first_column(_section(doc, "## File operations (`files_*` verbs)"))
    assert agent | files == set(declared(DoorName.AGENT))


def test_the_operator_table_says_which_verbs_take_no_arguments() -> None:
    """A row whose arguments are ``—`` is a verb declared `Empty` (it refuses any argument), and only those."""
    doc = _section((DOCS / "protocol.md").read_text(), "## Operator verbs (`operator.sock`)")
    without: set[str] = set()
    for line in doc.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) in (5, 6) and cells[1].startswith("`"):
            args = cells[2] if len(cells) == 5 else cells[3]  # the passkey table has a "who" column
            if args == "—":
                without |= set(re.findall(r"`([a-z_.]+)`", cells[1]))
    declared_empty = {name for name, verb in declared(DoorName.OPERATOR).items() if verb.args is Empty}
    assert without == declared_empty


def test_the_services_table_says_whom_each_service_reaches_and_with_what() -> None:
    """Issue 47: architecture.md's first table names the doors each service calls, and where it lists
    the verbs it calls on one (``runner (`cancel`, ...)``), exactly the declared ones."""
    doc = (DOCS / "architecture.md").read_text()
    rows = {cells[1].strip(): cells for line in doc.splitlines() if len(cells := line.split("|")) == 7}
    for caller in (Caller.INTAKE, Caller.APPROVAL, Caller.RUNNER):
        reaches = rows[f"airlock-{caller.value}"][4]
        said = dict(re.findall(r"\b(journal|runner|approval|exectree)\b(?: \(([^)]*)\))?", reaches))
        called = {door: {v.name for v in registry.verbs(door) if caller in v.callers} for door in INTERNAL}
        assert set(said) == {door.value for door, names in called.items() if names}, caller
        for door, listed in said.items():
            if listed:
                assert set(re.findall(r"`([a-z_.]+)`", listed)) == called[DoorName(door)], (caller, door)


def test_a_stale_table_is_seen_and_rewritten() -> None:
    """The check cannot pass vacuously: a region that says something else is found and replaced."""
    stale = "x\n<!-- wire:hallways -->\n| old |\n<!-- /wire:hallways -->\ny\n"
    fresh = render(stale, "architecture.md")
    assert "| old |" not in fresh and registry.hallways() in fresh and fresh.startswith("x\n")


if __name__ == "__main__":
    for file in sorted({where for where, _ in REGIONS.values()}):
        path = DOCS / file
        text = path.read_text()
        if render(text, file) != text:
            path.write_text(render(text, file))
            print(f"rewrote docs/{file}", file=sys.stderr)
