"""A rule's run_as (issue 48, sudo's Runas_Spec): which accounts a privileged job may run as."""

from __future__ import annotations

import os

from airlock.approval.policy import assemble
from airlock.approval.policyfile import parse_policy_text
from airlock.approval.rules import DEFAULT_RULE, Policy, Subject

ID = os.path.realpath("/usr/bin/id")


def policy(body: str) -> Policy:
    text = "policy:\n  default: ask\n  rules:\n" + "\n".join("    " + line for line in body.strip("\n").splitlines())
    return assemble([parse_policy_text(text, "/etc/airlock/airlock.yaml", main=True)])


RULES = policy(
    """
- name: as-root
  decision: allow
  commands: [[/usr/bin/id, "..."]]
- name: as-services
  decision: allow
  run_as: [postgres, "33"]
  commands: [[/usr/bin/id, "..."]]
"""
)


def as_account(uid: int, name: str = "") -> Subject:
    return Subject(1000, "deploy", frozenset({"deploy"}), None, True, uid, name)


def test_a_rule_without_run_as_allows_root_alone() -> None:
    assert RULES.decide(as_account(0), [["id"]]).rule == "as-root"
    decided = RULES.decide(as_account(1234, "backup"), [["id"]])
    assert decided.decision == "ask" and decided.rule == DEFAULT_RULE


def test_run_as_names_accounts_by_name_or_uid() -> None:
    assert RULES.decide(as_account(101, "postgres"), [["id"]]).rule == "as-services"
    assert RULES.decide(as_account(33, "www-data"), [["id"]]).rule == "as-services"


def test_a_rule_with_run_as_does_not_allow_root_unless_it_names_it() -> None:
    only = policy(
        """
- name: as-postgres
  decision: allow
  run_as: [postgres]
"""
    )
    assert only.decide(as_account(0), [["id"]]).rule == DEFAULT_RULE
    assert only.decide(as_account(101, "postgres"), [["id"]]).rule == "as-postgres"


def test_run_as_shows_in_the_rule() -> None:
    assert RULES.rules[1].to_dict()["run_as"] == ["33", "postgres"]
    assert "run_as" not in RULES.rules[0].to_dict()
