"""Any input yields a policy or a PolicyError, never another exception."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.approval.policyfile import PolicyError, parse_policy_text

KEYS = [
    "name",
    "decision",
    "users",
    "groups",
    "sessions",
    "privileged",
    "commands",
    "files",
    "tools",
    "paths",
    "rules",
    "default",
    "policy",
    "x",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5000),
    st.floats(allow_nan=False),
    st.sampled_from(
        ["allow", "ask", "deny", "/usr/bin/true", "/bin/sh", "...", "{p}", "{a-b}", "files_read", "/etc/...", "", "x y"]
    ),
    st.text(max_size=8),
)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=25,
)


def parse(text: str, main: bool) -> None:
    try:
        parse_policy_text(text, "/f.yaml", main=main)
    except PolicyError as exc:
        assert exc.errors and all(line.startswith("/f.yaml") for line in exc.errors)


@settings(max_examples=400, deadline=None)
@given(value=values, main=st.booleans())
def test_arbitrary_structures(value: Any, main: bool) -> None:
    parse(yaml.safe_dump(value), main)
    parse(yaml.safe_dump({"rules": value}), main)
    parse(yaml.safe_dump({"policy": {"rules": value}}), main)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("rules:-[]{}, \n\"'&*!|>#name0.%@`")), max_size=60), main=st.booleans()
)
def test_arbitrary_text(text: str, main: bool) -> None:
    parse(text, main)
