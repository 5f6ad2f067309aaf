"""Layers that only point down, and no import circles (like the purity rule in test_lint).

Every ``import`` in the package counts, also those inside functions and under
``TYPE_CHECKING``: a deferred import is still a dependency a reader must follow.

- ``common`` (and the package root, which holds only ``__version__``) is the
  bottom: it imports nothing above it.
- The services (``journal``, ``approval``, ``runner``, ``intake``, ``relay``, ``web``)
  import ``common`` and their own package, never one another and never a client.
- The clients (``cli``, ``gateway``, ``mcp``) are the top; they import ``common``,
  one another, and no service internals except the few listed in
  ``CLIENT_USES_SERVICE`` with the reason each is allowed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "services"
PACKAGE = "airlock"

BOTTOM = {"", "common"}
SERVICES = {"journal", "approval", "runner", "intake", "relay", "web"}
CLIENTS = {"cli", "gateway", "mcp"}
# entry: the services' commands (it names their modules; on top, like __main__).
RANK = {
    **dict.fromkeys(BOTTOM, 0),
    **dict.fromkeys(SERVICES, 1),
    **dict.fromkeys(CLIENTS, 2),
    "__main__": 3,
    "entry": 3,
}

# The `airlock` command is also the administrator's tool: these commands read a
# service's own files on this host (no daemon in between) or start the services.
CLIENT_USES_SERVICE = {
    # `airlock policy check --files` / `config check` (issue 44): the policy parsed offline exactly as approval
    # parses it (visudo -c), before a reload and without a running service.
    ("airlock.cli.policy", "airlock.approval.policy"),
    ("airlock.cli.policy", "airlock.approval.policyfile"),
    # `airlock audit verify` checks the journal database file and its anchors offline, as root.
    ("airlock.cli.audit", "airlock.journal.anchors"),
    ("airlock.cli.audit", "airlock.journal.store"),
    ("airlock.cli.audit", "airlock.journal.chain"),
    ("airlock.cli.audit", "airlock.journal.journalfiles"),
    # `airlock audit verify --segment FILE` checks one sealed segment file offline (journal/segments.py).
    ("airlock.cli.audit", "airlock.journal.segments"),
    # `airlock audit verify --journal` and `audit compare` read a collector's journal files
    # and the local database offline (journal/fleet.py), without root or a running service.
    ("airlock.cli.fleet", "airlock.journal.chain"),
    ("airlock.cli.fleet", "airlock.journal.fleet"),
    ("airlock.cli.fleet", "airlock.journal.collected"),  # `audit compare` (split out of journal/fleet.py)
    ("airlock.cli.fleet", "airlock.journal.journalfiles"),
    # `airlock dev up` checks the policy file before it starts the services.
    ("airlock.cli.dev", "airlock.approval.policy"),
    # `airlock status` reads the relay's status file on this host (relay/state.py says why a file).
    ("airlock.cli.operator", "airlock.relay.state"),
    # `airlock policy suggest` writes patterns with the matcher's own rules (what a placeholder takes)
    # and checks its file with the loader approval uses (issue 34): one truth, not a copy.
    ("airlock.cli.suggest", "airlock.approval.match"),
    ("airlock.cli.suggest", "airlock.approval.policyfile"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports (a name imported from a package counts as its module)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module for alias in node.names
            ]
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_layer() -> None:
    unknown = {_layer(m) for m in _graph()} - set(RANK)
    assert not unknown, f"packages without a layer in test_layers.py: {sorted(unknown)}"


def _judge(module: str, target: str) -> str | None:
    """Why `module` may not import `target`, or None when it may."""
    here, there = _layer(module), _layer(target)
    if here == there:
        return None
    if RANK[there] > RANK[here]:
        return f"{here or 'airlock'} may not import {there}, a layer above it"
    if RANK[there] == RANK[here] == 1:
        return f"the {here} service may not import the {there} service (share it through common)"
    if RANK[here] == 2 and RANK[there] == 1 and (module, target) not in CLIENT_USES_SERVICE:
        return "a client may not use a service's internals"
    return None


def test_imports_only_point_down() -> None:
    wrong = [
        f"{module} -> {target}: {reason}"
        for module, targets in sorted(_graph().items())
        for target in sorted(targets)
        if (reason := _judge(module, target))
    ]
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_allowed_client_edges_still_exist() -> None:
    graph = _graph()
    stale = sorted(edge for edge in CLIENT_USES_SERVICE if edge[1] not in graph.get(edge[0], set()))
    assert not stale, f"CLIENT_USES_SERVICE lists imports that are gone: {stale}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    # A package's __init__ re-exporting its modules is not a circle a reader must untangle.
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in _graph().items()}
    assert not _cycles(graph), f"import circles: {_cycles(graph)}"


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    """The rule cannot pass vacuously: a made-up graph with both faults is caught."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _judge("airlock.common.audit", "airlock.journal.kinds")
    assert _judge("airlock.relay.service", "airlock.journal.kinds")
    assert _judge("airlock.relay.message", "airlock.cli.render")
    assert _judge("airlock.cli.main", "airlock.approval.trail")
    assert _judge("airlock.intake.service", "airlock.common.server") is None
    assert "airlock.common.server" in _graph()["airlock.intake.service"]


def test_every_module_opens_with_a_docstring_that_says_what_it_holds() -> None:
    bare = [
        name
        for name, path in _modules().items()
        if len((ast.get_docstring(ast.parse(path.read_text())) or "").split()) < 5
    ]
    assert not bare, f"modules without an opening docstring of at least a sentence: {bare}"


def _layout_by_package() -> dict[str, str]:
    """docs/architecture.md's code layout block: each package's text (its line and the indented lines after it)."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    block = doc.split("## Code layout", 1)[1].split("```", 2)[1]
    packages: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        head = re.match(r"^  (\w+)/\s", line)
        if head:
            current = head.group(1)
            packages[current] = line[len(head.group(0)) :]
        elif current is not None and line.startswith("      "):
            packages[current] += " " + line.strip()
        else:
            current = None
    return packages


def test_the_architecture_doc_names_every_module() -> None:
    layout = _layout_by_package()
    missing = []
    for name in _modules():
        parts = name.split(".")[1:]
        if len(parts) != 2 or parts[1] == "__main__":
            continue  # the package root, a package's __init__, a `python -m` entry
        package, module = parts
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", layout.get(package, "")))
        if module not in words:
            missing.append(name)
    assert not missing, f"docs/architecture.md's code layout does not name: {missing}"
