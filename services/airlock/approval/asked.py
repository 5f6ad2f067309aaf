"""One request as approval sees it: the checked record ``decide`` works from, and the views made of it.

`Asked` is one ``decide`` call's request, checked once; `subject_of` is
who asks in the policy's terms; `operator_view` is what operators are
shown (built from the spec that travelled once) and `journaled_request`
what ``approval.pending`` stores of it; `credentials_bound` is what the
ticket binds of a rule's credentials; `policy_refusal` is what the agent is
told of a policy's deny (a missing program as a shell says it).  Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airlock.approval.rules import UNRESOLVED_RULE, Decision, Policy, Subject
from airlock.common import shown
from airlock.common.audit import Ids
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.fileop_spec import FileSpec
from airlock.common.peer import Peer
from airlock.common.resolve import default_path
from airlock.common.spec import ExecSpec
from airlock.common.wire import approval as wire


def subject_of(peer: Peer, spec: ExecSpec | FileSpec, session: str | None) -> Subject:
    cwd = spec.cwd if isinstance(spec, ExecSpec) else None
    stdin = spec.stdin if isinstance(spec, ExecSpec) else None
    return Subject(
        uid=peer.uid,
        user=peer.user,
        groups=frozenset(peer.groups),
        session=session or None,
        privileged=spec.privileged,
        target_uid=spec.run_as,
        cwd=cwd,
        stdin_sha256=(shown.summary(stdin) or {}).get("sha256"),
        # Another account (issue 48): a rule's run_as names it by name or uid.
        target_user=user_name(spec.run_as) if isinstance(spec, ExecSpec) and spec.user is not None else "",
    )


@dataclass(frozen=True, slots=True)
class Asked:
    """One ``decide`` call's request, checked once: every step after the checks reads it from here."""

    request: dict[str, Any]  # as intake sent it (what operators are shown)
    spec: ExecSpec | FileSpec
    peer: Peer  # the agent (intake names it; its uid is the spec's)
    session: str | None
    digest: str  # the spec's, computed once here
    decision: Decision  # the policy's (an allow whose arguments others can change became an ask)
    bound: dict[str, Any]  # what approval resolved beyond the request, bound to the ticket
    ids: Ids
    after: list[str] | None  # intake's deferred marks the decision's records name


def policy_refusal(decision: Decision, spec: ExecSpec | FileSpec, rule: str) -> AirlockError:
    """What the agent is told of a policy's deny: a missing program as a shell says it, else the rule."""
    if rule == UNRESOLVED_RULE and isinstance(spec, ExecSpec):
        return not_found(decision, spec)
    return AirlockError(ErrorCode.DENIED, f"denied by policy rule {rule!r}", {"rule": rule, "decided_by": "policy"})


def not_found(decision: Decision, spec: ExecSpec) -> AirlockError:
    """A program that is not there: said as a shell says it, not as a policy decision (issue 32).

    Still journaled as the ``unresolved`` pseudo-rule's deny: nothing ran, and a
    program that appears there later was never approved.
    """
    missing = next(stage for stage in decision.stages if stage.resolved is None)
    program = missing.argv[0]
    searched = default_path(spec.run_as)
    where = (
        f"an absolute path is needed; {program!r} is relative"
        if "/" in program and not program.startswith("/")
        else f"no such executable file {program!r}"
        if "/" in program
        else f"searched {'root' if spec.run_as == 0 else 'the user'}'s secure PATH {searched}"
    )
    return AirlockError(
        ErrorCode.COMMAND_NOT_FOUND,
        f"{program}: command not found ({where}); nothing ran",
        {"program": program, "searched": searched, "rule": UNRESOLVED_RULE, "decided_by": "policy"},
    )


def session_of(request: dict[str, Any]) -> str | None:
    session = request.get("session")
    return session if isinstance(session, str) and session else None


def request_id_of(ids: Ids) -> str:
    assert ids.request_id is not None
    return ids.request_id


def user_name(uid: int) -> str:
    """``uid``'s account name (the uid itself when it has none)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def journaled_request(request: Any) -> Any:
    """The request as ``approval.pending`` journals it: without its ``spec`` when the spec only repeats the
    request's own fields (issue 38: the spec is stored once per record; ``request.received``'s digest binds it)."""
    if not isinstance(request, dict) or not isinstance(request.get("spec"), dict):
        return request
    spec = request["spec"]
    if all(k in request and request[k] == v for k, v in spec.items()):
        return {k: v for k, v in request.items() if k != "spec"}
    return request


def credentials_bound(decision: Decision) -> dict[str, Any]:
    """``bound["credentials"]``: each stage's {name: path} (runner/credentials.py); empty when none has any."""
    if not any(stage.credentials for stage in decision.stages):
        return {}
    return {"credentials": [dict(stage.credentials or {}) for stage in decision.stages]}


def operator_view(asking: wire.Asking, spec: ExecSpec | FileSpec) -> dict[str, Any]:
    """The request as operators are shown it and ``approval.pending`` journals it: the agent's words and the
    checked spec (a command's fields and ``spec``, stdin by size and sha256 plus an excerpt; a file operation's
    description and ``file``), built here from the spec that travelled once."""
    words = {"request_id": asking.request_id, "reason": asking.reason, "session": asking.session}
    words |= {"host": asking.host, "time": asking.time}
    if isinstance(spec, FileSpec):
        return words | spec.describe() | {"file": spec.to_dict()}
    # stdin by size and sha256 (issue 45); its excerpt is content, for operators only (fileop_review.CONTENT_FIELDS).
    checked = shown.journaled(spec.to_dict())
    excerpt = shown.excerpt(spec.stdin)
    return words | checked | {"spec": checked} | ({"stdin_excerpt": excerpt} if excerpt is not None else {})


def shadow_of(policy: Policy, spec: ExecSpec | FileSpec, peer: Peer, session: str | None) -> dict[str, Any]:
    """Issue 34: what each matching ``mode: shadow`` rule would have decided, beside the real decision."""
    if not policy.shadow:
        return {}
    subject = subject_of(peer, spec, session)
    try:
        if isinstance(spec, FileSpec):
            found = policy.shadow_verdicts(subject, file=(spec.tool, spec.path))
        else:
            found = policy.shadow_verdicts(subject, spec.stages)
    except AirlockError:
        return {}
    return {"shadow": found} if found else {}
