"""The MCP session state machine, without I/O: version negotiation, tools, calls, cancel, progress."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.mcp import jsonrpc
from airlock.mcp.session import LATEST_VERSION, SUPPORTED_VERSIONS, Action, CancelCall, Send, Session, StartCall
from airlock.mcp.tools import BUILTIN, ToolResult


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0"} | obj).encode()


def sent(actions: list[Action]) -> dict[str, Any]:
    assert len(actions) == 1 and isinstance(actions[0], Send), actions
    return dict(json.loads(actions[0].data))


def initialize(session: Session, version: str = "2025-06-18") -> dict[str, Any]:
    reply = sent(
        session.receive(
            line(
                {
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": version,
                        "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"},
                    },
                }
            )
        )
    )
    session.receive(line({"method": "notifications/initialized"}))
    return reply


def ready(version: str = "2025-06-18") -> Session:
    session = Session(tools=BUILTIN, server_version="9.9")
    initialize(session, version)
    return session


def call(
    session: Session, request_id: Any, name: str = "execute", arguments: Any = None, **params: Any
) -> list[Action]:
    body: dict[str, Any] = {"name": name} | params
    if arguments is not None:
        body["arguments"] = arguments
    return session.receive(line({"id": request_id, "method": "tools/call", "params": body}))


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_a_supported_version_is_echoed(version: str) -> None:
    session = Session(tools=BUILTIN, server_version="9.9")
    result = initialize(session, version)["result"]
    assert result["protocolVersion"] == version
    assert result["serverInfo"]["name"] == "airlock" and result["serverInfo"]["version"] == "9.9"
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert session.initialized


@pytest.mark.parametrize("version", ["2026-07-28", "1999-01-01", "latest"])
def test_an_unknown_version_gets_the_latest(version: str) -> None:
    assert (
        initialize(Session(tools=BUILTIN, server_version="1"), version)["result"]["protocolVersion"] == LATEST_VERSION
    )


def test_initialize_needs_a_version_and_happens_once() -> None:
    session = Session(tools=BUILTIN, server_version="1")
    bad = sent(session.receive(line({"id": 1, "method": "initialize", "params": {}})))
    assert bad["error"]["code"] == -32602 and bad["id"] == 1
    initialize(session)
    again = sent(session.receive(line({"id": 2, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}})))
    assert again["error"]["code"] == -32600


def test_ping_works_before_initialize_and_tools_do_not() -> None:
    session = Session(tools=BUILTIN, server_version="1")
    assert sent(session.receive(line({"id": 1, "method": "ping"}))) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert sent(session.receive(line({"id": 2, "method": "tools/list"})))["error"]["code"] == -32600
    assert sent(call(session, 3, arguments={}))["error"]["code"] == -32600


def test_unknown_methods_are_not_found_even_before_initialize() -> None:
    # mcp 2.x clients probe `server/discover` first and fall back on -32601.
    session = Session(tools=BUILTIN, server_version="1")
    reply = sent(session.receive(line({"id": 1, "method": "server/discover", "params": {}})))
    assert reply["error"]["code"] == -32601 and reply["id"] == 1
    assert sent(ready().receive(line({"id": "r", "method": "resources/list"})))["error"]["code"] == -32601


def test_unknown_notifications_and_responses_are_ignored() -> None:
    session = ready()
    assert session.receive(line({"method": "notifications/roots/list_changed"})) == []
    assert session.receive(line({"id": 7, "result": {}})) == []
    assert session.receive(b"   ") == []


def test_tools_list_follows_the_negotiated_version() -> None:
    new = sent(ready("2025-11-25").receive(line({"id": 1, "method": "tools/list"})))["result"]["tools"]
    assert [t["name"] for t in new] == ["execute", "status"]
    assert new[0]["title"] and new[0]["annotations"]["destructiveHint"] is True
    assert new[0]["inputSchema"]["type"] == "object"
    old = sent(ready("2024-11-05").receive(line({"id": 1, "method": "tools/list"})))["result"]["tools"]
    assert "title" not in old[0] and "annotations" not in old[0]
    mid = sent(ready("2025-03-26").receive(line({"id": 1, "method": "tools/list"})))["result"]["tools"]
    assert "title" not in mid[0] and mid[0]["annotations"]["title"]


def test_a_call_starts_with_its_progress_token() -> None:
    session = ready()
    assert call(session, 5, arguments={"argv": ["id"]}, _meta={"progressToken": "tok"}) == [
        StartCall(5, "execute", {"argv": ["id"]}, "tok")
    ]
    assert call(session, 6) == [StartCall(6, "execute", {}, None)]
    assert call(session, 7, _meta={"progressToken": True}) == [StartCall(7, "execute", {}, None)]


@pytest.mark.parametrize(
    "params",
    [{}, {"name": 3}, {"name": "rm"}, {"name": "execute", "arguments": []}, {"name": "execute", "arguments": "x"}],
)
def test_bad_call_params_are_invalid_params(params: dict[str, Any]) -> None:
    reply = sent(ready().receive(line({"id": 9, "method": "tools/call", "params": params})))
    assert reply["error"]["code"] == -32602 and reply["id"] == 9


def test_a_request_id_cannot_be_reused_while_its_call_runs() -> None:
    session = ready()
    call(session, 1)
    assert sent(call(session, 1))["error"]["code"] == -32600
    assert session.complete(1, ToolResult("done")) is not None
    assert isinstance(call(session, 1)[0], StartCall)  # free again once answered


def test_complete_answers_once() -> None:
    session = ready()
    call(session, "a")
    data = session.complete("a", ToolResult("ok", is_error=True))
    assert data is not None
    assert json.loads(data)["result"] == {"content": [{"type": "text", "text": "ok"}], "isError": True}
    assert session.complete("a", ToolResult("again")) is None


def test_a_cancelled_call_gets_no_response() -> None:
    session = ready()
    call(session, 4, _meta={"progressToken": 1})
    actions = session.receive(
        line({"method": "notifications/cancelled", "params": {"requestId": 4, "reason": "timeout"}})
    )
    assert actions == [CancelCall(4, "timeout")]
    assert session.complete(4, ToolResult("late")) is None
    assert session.progress(4, 1.0, "late") is None


def test_cancelling_an_unknown_or_finished_call_is_ignored() -> None:
    session = ready()
    assert session.receive(line({"method": "notifications/cancelled", "params": {"requestId": 99}})) == []
    assert session.receive(line({"method": "notifications/cancelled", "params": {}})) == []
    call(session, 1)
    session.complete(1, ToolResult("x"))
    assert session.receive(line({"method": "notifications/cancelled", "params": {"requestId": 1}})) == []


def test_progress_needs_a_token_and_always_increases() -> None:
    session = ready()
    call(session, 1)
    assert session.progress(1, 1.0, "waiting") is None
    call(session, 2, _meta={"progressToken": "p"})
    values = []
    for elapsed in (0.0, 0.0, 5.0, 4.0, 10.0):
        data = session.progress(2, elapsed, "waiting")
        assert data is not None
        note = json.loads(data)
        assert note["method"] == "notifications/progress" and "id" not in note
        assert note["params"]["progressToken"] == "p" and note["params"]["message"] == "waiting"
        values.append(note["params"]["progress"])
    assert values == sorted(values) and len(set(values)) == len(values)


def test_progress_has_no_message_before_2025_03_26() -> None:
    session = ready("2024-11-05")
    call(session, 1, _meta={"progressToken": 3})
    data = session.progress(1, 2.0, "waiting")
    assert data is not None and "message" not in json.loads(data)["params"]


def test_malformed_lines_get_errors_and_the_session_goes_on() -> None:
    session = ready()
    assert sent(session.receive(b"{oops"))["error"]["code"] == -32700
    assert (
        sent(session.receive(b'{"jsonrpc":"2.0","id":3,"method":"tools/list","params":[]}'))["error"]["code"] == -32602
    )
    too_long = sent(session.too_long(jsonrpc.TooLong(2_000_000, 9)))
    assert too_long["error"]["code"] == -32600 and too_long["id"] == 9
    assert "id" not in sent(session.too_long(jsonrpc.TooLong(2_000_000, None)))
    assert "result" in sent(session.receive(line({"id": 4, "method": "tools/list"})))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.binary(max_size=200)
        | st.sampled_from(
            [
                line({"id": 1, "method": "tools/call", "params": {"name": "execute"}}),
                line({"method": "notifications/cancelled", "params": {"requestId": 1}}),
                line({"id": 2, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}),
            ]
        ),
        max_size=8,
    )
)
def test_any_input_yields_actions_never_an_exception(chunks: list[bytes]) -> None:
    session = Session(tools=BUILTIN, server_version="1")
    for chunk in chunks:
        for action in session.receive(chunk):
            if isinstance(action, Send):
                reply = json.loads(action.data)
                assert reply["jsonrpc"] == "2.0" and ("result" in reply) != ("error" in reply)
