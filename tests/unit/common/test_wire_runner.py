"""runner.sock's messages (common/wire/runner.py): the spec carried once, and what a malformed one gets."""

from __future__ import annotations

from typing import Any

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.fileop_spec import FileSpec
from airlock.common.spec import ExecSpec
from airlock.common.wire import runner as wire

SPEC = ExecSpec(mode="exec", stages=(("/usr/bin/true",),), privileged=False, uid=1000)


def _exec(**fields: Any) -> dict[str, Any]:
    return {"spec": SPEC.to_dict(), "operation_id": "op", "ticket": "t"} | fields


def test_the_spec_is_decoded_once_with_its_message_and_encoded_as_itself() -> None:
    message = wire.Exec.from_dict(_exec(peer={"pid": 7, "uid": 1000}, after=["0" * 16 + ":1"]))
    assert isinstance(message.spec, ExecSpec) and message.spec == SPEC
    assert message.to_dict()["spec"] == SPEC.to_dict()  # the digest's own encoding, unchanged
    assert wire.Exec.from_dict(message.to_dict()) == message
    files = wire.Files.from_dict(_exec(spec=FileSpec("files_read", "/etc/hostname", False, 1000).to_dict()))
    assert isinstance(files.spec, FileSpec)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"spec": {"stages": []}}, "spec.pipeline"),  # ExecSpec.from_dict's own check, under the field
        ({"spec": "ls"}, "spec"),
        ({"ticket": ""}, "ticket"),  # intake's placeholder never reaches a job
        ({"operation_id": "x" * 257}, "operation_id"),
        ({"after": ["m"] * 9}, "after"),
        ({"protected_env": {"A=B": "v"}}, "protected_env"),
        ({"peer": {"pid": 7}}, "peer.uid"),
        ({"argv": ["rm"]}, "argv"),  # no field outside the declaration
    ],
)
def test_a_malformed_exec_is_refused_with_its_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(AirlockError) as caught:
        wire.Exec.from_dict(_exec(**fields))
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS
    assert caught.value.details["field"].startswith(field)


def test_intake_fills_in_approvals_answer() -> None:
    work = wire.Exec(spec=SPEC, operation_id="")
    sent = wire.approved(work, ticket="t", bound={"binaries": []}, operation_id="op", after=["m"])
    assert (sent.ticket, sent.operation_id, sent.after, sent.spec) == ("t", "op", ("m",), SPEC)
    assert wire.outcome(wire.Ran({"stdout": ""}, "mark")) == {"stdout": "", "audit_mark": "mark"}
