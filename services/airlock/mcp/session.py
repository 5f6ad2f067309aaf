"""One MCP session, server side, with no I/O (h11's split).

`Session.receive` takes one line from the client and returns what to do:
bytes to write (`Send`), a tool call to start (`StartCall`) or one to abandon
(`CancelCall`).  When a call ends, `Session.complete` encodes its result,
unless the client cancelled it (the spec says a cancelled request gets no
response).  `Session.progress` encodes a progress notification for a call
whose client asked for progress.  The shell does the reading, writing and
running.

Protocol versions: the handshake versions of MCP, newest first.  A client
asking for one of them gets it; any other request gets the newest, and the
client decides whether it can speak that.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from airlock.mcp import jsonrpc
from airlock.mcp.jsonrpc import ErrorCode, Notification, Request, RequestId, Response
from airlock.mcp.tools import ToolResult, ToolSpec

SUPPORTED_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LATEST_VERSION: Final = SUPPORTED_VERSIONS[0]
# The optional `message` of a progress notification exists from this version on.
_PROGRESS_MESSAGE_SINCE: Final = "2025-03-26"
_SERVER_TITLE_SINCE: Final = "2025-06-18"

INSTRUCTIONS: Final = (
    "airlock runs commands on this machine with root privileges once a policy rule or a human operator "
    "approves them, and audits every one. Use its execute tool for anything needing root or that should be "
    "audited; a call may wait for an operator (it reports progress meanwhile). A denial names the rule: do "
    "not retry around it."
)


def _clip(value: object) -> str:
    """A client's value quoted in an error message, bounded (it is echoed to the client)."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes


@dataclass(frozen=True, slots=True)
class StartCall:
    request_id: RequestId
    tool: str
    arguments: dict[str, Any]
    progress_token: str | int | None


@dataclass(frozen=True, slots=True)
class CancelCall:
    request_id: RequestId
    reason: str


Action = Send | StartCall | CancelCall


@dataclass
class _Call:
    progress_token: str | int | None
    last_progress: float = 0.0


@dataclass
class Session:
    tools: Sequence[ToolSpec]
    server_version: str
    instructions: str = INSTRUCTIONS
    # Negotiated on `initialize`; None until then.
    protocol_version: str | None = None
    initialized: bool = False
    _calls: dict[RequestId, _Call] = field(default_factory=dict)

    def receive(self, line: bytes) -> list[Action]:
        if not line.strip():
            return []  # a blank line between messages carries nothing
        try:
            message = jsonrpc.decode(line)
        except jsonrpc.RemoteProtocolError as exc:
            return [Send(jsonrpc.encode_error(exc.request_id, exc.code, exc.message))]
        if isinstance(message, Response):
            return []  # we send no requests, so there is nothing to match it to
        if isinstance(message, Notification):
            return self._notification(message)
        try:
            return self._request(message)
        except jsonrpc.RemoteProtocolError as exc:
            return [Send(jsonrpc.encode_error(message.id, exc.code, exc.message))]

    def too_long(self, line: jsonrpc.TooLong) -> list[Action]:
        """The client sent a line over the cap (it was skipped); the error names its call when its id was read."""
        limit = jsonrpc.MAX_LINE
        message = (
            f"invalid request: message of {line.length} bytes is longer than the limit of {limit} bytes "
            "(tool arguments are far smaller: see the tool's input schema)"
        )
        if line.request_id is not None and line.request_id in self._calls:
            line = jsonrpc.TooLong(line.length, None)  # never answer a running call with this error
        return [Send(jsonrpc.encode_error(line.request_id, ErrorCode.INVALID_REQUEST, message))]

    # --- requests -----------------------------------------------------------------

    def _request(self, request: Request) -> list[Action]:
        method = request.method
        if method == "ping":
            return [Send(jsonrpc.encode_result(request.id, {}))]
        if method == "initialize":
            return [Send(jsonrpc.encode_result(request.id, self._initialize(request.params)))]
        if method not in ("tools/list", "tools/call"):
            raise jsonrpc.RemoteProtocolError(ErrorCode.METHOD_NOT_FOUND, f"method not found: {_clip(method)}")
        if self.protocol_version is None:
            raise jsonrpc.RemoteProtocolError(ErrorCode.INVALID_REQUEST, "invalid request: send initialize first")
        if method == "tools/list":
            tools = [spec.to_dict(self.protocol_version) for spec in self.tools]
            return [Send(jsonrpc.encode_result(request.id, {"tools": tools}))]
        return self._call(request)

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            raise jsonrpc.RemoteProtocolError(
                ErrorCode.INVALID_PARAMS, 'invalid params: "protocolVersion" must be a string'
            )
        if self.protocol_version is not None:
            raise jsonrpc.RemoteProtocolError(
                ErrorCode.INVALID_REQUEST, "invalid request: the session is already initialized"
            )
        version = requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION
        self.protocol_version = version
        info: dict[str, Any] = {"name": "airlock", "version": self.server_version}
        if version >= _SERVER_TITLE_SINCE:
            info["title"] = "airlock: approved, audited privileged commands"
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": info,
            "instructions": self.instructions,
        }

    def _call(self, request: Request) -> list[Action]:
        params = request.params
        name = params.get("name")
        if not isinstance(name, str):
            raise jsonrpc.RemoteProtocolError(ErrorCode.INVALID_PARAMS, 'invalid params: "name" must be a string')
        if name not in {spec.name for spec in self.tools}:
            known = ", ".join(spec.name for spec in self.tools)
            raise jsonrpc.RemoteProtocolError(
                ErrorCode.INVALID_PARAMS, f"invalid params: unknown tool {_clip(name)} (tools: {known})"
            )
        arguments = params.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise jsonrpc.RemoteProtocolError(ErrorCode.INVALID_PARAMS, 'invalid params: "arguments" must be an object')
        if request.id in self._calls:
            raise jsonrpc.RemoteProtocolError(
                ErrorCode.INVALID_REQUEST, f"invalid request: id {_clip(request.id)} is already in use"
            )
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if not (isinstance(token, str) or (isinstance(token, int) and not isinstance(token, bool))):
            token = None
        self._calls[request.id] = _Call(token)
        return [StartCall(request.id, name, arguments, token)]

    # --- notifications ------------------------------------------------------------

    def _notification(self, note: Notification) -> list[Action]:
        if note.method == "notifications/initialized":
            self.initialized = True
        elif note.method == "notifications/cancelled":
            request_id = note.params.get("requestId")
            reason = note.params.get("reason")
            # Unknown or finished requests are ignored, as the spec allows.
            if (
                isinstance(request_id, (str, int))
                and not isinstance(request_id, bool)
                and self._calls.pop(request_id, None) is not None
            ):
                return [CancelCall(request_id, reason if isinstance(reason, str) else "cancelled by the client")]
        return []  # other notifications need nothing from a tools-only server

    # --- what the shell reports back ----------------------------------------------

    def complete(self, request_id: RequestId, result: ToolResult) -> bytes | None:
        """The response for a finished call, or None when the client had cancelled it."""
        if self._calls.pop(request_id, None) is None:
            return None
        return jsonrpc.encode_result(request_id, result.to_dict())

    def progress(self, request_id: RequestId, elapsed: float, message: str) -> bytes | None:
        """A progress notification for a running call, if its client gave a progressToken."""
        call = self._calls.get(request_id)
        if call is None or call.progress_token is None:
            return None
        # progress MUST increase with each notification, even if the clock did not.
        value = max(round(elapsed, 1), round(call.last_progress + 0.1, 1))
        call.last_progress = value
        params: dict[str, Any] = {"progressToken": call.progress_token, "progress": value}
        if self.protocol_version is not None and self.protocol_version >= _PROGRESS_MESSAGE_SINCE:
            params["message"] = message
        return jsonrpc.encode_notification("notifications/progress", params)

    def running(self) -> list[RequestId]:
        return list(self._calls)
