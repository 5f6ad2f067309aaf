"""The policy as the engine holds it, and deciding: rules, who asks, decisions.

No sockets, no asyncio; the filesystem is read only to resolve
binaries (the same `resolve_executable` the runner uses).

Deciding never depends on order or names: for each stage the most restrictive
matching decision wins (deny > ask > allow), the pipeline takes its most
restrictive stage, and everything the rules with that decision carry is
combined: their ``sandbox:`` settings, most restrictive per key
(`airlock.common.sandbox.merge`), and their quorum and reason requirements
(`Policy.requirement`).  A rule's name only labels a decision (the first
name in sort order among the deciding rules).  docs/policy.md is the reference.
`policyfile` reads rules from YAML; `policy` loads and assembles the policy.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from airlock.approval import match
from airlock.approval.match import FileGrant
from airlock.approval.quorum import Approvers, Requirement, join
from airlock.approval.standing import Standing
from airlock.common.errors import AirlockError
from airlock.common.resolve import canonical, default_path, resolve_executable
from airlock.common.sandbox import merge as merge_sandboxes

Verdict = Literal["allow", "ask", "deny"]


class RuleMode(enum.StrEnum):
    """Whether a rule decides, or only says what it would have decided (issue 34's ``mode: shadow``)."""

    ENFORCE = "enforce"
    SHADOW = "shadow"


VERDICTS: tuple[Verdict, ...] = ("allow", "ask", "deny")
_RANK: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}

# Pseudo-rule names a decision can carry; no real rule may take them.
DEFAULT_RULE = "default"  # no rule matched: the policy's default decided
UNRESOLVED_RULE = "unresolved"  # argv[0] is no executable: denied, it could not run anyway

Resolver = Callable[[str, str], "str | None"]


@dataclass(frozen=True, slots=True)
class Subject:
    """Who asks.  ``target_uid`` is whose PATH resolves argv[0]: 0 when privileged, else the peer's."""

    uid: int
    user: str
    groups: frozenset[str]  # group names, primary and supplementary
    session: str | None
    privileged: bool
    target_uid: int
    target_user: str = ""  # the target account's name ("" unknown): a rule's run_as may name it
    # Issue 45: the job's directory as asked (None: none given) and the sha256 of its stdin (None: none).
    cwd: str | None = None
    stdin_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    decision: Verdict
    users: frozenset[str]  # names or decimal uids; empty: anyone
    groups: frozenset[str]  # empty: any
    sessions: frozenset[str]  # empty: any, even none
    privileged: bool | None  # None: either
    commands: tuple[tuple[str, ...], ...] | None  # heads canonical; None: any command
    source: str  # path:line
    files: tuple[FileGrant, ...] | None = None  # None: any file operation (see `targets_commands`)
    description: str = ""
    # Unit settings for this rule's jobs (common/sandbox.py); None: a full job, as with sudo.
    sandbox: Mapping[str, Any] | None = field(default=None, compare=False)
    # Issue 18: distinct approvers an ``ask`` needs, who counts, and whether the agent must say why.
    approvals: int = 1
    approvers: Approvers | None = None
    reason_required: bool = False
    # Issue 27: a root job's path argument someone other than root can change makes an allow ask,
    # unless the rule says ``writable_arguments: allow``.
    writable_arguments: bool = False
    # Issue 34: what the reviewer may do on this rule's asks (allow: decide either way; deny: only
    # refuse; advise: only show its opinion; None: the key is absent, which reads as advise).
    reviewer: str | None = None
    # Issue 34: shadow: the rule never decides; the decision it would make is journaled.
    mode: RuleMode = RuleMode.ENFORCE
    # Issue 35: credentials the job receives ({name: root-owned file}), never the agent.
    credentials: Mapping[str, str] | None = field(default=None, compare=False)
    # Issue 45: the job's directory must be this (canonical; "none": no cwd given), its stdin have this
    # sha256 ("sha256:HEX"; "none": no stdin).  None: any.
    cwd: str | None = None
    stdin: str | None = None
    # Issue 48 (sudo's Runas_Spec): the accounts a privileged job may run as (names or uids, "root"
    # among them or not); None: root alone.  A job as another account meets only rules that name it.
    run_as: frozenset[str] | None = None

    def __post_init__(self) -> None:
        # Rules built in code (tests, tools) get the same guarantees as parsed
        # ones: valid patterns, and heads canonical like the requests they meet.
        if self.decision not in VERDICTS:
            raise ValueError(f"rule {self.name!r}: decision must be one of allow, ask, deny (got {self.decision!r})")
        if self.commands is not None:
            for pattern in self.commands:
                problem = match.pattern_problem(pattern)
                if problem is not None:
                    raise ValueError(f"rule {self.name!r}: {list(pattern)!r}[{problem[0]}]: {problem[1]}")
            canonical = tuple((match.canonical_head(p[0]), *p[1:]) for p in self.commands)
            object.__setattr__(self, "commands", canonical)
        if self.credentials and self.privileged is not True:
            raise ValueError(f"rule {self.name!r}: credentials apply only to a rule with privileged: true")

    def applies_to(self, subject: Subject) -> bool:
        """Whether every subject condition of this rule holds."""
        if self.users and subject.user not in self.users and str(subject.uid) not in self.users:
            return False
        if self.groups and not (self.groups & subject.groups):
            return False
        if self.sessions and (subject.session is None or subject.session not in self.sessions):
            return False
        if self.cwd is not None and not _cwd_matches(self.cwd, subject):
            return False
        if self.stdin is not None and self.stdin != _stdin_of(subject):
            return False
        if subject.privileged and not self.runs_as(subject):
            return False
        return self.privileged is None or self.privileged == subject.privileged

    def runs_as(self, subject: Subject) -> bool:
        """Whether a privileged job of ``subject`` runs as an account this rule allows (root without run_as)."""
        if self.run_as is None:
            return subject.target_uid == 0
        return str(subject.target_uid) in self.run_as or (subject.target_user or "\0") in self.run_as

    # A rule naming only ``files:`` must not become "any command" (nor one naming
    # only ``commands:`` "any file"): absent means any only when both are absent.
    @property
    def targets_commands(self) -> bool:
        return self.commands is not None or self.files is None

    @property
    def targets_files(self) -> bool:
        return self.files is not None or self.commands is None

    def matches_command(self, resolved: str | None, args: Sequence[str]) -> bool:
        if not self.targets_commands:
            return False
        if self.commands is None:
            return True
        if resolved is None:
            return False
        return any(p[0] == resolved and match.match_args(p[1:], args) for p in self.commands)

    def matches_file(self, tool: str, path: str) -> bool:
        """Whether this rule covers ``tool`` on a canonical absolute ``path``."""
        if not self.targets_files:
            return False
        return self.files is None or any(grant.matches(tool, path) for grant in self.files)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "decision": self.decision, "source": self.source}
        for key in ("users", "groups", "sessions"):
            value: frozenset[str] = getattr(self, key)
            if value:
                out[key] = sorted(value)
        if self.privileged is not None:
            out["privileged"] = self.privileged
        if self.run_as is not None:
            out["run_as"] = sorted(self.run_as)
        if self.commands is not None:
            out["commands"] = [list(p) for p in self.commands]
        if self.files is not None:
            out["files"] = [{"tools": sorted(g.tools), "paths": list(g.paths)} for g in self.files]
        if self.description:
            out["description"] = self.description
        if self.sandbox is not None:
            out["sandbox"] = dict(self.sandbox)
        if self.approvals != 1:
            out["approvals"] = self.approvals
        if self.approvers is not None:
            out["approvers"] = self.approvers.to_dict()
        if self.reason_required:
            out["reason"] = "required"
        if self.writable_arguments:
            out["writable_arguments"] = "allow"
        if self.reviewer is not None:
            out["reviewer"] = self.reviewer
        if self.mode != RuleMode.ENFORCE:
            out["mode"] = str(self.mode)
        if self.credentials:
            out["credentials"] = dict(self.credentials)
        for key in ("cwd", "stdin"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def _stdin_of(subject: Subject) -> str:
    return f"sha256:{subject.stdin_sha256}" if subject.stdin_sha256 else match.NONE


def _cwd_matches(wanted: str, subject: Subject) -> bool:
    if wanted == match.NONE:
        return subject.cwd is None
    # Canonical as asked (no symlink, no . or ..): a directory that could lead elsewhere by the time
    # the job runs never matches.
    return subject.cwd == wanted and canonical(subject.cwd) == subject.cwd


@dataclass(frozen=True, slots=True)
class StageDecision:
    argv: tuple[str, ...]
    resolved: str | None  # the canonical binary the runner must execute
    decision: Verdict
    rule: str  # the deciding rule, DEFAULT_RULE or UNRESOLVED_RULE
    matched: tuple[str, ...] = ()  # every rule that matched, by name
    # The deciding rules' sandboxes merged (common/sandbox.merge); None: none of them has one.
    sandbox: Mapping[str, Any] | None = field(default=None, compare=False)
    deciding: tuple[str, ...] = ()  # every matched rule with the winning decision, by name
    # The deciding rules' credentials together ({name: path}; the first rule by name wins a name).
    credentials: Mapping[str, str] | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "resolved": self.resolved,
            "decision": self.decision,
            "rule": self.rule,
            "matched": list(self.matched),
            "deciding": list(self.deciding),
            "sandbox": dict(self.sandbox) if self.sandbox is not None else None,
        } | ({"credentials": sorted(self.credentials)} if self.credentials else {})


@dataclass(frozen=True, slots=True)
class Decision:
    decision: Verdict
    rule: str
    stages: tuple[StageDecision, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "rule": self.rule, "stages": [s.to_dict() for s in self.stages]}


def _pseudo_rank(name: str) -> int:
    # Among equally restrictive stages, name a real rule before a pseudo-rule:
    # "denied by no-dd" tells the agent more than "denied by default".
    return 2 if name == DEFAULT_RULE else 1 if name == UNRESOLVED_RULE else 0


def _decide_one(rules: Iterable[Rule], default: Verdict, unmatched: str) -> tuple[Verdict, str, tuple[str, ...]]:
    matched = sorted(rules, key=lambda r: (-_RANK[r.decision], r.name))
    if not matched:
        return default, unmatched, ()
    return matched[0].decision, matched[0].name, tuple(sorted(r.name for r in matched))


def _combine(stages: tuple[StageDecision, ...]) -> Decision:
    top = min(stages, key=lambda s: (-_RANK[s.decision], _pseudo_rank(s.rule), s.rule))
    return Decision(top.decision, top.rule, stages)


@dataclass(frozen=True, slots=True)
class Policy:
    default: Verdict
    rules: tuple[Rule, ...]
    sources: tuple[str, ...]
    warnings: tuple[str, ...] = ()  # e.g. a rule for a binary that is not installed
    # Issue 34: ``mode: shadow`` rules, kept apart so that nothing that decides ever sees them.
    shadow: tuple[Rule, ...] = ()
    # Issue 44: whether these are the files on disk, the last accepted copy, or none (closed).
    standing: Standing = field(default_factory=Standing)

    def decide(
        self, subject: Subject, stages: Sequence[Sequence[str]], *, resolver: Resolver | None = None
    ) -> Decision:
        """Decide a pipeline (one stage for a plain command).

        ``resolver`` defaults to `resolve_executable`; tests may pass another.
        """
        if not stages or any(not stage for stage in stages):
            raise ValueError("a pipeline needs at least one stage, and every stage an argv[0]")
        resolve = resolver or resolve_executable
        search_path = default_path(subject.target_uid)
        applicable = [r for r in self.rules if r.applies_to(subject)]
        out = []
        for stage in stages:
            argv = tuple(stage)
            resolved = resolve(argv[0], search_path)
            hits = [r for r in applicable if r.matches_command(resolved, argv[1:])]
            # An unresolvable argv[0] can match only rules without commands; unless
            # one of them denies it, it is denied as unresolved, whatever the default
            # or a rule's allow or ask: it cannot run (the agent is told "command not
            # found", exit 127, not spawn_failed: issue 44), and nothing that appears
            # there later was ever approved.
            default: Verdict = self.default if resolved is not None else "deny"
            unmatched = DEFAULT_RULE if resolved is not None else UNRESOLVED_RULE
            verdict, rule, names = _decide_one(hits, default, unmatched)
            if resolved is None and verdict != "deny":
                verdict, rule = "deny", UNRESOLVED_RULE
            deciding = [r for r in hits if r.decision == verdict]
            confined = merge_sandboxes(r.sandbox for r in deciding)
            deciding_names = tuple(sorted(r.name for r in deciding))
            secrets: dict[str, str] = {}
            for r in sorted(deciding, key=lambda r: r.name):
                for name, path in (r.credentials or {}).items():
                    secrets.setdefault(name, path)
            out.append(StageDecision(argv, resolved, verdict, rule, names, confined, deciding_names, secrets or None))
        return _combine(tuple(out))

    def decide_file(self, subject: Subject, tool: str, path: str) -> Decision:
        """Decide one file operation (issue 10): ``tool`` on ``path``.

        The path is canonicalised (symlinks resolved as far as they exist) so a
        link inside an allowed tree cannot reach outside it.  A relative path
        or an unknown tool is denied as UNRESOLVED_RULE before any rule is
        consulted: there is no file it could safely mean.
        """
        if tool not in match.FILE_TOOLS or not path.startswith("/") or "\0" in path:
            stage = StageDecision((tool, path), None, "deny", UNRESOLVED_RULE)
            return Decision("deny", UNRESOLVED_RULE, (stage,))
        try:
            canonical = match.canonical_head(path)
        except AirlockError:
            # A link along the path flipped while it was resolved (readlink of what lstat
            # saw as a link fails with EINVAL): no stable file to decide on, so denied.
            stage = StageDecision((tool, path), None, "deny", UNRESOLVED_RULE)
            return Decision("deny", UNRESOLVED_RULE, (stage,))
        hits = [r for r in self.rules if r.applies_to(subject) and r.matches_file(tool, canonical)]
        verdict, rule, names = _decide_one(hits, self.default, DEFAULT_RULE)
        deciding = tuple(sorted(r.name for r in hits if r.decision == verdict))
        stage = StageDecision((tool, path), canonical, verdict, rule, names, deciding=deciding)
        return Decision(verdict, rule, (stage,))

    def requirement(self, decision: Decision) -> Requirement:
        """What a request needs beyond the verdict: joined over every stage's deciding rules (quorum.py),
        all of them, not the one whose name sorts first."""
        by_name = {r.name: r for r in self.rules}
        names = sorted({name for s in decision.stages for name in (s.deciding or (s.rule,)) if name in by_name})
        return join((by_name[n].approvals, by_name[n].approvers, by_name[n].reason_required) for n in names)

    def allows_writable(self, decision: Decision, stages: Iterable[int]) -> bool:
        """Whether every deciding rule of each of these stages says ``writable_arguments: allow``.

        Every one, not the first by name: among rules with the same decision the
        most restrictive reading wins, whatever the rules are called (issue 27).
        """
        by_name = {r.name: r for r in self.rules}
        deciding = [
            by_name.get(name)
            for i in stages
            if i < len(decision.stages)
            for name in (decision.stages[i].deciding or (decision.stages[i].rule,))
        ]
        return bool(deciding) and all(rule is not None and rule.writable_arguments for rule in deciding)

    def reviewer_may(self, decision: Decision) -> str:
        """What the reviewer may do with this ask (issue 34): ``allow``, ``deny`` or ``advise``.

        The least any deciding rule of any asking stage grants: a rule without the
        key, a pseudo-rule (default, hold) or a quorum rule (more than one
        approver, or named approvers) gives ``advise``.
        """
        by_name = {r.name: r for r in self.rules}
        # The asking stages only: a stage a rule allows is allowed whatever the reviewer says.
        asking = [s for s in decision.stages if s.decision == "ask"] or list(decision.stages)
        names = {name for s in asking for name in (s.deciding or (s.rule,))}
        rank = {"advise": 0, "deny": 1, "allow": 2}
        least = "allow"
        for name in names or {""}:
            rule = by_name.get(name)
            may = "advise"
            if rule is not None and rule.reviewer is not None and rule.approvals == 1 and rule.approvers is None:
                may = rule.reviewer
            if rank[may] < rank[least]:
                least = may
        return least

    def shadow_verdicts(
        self,
        subject: Subject,
        stages: Sequence[Sequence[str]] | None = None,
        file: tuple[str, str] | None = None,
        *,
        resolver: Resolver | None = None,
    ) -> list[dict[str, str]]:
        """Each shadow rule that matches: the decision the policy would make were that rule live.

        The policy decides again with the one rule added, so the answer is what
        switching it on would change, combined with every other rule as usual.
        """
        out: list[dict[str, str]] = []
        for rule in self.shadow:
            if not rule.applies_to(subject):
                continue
            live = Policy(self.default, (*self.rules, dataclasses.replace(rule, mode=RuleMode.ENFORCE)), self.sources)
            try:
                if file is not None:
                    decision = live.decide_file(subject, *file)
                elif stages:
                    decision = live.decide(subject, stages, resolver=resolver)
                else:
                    continue
            except ValueError:
                continue
            if any(rule.name in s.matched for s in decision.stages):
                out.append({"rule": rule.name, "would": decision.decision, "by": decision.rule})
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "default": self.default,
            "rules": [r.to_dict() for r in sorted(self.rules, key=lambda r: r.name)],
            "sources": list(self.sources),
        }
        if self.shadow:
            out["shadow"] = [r.to_dict() for r in sorted(self.shadow, key=lambda r: r.name)]
        return out
