"""The policy: airlock.yaml's ``policy:`` node and policy.d/*.yaml, loaded as one.

`load_policy` reads every file (`policyfile` parses each) and `assemble`s
them: rule names unique across all files, one default.  A policy with any
error is rejected whole with every problem (`PolicyError`).  What the policy
is and how it decides: `rules`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from airlock.approval.policyfile import PolicyError, PolicyFile, parse_policy_node, parse_policy_text
from airlock.approval.rules import Policy, RuleMode, Verdict
from airlock.common.config import Config

# `airlock dev up` (cli/dev.py) checks a policy with load_policy and reports a PolicyError.
__all__ = ["PolicyError", "assemble", "load_policy", "load_policy_texts", "policy_from_texts"]


def assemble(files: Sequence[PolicyFile]) -> Policy:
    """One policy from parsed files: rule names unique across all; default ``ask`` when unset."""
    errors: list[str] = []
    defaults = [f for f in files if f.default is not None]
    if len(defaults) > 1:
        errors.append(f"{defaults[1].path}: policy.default: set more than once (also in {defaults[0].path})")
    first: dict[str, str] = {}
    for policy_file in files:
        sources = {r.name: r.source for r in policy_file.rules}
        for name, where, key in policy_file.name_sites:
            if name in first:
                errors.append(
                    f"{where}: {key}.name: duplicate rule name, first defined at {first[name]} (got {name!r})"
                )
            else:
                first[name] = sources[name]
    if errors:
        raise PolicyError(errors)
    default: Verdict = defaults[0].default if defaults and defaults[0].default else "ask"
    rules = tuple(r for f in files for r in f.rules if r.mode != RuleMode.SHADOW)
    shadow = tuple(r for f in files for r in f.rules if r.mode == RuleMode.SHADOW)
    warnings = tuple(w for f in files for w in f.warnings)
    return Policy(default, rules, tuple(f.path for f in files), warnings, shadow)


def load_policy(config: Config) -> Policy:
    """The whole policy: airlock.yaml's ``policy:`` node, then policy.d/*.yaml in name order.

    Every file is read and checked before anything is rejected, so one run
    reports every problem.  A missing policy.d directory is fine.
    """
    return load_policy_texts(config)[0]


def load_policy_texts(config: Config) -> tuple[Policy, list[dict[str, Any]]]:
    """`load_policy`, and the texts it accepted: what approval keeps as its last good copy (issue 44).

    airlock.yaml's ``policy:`` node is kept as a bare policy document; each policy.d file as the
    bytes that were parsed (not read again: a file changed in between would be kept unchecked).
    """
    files: list[PolicyFile] = []
    texts: list[dict[str, Any]] = []
    errors: list[str] = []
    try:
        files.append(parse_policy_node(config.policy_node, config.source))
        main = "" if config.policy_node is None else yaml.serialize(config.policy_node, Dumper=yaml.SafeDumper)
        texts.append({"path": config.source, "text": main, "main": True})
    except PolicyError as exc:
        errors.extend(exc.errors)
    for path in _dropin_paths(config.paths.policy_dir, errors):
        try:
            text = path.read_text(encoding="utf-8")
            files.append(parse_policy_text(text, str(path), main=False))
            texts.append({"path": str(path), "text": text, "main": False})
        except PolicyError as exc:
            errors.extend(exc.errors)
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{path}: cannot read: {exc}")
    try:
        policy = assemble(files)
    except PolicyError as exc:
        errors.extend(exc.errors)
    if errors:
        raise PolicyError(errors)
    return policy, texts


def policy_from_texts(texts: Sequence[dict[str, Any]]) -> Policy:
    """The policy of kept texts (`load_policy_texts`' second half); PolicyError if they no longer parse."""
    files = [
        parse_policy_text(str(t.get("text", "")), f"{t.get('path')} (last accepted copy)", main=bool(t.get("main")))
        for t in texts
    ]
    return assemble(files)


def _dropin_paths(directory: Path, errors: list[str]) -> list[Path]:
    try:
        entries = sorted(directory.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        errors.append(f"{directory}: cannot read policy directory: {exc}")
        return []
    # Dot-files are editor and tool leftovers, never policy.
    return [p for p in entries if p.name.endswith(".yaml") and not p.name.startswith(".")]
