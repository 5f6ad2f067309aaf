"""``filesystem.execute`` of the gateway dialect, with no I/O.

``{operationId?, tool, arguments, traceContext?}`` becomes the agent door's
native file verb (``files_read`` … ``files_edit``) with snake_case arguments;
the native outcome becomes the dialect's terminal filesystem result in
camelCase.  Tool names are accepted with or without the ``files_`` prefix.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any, Final

from airlock.common.fileop_spec import TOOL_NAMES
from airlock.gateway.params import TraceContext, parse_trace_context
from airlock.gateway.protocol import PROTOCOL_VERSION, invalid

TOOLS: Final = TOOL_NAMES

# Dialect argument -> native parameter, per tool (aliases share a target).
_ARGS: Final[dict[str, dict[str, str]]] = {
    "files_read": {"offsetBytes": "offset_bytes", "lengthBytes": "length_bytes", "maxBytes": "length_bytes"},
    "files_inspect": {},
    "files_list": {"limit": "limit"},
    "files_find": {"pattern": "pattern", "maxDepth": "max_depth", "limit": "limit"},
    "files_search": {"query": "query", "regex": "regex", "glob": "glob", "maxDepth": "max_depth", "limit": "limit"},
    "files_write": {
        "content": "content",
        "contentBase64": "content",
        "create": "create",
        "mode": "mode",
        "expectedSha256": "expected_sha256",
    },
    "files_edit": {
        "oldText": "old_text",
        "newText": "new_text",
        "oldString": "old_text",
        "newString": "new_text",
        "expectedSha256": "expected_sha256",
    },
}

# Native outcome field -> dialect field.
_RESULT: Final = {
    "offset_bytes": "offsetBytes",
    "length_bytes": "lengthBytes",
    "size_bytes": "sizeBytes",
    "next_offset_bytes": "nextOffsetBytes",
    "eof": "eof",
    "type": "type",
    "mode": "mode",
    "owner_uid": "ownerUid",
    "owner_gid": "ownerGid",
    "owner": "owner",
    "group": "group",
    "mtime": "mtime",
    "sha256": "sha256",
    "link_target": "linkTarget",
    "entries": "entries",
    "paths": "paths",
    "matches": "matches",
    "files_scanned": "filesScanned",
    "truncated": "truncated",
    "before_sha256": "beforeSha256",
    "after_sha256": "afterSha256",
    "created": "created",
    "diff": "diff",
    "started_at": "startedAt",
    "ended_at": "endedAt",
    "duration_ms": "durationMs",
    "uid": "uid",
    "gid": "gid",
    "hostname": "hostname",
    "decision": "decision",
    "path": "path",
}


@dataclass(frozen=True, slots=True)
class FsParams:
    tool: str
    path: str
    arguments: dict[str, Any]  # native parameters
    operation_id: str | None = None
    trace: TraceContext | None = None

    def to_native(self, *, privileged: bool, time: str) -> dict[str, Any]:
        """The native file verb's args; the trace context stays out (transport context only)."""
        args = {"path": self.path, "privileged": privileged, "time": time} | self.arguments
        if self.operation_id is not None:
            args["operation_id"] = self.operation_id
        return args


def parse(params: dict[str, Any]) -> FsParams:
    tool = params.get("tool")
    if not isinstance(tool, str) or not tool:
        raise invalid("tool", f"must be one of {', '.join(TOOLS)}")
    native_tool = tool if tool.startswith("files_") else f"files_{tool}"
    if native_tool not in TOOLS:
        raise invalid("tool", f"unknown tool {tool!r} (known: {', '.join(TOOLS)})")
    arguments = params.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise invalid("arguments", "must be an object")
    path = arguments.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise invalid("arguments.path", "must be an absolute path")
    table = _ARGS[native_tool]
    native: dict[str, Any] = {}
    for key, value in arguments.items():
        if key == "path":
            continue
        target = table.get(key)
        if target is None:
            raise invalid(f"arguments.{key}", f"is not an argument of {native_tool}")
        if key == "content":
            if not isinstance(value, str):
                raise invalid("arguments.content", "must be a string (UTF-8 text; use contentBase64 for bytes)")
            value = base64.b64encode(value.encode("utf-8")).decode("ascii")
        if target in native:
            raise invalid(f"arguments.{key}", "given twice (under two names)")
        native[target] = value
    operation_id = params.get("operationId")
    if operation_id is not None and (not isinstance(operation_id, str) or not operation_id or len(operation_id) > 128):
        raise invalid("operationId", "must be a non-empty string of at most 128 characters")
    return FsParams(native_tool, path, native, operation_id, parse_trace_context(params.get("traceContext")))


def _text(b64: Any) -> tuple[str, bytes]:
    try:
        raw = base64.b64decode(b64 if isinstance(b64, str) else "", validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    return raw.decode("utf-8", errors="replace"), raw


def result(outcome: dict[str, Any]) -> dict[str, Any]:
    """The terminal filesystem result: ``ok``/``error`` say whether the operation itself succeeded."""
    out: dict[str, Any] = {
        "operationId": outcome.get("operation_id"),
        "protocolVersion": PROTOCOL_VERSION,
        "tool": outcome.get("tool"),
        "ok": bool(outcome.get("ok")),
        "error": outcome.get("error"),
        "replayed": bool(outcome.get("replay")),
    }
    for native, name in _RESULT.items():
        if native in outcome:
            out[name] = outcome[native]
    if "entries" in out:
        out["entries"] = [
            {"name": e.get("name"), "type": e.get("type"), "sizeBytes": e.get("size_bytes")} for e in out["entries"]
        ]
    if "content" in outcome:
        text, raw = _text(outcome["content"])
        out["content"] = text
        out["encoding"] = "utf-8"
        # The hash describes the delivered text; the fingerprint the bytes read.
        out["contentSha256"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
        out["fingerprint"] = outcome.get("content_sha256")
        out["truncated"] = False
        out["transportTruncated"] = False
        out["incomplete"] = False
        if text.encode("utf-8") != raw:
            out["lossy"] = True  # not valid UTF-8: some bytes became U+FFFD
    if outcome.get("output_retained") is False:
        out["outputRetained"] = False
    return out
