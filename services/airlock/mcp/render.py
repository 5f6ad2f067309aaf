"""What airlock answered, as the text an MCP client's model reads: the evidence of a run, or why it did not run.

Pure: no I/O.  `render_evidence` shows each stream's head within the call's output
limit (and the whole result within `tools.RESULT_BUDGET`), saying what was
cut and the sha256 of what was whole; `render_refusal` says why a request did
not run and what to do next; `unreachable` says airlock could not be reached.
``is_error`` is set only when the command did not run.  Split from
`mcp/tools`, which keeps the tools' descriptions and argument checks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airlock.mcp.tools import OUTPUT_DEFAULT, OUTPUT_MAX, RESULT_BUDGET, KiB, ToolResult


def _raw(data: Any) -> bytes | None:
    """Base64 output to bytes; None when airlock sent something else."""
    if not isinstance(data, str) or not data:
        return b""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _head(raw: bytes, limit: int) -> bytes:
    """At most ``limit`` bytes, not ending inside a UTF-8 character."""
    if len(raw) <= limit:
        return raw
    cut = raw[:limit]
    # Back off over a character the cut split (at most 3 bytes of it).
    for back in range(1, min(4, len(cut)) + 1):
        byte = cut[-back]
        if byte < 0x80:
            break
        if byte >= 0xC0:  # a lead byte: is its character complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if back < need:
                cut = cut[:-back]
            break
    return cut


def _looks_binary(raw: bytes, text: str) -> bool:
    # NUL bytes, or a quarter of it not UTF-8: not text a model can use.
    return b"\x00" in raw or (len(raw) >= 64 and text.count("\ufffd") * 4 > len(text))


def _shown(argv: Any) -> str:
    if not isinstance(argv, list):
        return "?"
    text = " ".join(str(a) for a in argv)
    return text if len(text) <= 80 else text[:77] + "..."


def _stage_status(stage: Mapping[str, Any]) -> str:
    signal = stage.get("signal")
    if isinstance(signal, int) and stage.get("exit_code") is None:
        return f"killed by signal {signal}"
    code = stage.get("exit_code")
    return f"exit code {code}" if isinstance(code, int) else "no exit code"


@dataclass(frozen=True, slots=True)
class _Cut:
    """What one stream's section left out."""

    title: str
    shown: int
    size: int
    captured_all: bool


def _section(title: str, data: Any, truncated: bool, sha256: Any, limit: int, cuts: list[_Cut]) -> list[str]:
    raw = _raw(data)
    if raw is None:
        return [f"--- {title} ---", "[airlock sent output that is not base64]"]
    digest = sha256 if isinstance(sha256, str) else hashlib.sha256(raw).hexdigest()
    size = len(raw)
    if not raw:
        return [f"--- {title} ---", "(empty)"]
    whole = f"{size} bytes" if not truncated else f"more than {size} bytes (airlock captured the first {size})"
    probe = raw[: min(size, 64 * KiB)].decode("utf-8", "replace")
    if _looks_binary(raw[: 64 * KiB], probe):
        cuts.append(_Cut(title, 0, size, not truncated))
        return [
            f"--- {title} (binary, {whole}, sha256 {digest} of {size} bytes; not shown) ---",
            "(binary output: pipe it through `base64` or `xxd | head` to see it as text)",
        ]
    head = _head(raw, limit)
    text = head.decode("utf-8", "replace")
    notes = []
    if len(head) < size or truncated:
        cuts.append(_Cut(title, len(head), size, not truncated))
        notes.append(
            f"CUT: showing the first {len(head)} of {whole}; sha256 {digest} of the {size} bytes airlock captured"
        )
    if text != head.decode("utf-8", "ignore"):
        notes.append("not valid UTF-8; undecodable bytes shown as U+FFFD")
    title_line = f"--- {title}" + (f" ({'; '.join(notes)})" if notes else "") + " ---"
    return [title_line, text.rstrip("\n")]


def _cut_note(cuts: list[_Cut], limit: int) -> list[str]:
    if not cuts:
        return []
    names = ", ".join(c.title for c in cuts)
    lost = [f"{c.title} at {c.size} bytes" for c in cuts if not c.captured_all]
    lines = [
        "",
        f"Output was cut ({names}): each stream shows at most {limit} bytes. airlock keeps no copy of the "
        "output: its audit journal records each stream's size and sha256 (an operator sees them with "
        "`airlock audit export`, by operation id), so what was cut cannot be fetched later. To see more, run "
        "a command that prints less "
        "(head, tail, grep, sed -n 'A,Bp', journalctl -n), or call again with a larger max_output_bytes (at "
        f"most {OUTPUT_MAX}).",
    ]
    if lost:
        lines.append(
            f"airlock stopped capturing {', '.join(lost)}; the rest was discarded "
            "unread, so its full size is not known."
        )
    return lines


def _decision(decision: Any) -> str:
    if not isinstance(decision, dict):
        return ""
    rule, by = decision.get("rule"), decision.get("decided_by")
    if by in (None, "policy"):
        return f"allowed by policy rule {rule!r}" if rule else "allowed by policy"
    return f"approved by operator {by}" + (f" (rule {rule!r})" if rule else "")


def render_evidence(data: Mapping[str, Any], limit: int = OUTPUT_DEFAULT) -> ToolResult:
    """The evidence of a command that ran, whatever its exit code.

    Each stream shows at most ``limit`` bytes; when the whole text would still
    be too large for one MCP message (many pipeline stages), the per-stream
    limit is halved until it fits `RESULT_BUDGET`.
    """
    while True:
        result = _render_evidence(data, limit)
        if (
            limit <= 1024
            or len(json.dumps(result.text, ensure_ascii=False).encode("utf-8", "replace")) <= RESULT_BUDGET
        ):
            return result
        limit //= 2


def _render_evidence(data: Mapping[str, Any], limit: int) -> ToolResult:
    stages = [s for s in data.get("stages") or [] if isinstance(s, dict)]
    last = stages[-1] if stages else {}
    lines: list[str] = []
    if data.get("cancelled"):
        lines.append(f"The command was CANCELLED before it finished ({_stage_status(last)}).")
    elif data.get("timed_out"):
        reason = data.get("timeout_reason")
        lines.append(f"The command TIMED OUT{f' ({reason})' if reason else ''} and was killed ({_stage_status(last)}).")
    else:
        lines.append(f"The command ran: {_stage_status(last)}.")
    if len(stages) > 1:
        parts = [f"stage {i} ({_shown(s.get('argv'))}): {_stage_status(s)}" for i, s in enumerate(stages, 1)]
        lines.append("Pipeline: " + "; ".join(parts) + ".")
    facts = [f"operation {data.get('operation_id')}"]
    if isinstance(data.get("uid"), int):
        facts.append(f"ran as uid {data['uid']}" + (f" in {data['cwd']}" if data.get("cwd") else ""))
    if isinstance(data.get("duration_ms"), int):
        facts.append(f"{data['duration_ms']} ms")
    decided = _decision(data.get("decision"))
    if decided:
        facts.append(decided)
    lines.append("; ".join(facts) + ".")
    if data.get("replay"):
        lines.append("This is the recorded outcome of an earlier run of the same operation; it did not run again.")
    if data.get("output_retained") is False:
        lines.append("Its output was too large to keep for replay; only exit codes are known.")
    lines.append("")
    cuts: list[_Cut] = []
    lines += _section(
        "stdout", data.get("stdout"), bool(data.get("stdout_truncated")), data.get("stdout_sha256"), limit, cuts
    )
    for i, stage in enumerate(stages, 1):
        title = "stderr" if len(stages) == 1 else f"stderr of stage {i} ({_shown(stage.get('argv'))})"
        lines += _section(
            title,
            stage.get("stderr"),
            bool(stage.get("stderr_truncated")),
            stage.get("stderr_sha256"),
            limit,
            cuts,
        )
    lines += _cut_note(cuts, limit)
    return ToolResult("\n".join(lines))


def render_refusal(code: str, message: str, details: Mapping[str, Any]) -> ToolResult:
    """A request that did not run: denied, not approved in time, or refused by airlock."""
    rule = details.get("rule")
    by = details.get("decided_by")
    if code == "command_not_found" or (code == "denied" and rule == "unresolved" and by in (None, "policy")):
        # Not a judgement on the command: airlock could not find the program.
        return ToolResult(
            "NOT RUN: airlock could not find the program (policy rule 'unresolved' refuses a command whose "
            "binary cannot be resolved in the target user's PATH, or a relative path). Check the program name "
            "or give its absolute path.",
            is_error=True,
        )
    if code == "denied":
        who = (
            f"policy rule {rule!r}"
            if by in (None, "policy")
            else f"operator {by}" + (f" (rule {rule!r})" if rule else "")
        )
        # airlock's message is "denied by <who>[: <reason>]": keep only what it adds.
        said = message.partition(": ")[2] if message.startswith("denied by") else message
        return ToolResult(
            f"DENIED by {who}{': ' + said if said else ''}. The command did not run. Do not retry it, or a variant "
            "meant to get around the denial; take another approach, or tell the user what you need and why.",
            is_error=True,
        )
    if code == "approval_timeout":
        return ToolResult(
            f"NOT RUN: no operator approved it in time ({message}"
            + (f"; rule {rule!r} asks an operator" if rule else "")
            + "). Nobody denied it either; the operator may be away. Tell the user the command needs an "
            "operator's approval (while it waits they see it with `airlock pending` and approve it with "
            "`airlock approve ID`), and call again only when they are ready to approve it.",
            is_error=True,
        )
    field = details.get("field")
    if code == "invalid_arguments" and field == "payload":
        # The journal's cap on one audit record, which holds the whole request.
        return ToolResult(
            "NOT RUN: the request is too large for airlock's audit record, which holds it whole "
            f"({message}). Make stdin, argv/pipeline/command, env or reason shorter (for a lot of input, have "
            "the command read a file) and call again.",
            is_error=True,
        )
    hint = {
        "invalid_arguments": "Fix the named field and call again.",
        "privilege_unavailable": "Run it with privileged: false, or ask the user to run airlock as root.",
        "busy": "airlock is busy; wait a little and try again.",
        "spawn_failed": "Check the program name and path.",
        "binary_changed": "The program changed on disk since it was approved; it did not run. Ask again if the "
        "change is expected.",
        "unsafe_binary": "A privileged run needs a program that only root can change; use a system binary or ask "
        "the user.",
        "unauthorized": "This user may not use airlock; ask the user to check the `agents` setting.",
        "approval_interrupted": "The approval service restarted while the command waited; it did not run. You may "
        "try again.",
    }.get(code, "The command did not run.")
    where = f" (field {field})" if isinstance(field, str) else ""
    return ToolResult(f"NOT RUN: airlock refused the request: {code}{where}: {message}. {hint}", is_error=True)


def unreachable(path: str, why: str) -> ToolResult:
    return ToolResult(
        f"NOT RUN: airlock is not reachable at {path}: {why}. Ask the user to check `systemctl status airlock.socket` "
        "(or that `airlock mcp --socket` points at the right socket).",
        is_error=True,
    )
