"""Every declared verb of every door, for the tests and for docs/protocol.md's generated tables."""

from __future__ import annotations

from airlock.common.wire import agent, approval, exectree, journal, operator, runner  # noqa: F401  each declares its door
from airlock.common.wire.verb import Caller, DoorName, Verb, declared

DOORS = tuple(DoorName)

# The service that serves each door (its socket).
SERVED_BY: dict[DoorName, str] = {
    DoorName.JOURNAL: "journal",
    DoorName.RUNNER: "runner",
    DoorName.APPROVAL: "approval",
    DoorName.OPERATOR: "approval",
    DoorName.AGENT: "intake",
    DoorName.EXECTREE: "exectree",
}


def verbs(door: DoorName) -> list[Verb]:  # type: ignore[type-arg]
    """``door``'s declared verbs, by name."""
    return [declared(door)[name] for name in sorted(declared(door))]


def table(door: DoorName) -> str:
    """``door``'s verbs as the markdown table docs/protocol.md carries (a unit test keeps them equal)."""
    rows = ["| verb | callers | arguments | reply | what it does |", "|---|---|---|---|---|"]
    for verb in verbs(door):
        callers = ", ".join(sorted(c.value for c in verb.callers))
        stream = " (streams events)" if verb.streams else ""
        rows.append(
            f"| `{verb.name}` | {callers} | `{verb.args.__name__}` | `{verb.reply.__name__}` | {verb.summary}{stream} |"
        )
    return "\n".join(rows)


def hallways() -> str:
    """Who calls what where, as docs/architecture.md carries it: one row per caller and door."""
    rows = ["| caller | door (served by) | verbs |", "|---|---|---|"]
    for door in DOORS:
        for caller in Caller:
            names = [f"`{v.name}`" for v in verbs(door) if caller in v.callers]
            if names:
                rows.append(f"| {caller.value} | {door.value} ({SERVED_BY[door]}) | {', '.join(names)} |")
    return "\n".join(rows)
