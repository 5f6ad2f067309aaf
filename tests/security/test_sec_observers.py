"""Read-only operators (`operators.observers`): they may look, never decide.

An observer (the notify relay's user is one) reaches operator.sock and reads
``status``, ``pending``, ``show`` and ``events``; every verb that changes
something answers ``unauthorized`` and changes nothing.  The control: the
same request is approved by a real operator, and a stranger is turned away
at the door.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

from secsupport import as_user, needs_root, red_stack, throwaway_user

from support import Background, wait_pending

pytestmark = needs_root

_CLIENT = r"""
import json, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(job["socket"])
s.sendall(json.dumps(job["request"]).encode() + b"\n")
s.shutdown(socket.SHUT_WR)
buf = b""
while True:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    buf += chunk
print(json.dumps([json.loads(line) for line in buf.splitlines() if line.strip()]))
"""


def operator_call(
    socket_path: str,
    user: pwd.struct_passwd,
    verb: str,
    args: dict[str, Any] | None = None,
    *,
    groups: tuple[int, ...] = (),
) -> dict[str, Any]:
    """One native request on operator.sock from a process of ``user`` (with extra ``groups``)."""
    request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": args or {}, "token": None}
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _CLIENT],
        input=json.dumps({"socket": socket_path, "request": request}),
        capture_output=True,
        text=True,
        timeout=60,
        **(as_user(user) | {"extra_groups": list(groups)}),
    )
    assert done.returncode == 0, done.stderr
    finals = [r for r in json.loads(done.stdout) if "event" not in r]
    assert len(finals) == 1, done.stdout
    reply: dict[str, Any] = finals[0]
    return reply


def test_an_observer_reads_but_cannot_decide() -> None:
    with throwaway_user("alobs") as observer, throwaway_user("alstr") as stranger:
        config = f"operators:\n  observers: {{users: [{observer.pw_name}], groups: []}}\n"
        with red_stack(config) as stack:
            os.chmod(stack.operator, 0o666)  # the socket unit's mode is not what is tested here
            bg = Background(stack, {"argv": ["/usr/bin/id"], "privileged": True, "reason": "observer test"})
            wait_pending(stack, bg.request_id)

            # The stranger is turned away at the door: the allow-list still decides.
            assert operator_call(stack.operator, stranger, "pending")["error"]["code"] == "unauthorized"

            # The observer reads.
            pending = operator_call(stack.operator, observer, "pending")
            assert pending["ok"], pending
            assert [p["request_id"] for p in pending["data"]["pending"]] == [bg.request_id]
            for verb, args in (("status", {}), ("show", {"ref": bg.request_id}), ("events", {"tail": 5})):
                reply = operator_call(stack.operator, observer, verb, args)
                assert reply["ok"], (verb, reply)

            # ... and decides nothing.
            decide_verbs: tuple[tuple[str, dict[str, Any]], ...] = (
                ("approve", {"id": bg.request_id, "reason": "observer"}),
                ("deny", {"id": bg.request_id, "reason": "observer"}),
                ("cancel", {"operation_id": bg.operation_id}),
                ("hold", {"reason": "observer"}),
                ("release", {}),
                ("token.issue", {"session": "s1", "user": "root"}),
                ("token.revoke", {"session": "s1"}),
                ("policy.check", {"argv": ["/usr/bin/id"]}),
                ("audit.verify", {}),
                ("audit.archive", {"confirm": True}),
            )
            for verb, args in decide_verbs:
                reply = operator_call(stack.operator, observer, verb, args)
                assert reply.get("error", {}).get("code") == "unauthorized", (verb, reply)
            still = stack.native("pending", path=stack.operator)["data"]["pending"]
            assert [p["request_id"] for p in still] == [bg.request_id]
            assert stack.native("status", path=stack.operator)["data"]["hold"] is False
            actions = [r for r in stack.journal_rows() if r["kind"] == "operator.action"]
            assert actions == [], "an observer's refused verb left an operator action"

            # Control: an operator's approve of the very same request goes through.
            assert stack.native("approve", {"id": bg.request_id, "reason": "operator"}, path=stack.operator)["ok"]
            assert bg.result()["ok"], bg.reply


@contextlib.contextmanager
def throwaway_group() -> Iterator[grp.struct_group]:
    name = f"alsecg{secrets.token_hex(3)}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield grp.getgrnam(name)
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


def test_an_observer_holding_the_operators_group_still_only_reads() -> None:
    """The relay's case: it holds the socket's group to open the file, and is named an observer."""
    with throwaway_group() as group, throwaway_user("alobs") as observer, throwaway_user("alop") as member:
        config = (
            f"operators:\n  groups: [{group.gr_name}]\n  users: [root]\n  observers: {{users: [{observer.pw_name}]}}\n"
        )
        for user in (observer, member):
            subprocess.run(["usermod", "-aG", group.gr_name, user.pw_name], check=True, capture_output=True)
        with red_stack(config) as stack:
            os.chmod(stack.operator, 0o666)
            bg = Background(stack, {"argv": ["/usr/bin/id"], "privileged": True, "reason": "observer in the group"})
            wait_pending(stack, bg.request_id)
            gid = (group.gr_gid,)
            assert operator_call(stack.operator, observer, "pending", groups=gid)["ok"]
            refused = operator_call(stack.operator, observer, "approve", {"id": bg.request_id}, groups=gid)
            assert refused["error"]["code"] == "unauthorized", refused
            assert [p["request_id"] for p in stack.native("pending", path=stack.operator)["data"]["pending"]] == [
                bg.request_id
            ]
            # Control: a member of the same group who is not named an observer decides.
            approved = operator_call(
                stack.operator, member, "approve", {"id": bg.request_id, "reason": "member"}, groups=gid
            )
            assert approved["ok"], approved
            assert bg.result()["ok"], bg.reply
