"""`airlock policy check` and `airlock config show`: what policy and configuration say, without running anything."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from airlock.cli.base import _err, _operator
from airlock.common import render, sandbox


def cmd_policy_check(ns: argparse.Namespace) -> int:
    if not ns.command:
        _err("policy check: give a command after --")
        return 2
    args: dict[str, Any] = {"argv": ns.command, "privileged": ns.privileged}
    if ns.user:
        args["user"] = ns.user
    if ns.session:
        args["session"] = ns.session
    rc, data = _operator(ns, "policy.check", args)
    if rc == 0 and not ns.json:
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
        for warning in data.get("warnings") or []:
            _err(f"policy warning: {render.sanitise(warning)}")
    return rc


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
    return 0
