from __future__ import annotations

import pytest

from airlock.common import validate
from airlock.common.errors import AirlockError, ErrorCode


@pytest.mark.parametrize("value", ["\ud800", "a\udfffb", "x" + "\udc80"])
def test_lone_surrogates_are_refused_with_the_field_named(value: str) -> None:
    # JSON may carry "\ud800"; no UTF-8 argv, log line or journal record can.
    with pytest.raises(AirlockError) as info:
        validate.argv("argv", [value])
    assert info.value.code is ErrorCode.INVALID_ARGUMENTS
    assert info.value.message.startswith("argv[0]: contains a forbidden character U+D")


def test_astral_characters_are_text() -> None:
    assert validate.text("reason", "deploy \U0001f680") == "deploy \U0001f680"


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"version": "1.1.0\u202e"}, "version"),
        ({"pipeline": [["echo", "a\u2066"]]}, "pipeline[0][1]"),
        ({"env": {"A": "x\u200b"}}, "env.A"),
        ({"extra": {"deep": ["\x85"]}}, "extra.deep[0]"),
        ({"x\u202e": 1}, "field name"),
        ({"extra": {"k\u200d": 1}}, "extra key"),
    ],
)
def test_displayed_refuses_a_dangerous_character_in_any_field_and_names_it(
    request_: dict[str, object], field: str
) -> None:
    with pytest.raises(AirlockError) as info:
        validate.displayed(request_)
    assert info.value.details["field"] == field
    assert info.value.message.startswith(f"{field}: ")
    assert not any(c in info.value.message for c in "\u202e\u2066\u200b\u200d\x85")  # the error repeats none


def test_displayed_keeps_the_env_phrase_and_exempts_content() -> None:
    with pytest.raises(AirlockError) as info:
        validate.displayed({"env": {"A": "x\u200b"}})
    assert "env value contains a forbidden character" in info.value.message
    validate.displayed({"stdin": "\x00\u202e", "new_text": "a\nb\u202e", "version": "1.1.0", "n": 1, "b": None})
    with pytest.raises(AirlockError):  # exempt only at the top: a nested "stdin" is a field like any other
        validate.displayed({"extra": {"stdin": "\u202e"}})
    nested: list[object] = []
    for _ in range(40):
        nested = [nested]
    with pytest.raises(AirlockError) as info:
        validate.displayed({"deep": nested})
    assert "nested more than" in info.value.message
