"""`airlock policy check`, `airlock policy shadow` and `airlock config show`.

What the policy, the journal's shadow decisions (issue 34) and the configuration say, without running anything.
"""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airlock.cli.base import _err, _operator
from airlock.common import render, sandbox
from airlock.common.wire import operator as op


def cmd_policy_check(ns: argparse.Namespace) -> int:
    if ns.files is not None:
        return check_files(ns.files, ns.config, quiet=ns.quiet)
    if ns.command and ns.command[0] == "--":
        ns.command = ns.command[1:]
    if not ns.command:
        _err("policy check: give a command after -- (or --files to check the files on disk)")
        return 2
    args: dict[str, Any] = {"argv": ns.command, "privileged": ns.privileged}
    if ns.user:
        args["user"] = ns.user
    if ns.session:
        args["session"] = ns.session
    if ns.cwd:
        args["cwd"] = ns.cwd
    if ns.stdin_file:
        try:
            args["stdin"] = base64.b64encode(Path(ns.stdin_file).read_bytes()).decode()
        except OSError as exc:
            _err(f"policy check: cannot read {ns.stdin_file}: {exc.strerror}")
            return 2
    rc, data = _operator(ns, op.POLICY_CHECK, op.PolicyCheck(**args))
    if rc == 0 and not ns.json:
        checked = data.get("checked_as") or {}
        print(f"checked as: {render.sanitise(checked.get('user'))} (uid {checked.get('uid')})")
        for stage in data.get("stages", []):
            print(
                f"{' '.join(stage.get('argv', []))}: {stage.get('decision')} (rule {stage.get('rule')}; binary "
                f"{stage.get('resolved')})"
            )
            if stage.get("decision") != "deny":
                deciding = stage.get("deciding") or []
                merged = f" (merged from rules {', '.join(deciding)})" if len(deciding) > 1 else ""
                print(f"  sandbox: {sandbox.describe(stage.get('sandbox'))}{merged}")
        print(f"decision: {data.get('decision')} (rule {data.get('rule')})")
        if data.get("reviewer_may"):  # issue 34
            print(f"reviewer: may {data['reviewer_may']}")
        for shadow in data.get("shadow") or []:
            print(
                f"shadow rule {render.sanitise(shadow.get('rule'), strict=True)} would decide: "
                f"{render.sanitise(shadow.get('would'))}"
            )
        for warning in data.get("warnings") or []:
            _err(f"policy warning: {render.sanitise(warning)}")
        if data.get("policy_note"):  # issue 44: the running service refused the files on disk
            _err(f"policy: {render.sanitise(data['policy_note'])}")
    return rc


def check_files(paths: list[str], config_path: str | None, *, quiet: bool = False) -> int:
    """`airlock policy check --files [PATH…]`: the policy on disk, checked without a running service.

    No PATH: what approval would load (airlock.yaml's ``policy:`` and policy.d/).  PATHs: those
    files (a directory: its *.yaml), as policy.d files, or as the main policy for airlock.yaml
    itself.  Every error is printed; exit 1 if any (visudo -c).  The units' ExecReload= runs it
    first, so `systemctl reload` fails on a policy approval would refuse (issue 44).
    """
    from airlock.approval.policy import PolicyError, assemble, load_policy_texts
    from airlock.approval.policyfile import PolicyFile, parse_policy_text
    from airlock.common import config as configuration

    try:
        if not paths:
            cfg = configuration.load(Path(config_path) if config_path else None)
            policy, texts = load_policy_texts(cfg)
            checked = [t["path"] for t in texts]
        else:
            files: list[PolicyFile] = []
            errors: list[str] = []
            checked = []
            for named in paths:
                path = Path(named)
                targets = (
                    sorted(p for p in path.glob("*.yaml") if not p.name.startswith(".")) if path.is_dir() else [path]
                )
                for target in targets:
                    checked.append(str(target))
                    try:
                        text = target.read_text(encoding="utf-8")
                        files.append(parse_policy_text(text, str(target), main=target.name == "airlock.yaml"))
                    except PolicyError as exc:
                        errors.extend(exc.errors)
                    except (OSError, UnicodeDecodeError) as exc:
                        errors.append(f"{target}: cannot read: {exc}")
            if errors:
                raise PolicyError(errors)
            policy = assemble(files)
    except configuration.ConfigError as exc:
        _err(f"policy check: {exc}")
        return 1
    except PolicyError as exc:
        for error in exc.errors:
            _err(error)
        _err(f"policy check: refused ({len(exc.errors)} error{'s' if len(exc.errors) != 1 else ''})")
        return 1
    for warning in policy.warnings:
        _err(f"policy warning: {warning}")
    if not quiet:
        print(
            f"ok: {len(policy.rules)} rule(s), default {policy.default}, from {len(checked)} file(s): "
            + ", ".join(checked)
        )
    return 0


def cmd_config_check(ns: argparse.Namespace) -> int:
    """`airlock config check`: airlock.yaml and the policy, checked without a running service (exit 1 on errors)."""
    from airlock.common import config as configuration

    try:
        cfg = configuration.load(Path(ns.config) if ns.config else None)
    except configuration.ConfigError as exc:
        _err(str(exc))
        _err("config check: refused")
        return 1
    if not ns.quiet:
        print(f"ok: {cfg.source}")
    return check_files([], ns.config, quiet=ns.quiet)


def cmd_config_show(ns: argparse.Namespace) -> int:
    from airlock.common import config as configuration

    try:
        cfg = configuration.load(Path(ns.config) if ns.config else None)
    except configuration.ConfigError as exc:
        _err(str(exc))
        return 1
    if ns.json:
        print(json.dumps(cfg.to_dict(), indent=2))
    else:
        import yaml

        print(f"# effective configuration from {cfg.source}")
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        for key, why in cfg.derived:  # a value another setting chose is said, not left to surprise (issue 44)
            section, name = key.split(".", 1)
            print(f"# {key} is {getattr(getattr(cfg, section), name)!r} because {why}")
    return 0


# --- airlock policy shadow (issue 34) ----------------------------------------------------

# What actually happened to a request, from its approval.decided record.
_FINAL = {"allow": "allowed", "deny": "denied"}
MAX_LISTED = 10


def shadow_report(events: Iterable[dict[str, Any]], since: float | None) -> dict[str, Any]:
    """Per shadow rule: the requests it matched, and whether its decision agrees with what happened.

    Pure.  A shadow ``allow`` or ``deny`` agrees when the request ended so
    (however it got there: a rule, a grant, the reviewer or a person),
    disagrees when it ended the other way, and is undecided when it never
    ended either way (timeout, withdrawn).  A shadow ``ask`` agrees when the
    real policy asked too (a person, a grant or the reviewer then decided)
    and disagrees when a rule decided at once.
    """
    rules: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.get("kind") != "approval.decided":
            continue
        when = _when(event.get("time"))
        if since is not None and (when is None or when < since):
            continue
        payload = event.get("payload") or {}
        shadow = payload.get("shadow")
        if not isinstance(shadow, list):
            continue
        final = _FINAL.get(str(payload.get("decision")), "undecided")
        real_policy = (payload.get("policy") or {}).get("decision") if isinstance(payload.get("policy"), dict) else None
        asked = payload.get("by") != "policy" or real_policy == "ask"
        by = str(payload.get("by") or "policy")
        for item in shadow:
            if not isinstance(item, dict) or not isinstance(item.get("rule"), str):
                continue
            would = str(item.get("would"))
            if would == "ask":
                verdict = "agree" if asked else "disagree"
            elif final == "undecided":
                verdict = "undecided"
            else:
                verdict = "agree" if _FINAL.get(would) == final else "disagree"
            row = rules.setdefault(
                item["rule"],
                {"rule": item["rule"], "matched": 0, "agree": 0, "disagree": 0, "undecided": 0, "outcomes": {}},
            )
            row["matched"] += 1
            row[verdict] += 1
            happened = final if would != "ask" else ("asked" if asked else f"{final} by rule")
            counts = row["outcomes"].setdefault(f"would {would}", {})
            counts[happened] = counts.get(happened, 0) + 1
            if verdict == "disagree" and len(row.setdefault("disagreements", [])) < MAX_LISTED:
                row["disagreements"].append(
                    {
                        "request_id": event.get("request_id"),
                        "would": would,
                        "decision": payload.get("decision"),
                        "by": by,
                    }
                )
    return {"since": since, "rules": [rules[name] for name in sorted(rules)]}


def _when(value: object) -> float | None:
    from datetime import UTC, datetime

    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def cmd_policy_shadow(ns: argparse.Namespace) -> int:
    """`airlock policy shadow [--since 7d]`: the journal's shadow decisions against the real ones."""
    import time

    from airlock.common import client

    since = time.time() - ns.since if ns.since else None
    try:
        events = (event for page in client.event_pages(client.operator_socket(ns.socket)) for event in page)
        report = shadow_report(events, since)
    except client.ClientError as exc:
        _err(str(exc))
        return 1
    if ns.json:
        print(json.dumps(report, indent=2))
        return 0
    if not report["rules"]:
        print("no shadow rule matched a request" + (" in that time" if since else ""))
        return 0
    print(f"{'RULE':<24} {'MATCHED':>7} {'AGREE':>6} {'DISAGREE':>8} {'UNDECIDED':>9}")
    for row in report["rules"]:
        name = render.sanitise(row["rule"], strict=True)
        print(f"{name:<24} {row['matched']:>7} {row['agree']:>6} {row['disagree']:>8} {row['undecided']:>9}")
        for would, counts in sorted(row["outcomes"].items()):
            listed = ", ".join(f"{render.sanitise(k)} {v}" for k, v in sorted(counts.items()))
            print(f"  {would}: {listed}")
        for item in row.get("disagreements") or []:
            print(
                f"  disagrees: {render.sanitise(item.get('request_id'), strict=True)} would {item.get('would')}, "
                f"{render.sanitise(item.get('decision'))} by {render.sanitise(item.get('by'))}"
            )
    return 0
