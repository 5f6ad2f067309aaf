"""A field with a bidi control is refused in every dialect, whichever field it is (issue 45, item 6).

The sudo-proxy dialect accepted ``version: "1.1.0\\u202e"``: intake checked
the fields it knew and let the rest through, into ``request.received`` and
journald.  The peer refuses a dangerous character in any field it shows, and
so does airlock now, in both agent dialects and the gateway, with an error
that names the field (common/validate.py ``displayed``).

Played by a throwaway agent against a live stack: the sudo-proxy ``ping`` and
``exec`` with that ``version`` are refused naming the field, and nothing of
them is journaled (native v1 refused unknown fields already: a regression
guard checks it still names the field).  The control: the same requests without the character are
answered (pong; the exec runs), so the refusal is the character's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from secsupport import agent_exec, needs_root, red_stack, throwaway_user
from test_sec_stop import legacy

from airlock.gateway.protocol import GatewayError, parse_request

from support import Stack

pytestmark = needs_root

BIDI = "1.1.0\u202e"


@pytest.fixture(scope="module")
def agent() -> Iterator[Any]:
    with throwaway_user("aldisp") as user:
        yield user


@pytest.fixture(scope="module")
def dstack(agent: Any) -> Iterator[Stack]:
    config = (
        f"agents: {{users: [{agent.pw_name}]}}\n"
        "policy:\n  default: ask\n  rules:\n"
        '    - {name: echo, decision: allow, privileged: false, commands: [[/usr/bin/echo, "..."]]}\n'
    )
    with red_stack(config) as stack:
        yield stack


def _journaled(stack: Stack, marker: str) -> bool:
    return marker in json.dumps(stack.journal_rows())


def test_sudo_proxy_refuses_a_bidi_control_in_version_and_names_it(dstack: Stack, agent: Any) -> None:
    refused = legacy(dstack, agent, action="ping", version=BIDI)
    assert refused["status"] == "error" and refused["code"] == "invalid_arguments", refused
    assert refused["message"].startswith("version: contains a forbidden character U+202E"), refused
    assert refused["field"] == "version"
    marker = f"run-{uuid.uuid4().hex[:8]}"
    ran = legacy(dstack, agent, pipeline=[["/usr/bin/echo", marker]], privileged=False, version=BIDI)
    assert ran["status"] == "error" and ran["field"] == "version", ran
    assert not _journaled(dstack, marker)  # refused at the door: no record holds it

    # The control: the same requests with a plain version are answered.
    assert legacy(dstack, agent, action="ping", version="1.1.0")["message"] == "pong"
    ran = legacy(dstack, agent, pipeline=[["/usr/bin/echo", marker]], privileged=False, version="1.1.0")
    assert ran["status"] == "ok", ran
    assert _journaled(dstack, marker)


def test_native_refuses_a_zero_width_character_naming_the_field(dstack: Stack, agent: Any) -> None:
    """A regression guard: native v1 already refused unknown fields and checked the known ones."""
    marker = f"nat-{uuid.uuid4().hex[:8]}"
    args = {"argv": ["/usr/bin/echo", marker], "privileged": False}
    reply = agent_exec(dstack.agent, agent, args | {"session": "ok\u200d"})
    assert reply["ok"] is False and reply["error"]["details"]["field"] == "session", reply
    assert not _journaled(dstack, marker)
    control = agent_exec(dstack.agent, agent, args | {"session": "ok"})
    assert control["ok"] is True, control  # the control


def test_the_gateway_refuses_a_bidi_control_in_any_param_but_not_in_content() -> None:
    line = {"id": "g1", "method": "exec", "params": {"executable": "/usr/bin/true", "label": BIDI}}
    with pytest.raises(GatewayError) as err:
        parse_request(json.dumps(line).encode())
    assert err.value.code == "invalid_params" and err.value.details["field"] == "params.label"
    assert err.value.request_id == "g1"
    # A file edit's text is content (shown to operators escaped, in the diff): not refused here.
    edit = {"id": "g2", "method": "files_edit", "params": {"path": "/tmp/x", "oldText": "a", "newText": "b\u202e\n"}}
    assert parse_request(json.dumps(edit).encode()).params["newText"] == "b\u202e\n"
    # An ID carrying one is refused and not echoed.
    with pytest.raises(GatewayError) as err:
        parse_request(json.dumps({"id": "g\u2066", "method": "hello"}).encode())
    assert err.value.details["field"] == "id" and err.value.request_id is None
