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
