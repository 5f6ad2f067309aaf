"""What a file operation is: the spec approval approves and the runner runs.

The file-tool counterpart of `spec.ExecSpec`: the tool, the absolute path, as
whom (``privileged`` / ``uid``) and the tool's parameters, checked per tool.
Its digest binds an approval ticket to exactly this operation and keys
operation replay.  Pure: no I/O; every service rebuilds it with `from_dict` and checks
it again (defence in depth).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from typing import Any, Final

from airlock.common import validate
from airlock.common.codec import canonical_json
from airlock.common.errors import AirlockError, ErrorCode

# The file tools, in the order they are listed to agents and operators; the one list of them.
TOOL_NAMES: Final = (
    "files_read",
    "files_inspect",
    "files_list",
    "files_find",
    "files_search",
    "files_write",
    "files_edit",
)
WRITE_TOOLS: Final = frozenset({"files_write", "files_edit"})
FILE_TOOLS: Final = frozenset(TOOL_NAMES)
READ_TOOLS: Final = FILE_TOOLS - WRITE_TOOLS

MAX_READ_BYTES: Final = 1024 * 1024
MAX_LIMIT: Final = 10_000
MAX_DEPTH: Final = 64
MAX_TEXT: Final = 768 * 1024  # edit texts; the request line itself is capped at 1 MiB

# Per tool: parameter -> (kind, default).  Defaults are filled in, so the spec
# (and its digest) is the same whether a default was written out or not.
_PARAMS: Final[dict[str, dict[str, tuple[str, Any]]]] = {
    "files_read": {"offset_bytes": ("uint", 0), "length_bytes": ("length", MAX_READ_BYTES)},
    "files_inspect": {},
    "files_list": {"limit": ("limit", 1000)},
    "files_find": {"pattern": ("glob", "*"), "max_depth": ("depth", 16), "limit": ("limit", 1000)},
    "files_search": {
        "query": ("query", None),
        "regex": ("bool", False),
        "glob": ("glob", "*"),
        "max_depth": ("depth", 16),
        "limit": ("limit", 200),
    },
    "files_write": {
        "content": ("base64", None),
        "create": ("bool", True),
        "mode": ("mode", None),
        "expected_sha256": ("sha256", None),
    },
    "files_edit": {"old_text": ("query", None), "new_text": ("text", None), "expected_sha256": ("sha256", None)},
}


def _param(tool: str, name: str, kind: str, value: Any, default: Any) -> Any:
    where = f"{name}"
    if value is None:
        if default is None and kind in ("query", "text", "base64"):
            raise validate.bad(where, f"is required for {tool}")
        return default
    if kind == "bool":
        return validate.boolean(where, value, bool(default))
    if kind == "mode":
        # Permission bits only: setuid, setgid and sticky (and anything above) are never created.
        mode = validate.integer(where, value, minimum=0)
        if mode is None or mode > 0o777:
            raise validate.bad(
                where, f"must be permission bits 0 to 0o777; setuid, setgid and sticky are refused (got {oct(value)})"
            )
        return mode
    if kind in ("uint", "length", "limit", "depth"):
        maximum = {"uint": None, "length": MAX_READ_BYTES, "limit": MAX_LIMIT, "depth": MAX_DEPTH}[kind]
        minimum = 0 if kind in ("uint", "depth") else 1
        return validate.integer(where, value, minimum=minimum, maximum=maximum)
    if kind == "glob":
        return validate.text(where, value, max_len=256, allow_empty=False)
    if kind == "query":
        if not isinstance(value, str) or not value:
            raise validate.bad(where, "must be a non-empty string")
        if len(value) > MAX_TEXT or "\0" in value:
            raise validate.bad(where, f"must be at most {MAX_TEXT} characters without NUL")
        return value
    if kind == "text":
        if not isinstance(value, str) or len(value) > MAX_TEXT or "\0" in value:
            raise validate.bad(where, f"must be a string of at most {MAX_TEXT} characters without NUL")
        return value
    if kind == "base64":
        if not isinstance(value, str):
            raise validate.bad(where, "must be base64")
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise validate.bad(where, "must be base64") from None
        return value
    if kind == "sha256":
        if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise validate.bad(where, "must be 64 lowercase hex digits")
        return value
    raise AssertionError(kind)


def tool_params(tool: str) -> tuple[str, ...]:
    """The names of a file tool's parameters (the agent door declares them: `wire.agent.FILE_ARGS`)."""
    return tuple(_PARAMS[tool])


def check_params(tool: str, untrusted: Any) -> dict[str, Any]:
    """The tool's parameters, validated, with every default filled in."""
    if tool not in FILE_TOOLS:
        raise validate.bad("tool", f"unknown file tool {tool!r} (known: {', '.join(sorted(FILE_TOOLS))})")
    if untrusted is None:
        untrusted = {}
    if not isinstance(untrusted, dict):
        raise validate.bad("params", "must be an object")
    table = _PARAMS[tool]
    unknown = sorted(set(untrusted) - set(table))
    if unknown:
        raise validate.bad(unknown[0], f"is not a parameter of {tool}")
    return {name: _param(tool, name, kind, untrusted.get(name), default) for name, (kind, default) in table.items()}


def check_path(value: Any) -> str:
    path = validate.text("path", value, max_len=4096, allow_empty=False)
    if not path.startswith("/"):
        raise validate.bad("path", "must be an absolute path")
    if any(part in (".", "..") for part in path.split("/")):
        raise validate.bad("path", "must not contain . or .. segments")
    return path


@dataclass(frozen=True, slots=True)
class FileSpec:
    tool: str
    path: str
    privileged: bool
    uid: int  # the peer that asked: root when privileged, else this uid
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_path(self.path)
        object.__setattr__(self, "params", check_params(self.tool, self.params))

    @property
    def run_as(self) -> int:
        return 0 if self.privileged else self.uid

    @property
    def writes(self) -> bool:
        return self.tool in WRITE_TOOLS

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "files",
            "tool": self.tool,
            "path": self.path,
            "privileged": self.privileged,
            "uid": self.uid,
            "params": dict(sorted(self.params.items())),
        }

    def describe(self) -> dict[str, Any]:
        """What an operator and the audit record see: write content only as its digest and size."""
        params = dict(self.params)
        if "content" in params:
            raw = base64.b64decode(params.pop("content"))
            params["content_sha256"] = hashlib.sha256(raw).hexdigest()
            params["content_bytes"] = len(raw)
        return {"tool": self.tool, "path": self.path, "privileged": self.privileged, "uid": self.uid, "params": params}

    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self.to_dict())).hexdigest()

    @classmethod
    def from_dict(cls, untrusted: Any) -> FileSpec:
        if not isinstance(untrusted, dict) or untrusted.get("kind") != "files":
            raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "file spec must be an object of kind files")
        uid = validate.integer("uid", untrusted.get("uid"))
        if uid is None:
            raise validate.bad("uid", "is required")
        return cls(
            tool=validate.text("tool", untrusted.get("tool"), max_len=64),
            path=check_path(untrusted.get("path")),
            privileged=validate.boolean("privileged", untrusted.get("privileged"), True),
            uid=uid,
            params=check_params(str(untrusted.get("tool")), untrusted.get("params")),
        )
