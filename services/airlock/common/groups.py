"""One touch, many hosts, exact bytes (issue 49): the group a passkey signs, and what each host checks.

Requests on different hosts are *the same request* when their approval
statements (approval/statement.py: one ``name: "JSON string"`` line per
field) agree in every line but those that are per host by nature: the
host, the request ID, the nonce, the expiry and the ticket binding
(`request_key`: the sha256 of the statement with those blanked).  The
binding is per host because it names where each host's binaries sit (their
device and inode numbers: two real hosts never share them; the system test
on three containers found that grouping on it grouped nothing).  What stands
for it in the key is the statement's ``fleet_binding``: the same binding
without device and inode numbers (approval/pending.py), so the spec's
digest, every binary's path, owner and mode, content hashes, sandbox and
environment still count.  That, the decision, the requester, run-as,
command, cwd, stdin, reason, arguments and credentials all agree, byte for
byte, or there is no group.  A statement without a ``fleet_binding`` keeps
its binding in the key (it groups only with itself, never more loosely).

A group is that key and the sorted list of its members' statement digests
(sha256 of each statement's exact bytes).  One passkey touch signs
`challenge` over it: a context of its own (never a single decision's, never
a sign-in's), the canonical group text, and the decision's extras (reason,
grant), as a single decision signs them.  Each host then checks for itself,
before it counts the vote (`member_challenge`): its own current statement's
key is the group's key (so a console cannot slip a different request into a
group: the host of that request refuses it), its own statement's digest is
in the signed list (so a console cannot alter a host's statement, nor use a
touch on a host it dropped); the assertion is then checked over the
challenge it recomputed, so a list or key changed after the touch verifies
over nothing.  The other members' statements are not the host's to check:
each is checked by its own host.

Here (not in approval) because both sides use it: approval checks, the
fleet console (airlock-web) groups.  Statements are handled as their exact
text.  Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

CONTEXT: Final = b"airlock passkey group v1\n"
KEY_CONTEXT: Final = b"airlock request key v1\n"
MAX_MEMBERS: Final = 10_000  # hosts in one group: the list travels to each of them
# The per-host lines, and what they read as in the request key (each still a valid statement value).
BLANKED: Final = {"host": '""', "request": '"-"', "expires": '"0"', "nonce": '"' + "0" * 32 + '"'}
# Blanked only beside a fleet_binding line of 64 hex digits, which stands for it.
BINDING_BLANKED: Final = '"' + "0" * 64 + '"'
_FLEET_BINDING: Final = re.compile(r'fleet_binding: "[0-9a-f]{64}"')
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


class GroupRefused(ValueError):
    """A group that cannot count here: ``reason`` is ``malformed`` or ``group``; the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def statement_digest(statement: bytes) -> str:
    """sha256 of the statement's exact bytes: what a group lists for one host's request."""
    return hashlib.sha256(statement).hexdigest()


def request_key(statement: bytes) -> str:
    """What makes two hosts' requests the same one: the statement with host, request, nonce, expiry blanked,
    and the binding too where a ``fleet_binding`` (the binding less device and inode numbers) stands for it."""
    lines = statement.decode("ascii", "replace").split("\n")
    neutral = any(_FLEET_BINDING.fullmatch(line) for line in lines[1:])
    for n, line in enumerate(lines):
        name = line.split(": ", 1)[0]
        if n and name in BLANKED:
            lines[n] = f"{name}: {BLANKED[name]}"
        elif n and neutral and name == "binding":
            lines[n] = f"{name}: {BINDING_BLANKED}"
    return hashlib.sha256(KEY_CONTEXT + "\n".join(lines).encode("ascii", "replace")).hexdigest()


def fields(statement: str) -> dict[str, str]:
    """A statement's fields as text, for a page (``expires`` without its date); unreadable lines skipped."""
    out: dict[str, str] = {}
    for line in statement.split("\n")[1:]:
        name, sep, raw = line.partition(": ")
        if not sep:
            continue
        try:
            value = json.loads(raw.rsplit(" (", 1)[0] if name == "expires" else raw)
        except ValueError:
            continue
        if isinstance(value, str):
            out[name] = value
    return out


@dataclass(frozen=True, slots=True)
class Group:
    """The key every member shares and the members' statement digests (sorted, each once)."""

    key: str
    members: tuple[str, ...]

    def __post_init__(self) -> None:
        if not _HEX64.fullmatch(self.key):
            raise GroupRefused("malformed", "group.key: must be 64 lowercase hex digits")
        if not 1 <= len(self.members) <= MAX_MEMBERS:
            raise GroupRefused("malformed", f"group.members: 1 to {MAX_MEMBERS} statement digests")
        if any(not isinstance(m, str) or not _HEX64.fullmatch(m) for m in self.members):
            raise GroupRefused("malformed", "group.members: each must be 64 lowercase hex digits")
        if list(self.members) != sorted(set(self.members)):
            raise GroupRefused("malformed", "group.members: must be sorted, each once")

    def text(self) -> bytes:
        """The canonical group: what the challenge covers (injective: fixed-width lines, a count)."""
        lines = [f"key: {self.key}", f"members: {len(self.members)}", *self.members]
        return ("\n".join(lines) + "\n").encode("ascii")

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "members": list(self.members)}

    def journaled(self, mine: bytes) -> dict[str, Any]:
        """What a host's journal keeps of the group: its key, size and digest, and which member it was."""
        return {"key": self.key, "hosts": len(self.members), "digest": self.digest, "member": statement_digest(mine)}


def of(statements: Iterable[bytes]) -> Group:
    """The group of these statements (the console's side); `GroupRefused` ``group`` unless one request."""
    found = list(statements)
    keys = {request_key(s) for s in found}
    if len(keys) != 1:
        raise GroupRefused("group", "these statements are not the same request: a group never mixes requests")
    return Group(keys.pop(), tuple(sorted({statement_digest(s) for s in found})))


def challenge(group: Group, carried: bytes) -> bytes:
    """sha256(b"airlock passkey group v1\\n" + group text + b"\\n" + extras): one touch, many hosts."""
    return hashlib.sha256(CONTEXT + group.text() + b"\n" + carried).digest()


def member_challenge(group: Group, mine: bytes, carried: bytes) -> bytes:
    """The challenge this host accepts for its statement ``mine``; `GroupRefused` ``group`` unless a member."""
    if request_key(mine) != group.key:
        raise GroupRefused("group", "this host's request is not the group's request (a bound byte differs)")
    if statement_digest(mine) not in group.members:
        raise GroupRefused("group", "this host's statement is not in the list the group signs")
    return challenge(group, carried)


def grouped(statements: Mapping[str, bytes]) -> dict[str, list[str]]:
    """The console's grouping: request key -> the names (hosts) whose statement has it, sorted."""
    out: dict[str, list[str]] = {}
    for name, statement in statements.items():
        out.setdefault(request_key(statement), []).append(name)
    return {key: sorted(names) for key, names in out.items()}
