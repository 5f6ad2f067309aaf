"""Every declared verb of every door, for the tests and for docs/protocol.md's generated tables."""

from __future__ import annotations

from airlock.common.wire import agent, approval, exectree, journal, operator, runner  # noqa: F401  each declares its door
from airlock.common.wire.message import Document
from airlock.common.wire.verb import Caller, DoorName, Empty, Message, Verb, declared

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


# The front doors' tables spell out each message's public keys (``key?``: optional), not only its name.
FRONT = (DoorName.OPERATOR, DoorName.AGENT)


def keys(message: type[Message]) -> str:
    """A public message's keys as protocol.md's front-door tables show them: ``—`` for none."""
    if message is Empty:
        return "—"
    if issubclass(message, Document):
        return f"`{message.__name__}` (document)"
    shown = [f"`{f.key}`" + ("" if f.required else "?") for f in message._plan()]
    return f"`{message.__name__}`: " + ", ".join(shown)


def table(door: DoorName) -> str:
    """``door``'s verbs as the markdown table docs/protocol.md carries (a unit test keeps them equal)."""
    rows = ["| verb | callers | arguments | reply | what it does |", "|---|---|---|---|---|"]
    for verb in verbs(door):
        callers = ", ".join(sorted(c.value for c in verb.callers))
        stream = " (streams events)" if verb.streams else ""
        if door in FRONT:
            args, reply = keys(verb.args), keys(verb.reply)
        else:
            args, reply = f"`{verb.args.__name__}`", f"`{verb.reply.__name__}`"
        rows.append(f"| `{verb.name}` | {callers} | {args} | {reply} | {verb.summary}{stream} |")
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
