"""Every declared verb of every door, for the tests and for docs/protocol.md's generated tables."""

from __future__ import annotations

from airlock.common.wire import agent, approval, journal, operator, runner  # noqa: F401  each declares its door
from airlock.common.wire.verb import DoorName, Verb, declared

DOORS = tuple(DoorName)


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
