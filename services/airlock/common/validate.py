"""Checks on untrusted text that every door applies, field by field.

Control characters (tab excepted) and the Unicode characters that reorder or
hide text (bidi controls, zero-width characters) are refused everywhere a
human will read the value: argv, env, reason, session, host, ids.  Each
refusal names the field, so an agent can fix its request.

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from airlock.common.errors import AirlockError, ErrorCode

# C0 (but tab), DEL, C1; bidi embeddings/overrides/isolates and marks;
# zero-width space/joiners, word joiner, invisible operators, BOM; and lone
# surrogates (JSON's "\ud800" escapes), which no UTF-8 argv, log or journal
# record can hold.
_FORBIDDEN = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\ud800-\udfff]"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Request IDs (issue 28): an ID lands in copy-paste shell lines, chat markup and
# terminals, so it is a word no shell, markup or terminal reads anything into.
# UUIDs, ULIDs and "name-123" style IDs fit; 256 is the bound every door had.
REQUEST_ID_MAX = 256
REQUEST_ID_CHARS = "A-Z a-z 0-9 . _ : -"
REQUEST_ID_PATTERN = f"[A-Za-z0-9._:-]{{1,{REQUEST_ID_MAX}}}"
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)
_REQUEST_ID_BAD = re.compile(r"[^A-Za-z0-9._:-]")


def bad(field: str, message: str, code: ErrorCode = ErrorCode.INVALID_ARGUMENTS) -> AirlockError:
    return AirlockError(code, f"{field}: {message}", {"field": field})


def text(field: str, value: Any, *, max_len: int = 4096, allow_empty: bool = True, noun: str = "") -> str:
    """A string field: typed, bounded, free of control, bidi and zero-width characters.

    ``noun`` (e.g. "env value ") starts the forbidden-character message, so a
    sudo-proxy client matching its daemon's phrase finds it (docs/protocol.md).
    """
    if not isinstance(value, str):
        raise bad(field, "must be a string")
    if not allow_empty and not value:
        raise bad(field, "must not be empty")
    if len(value) > max_len:
        raise bad(field, f"longer than {max_len} characters")
    found = _FORBIDDEN.search(value)
    if found:
        raise bad(field, f"{noun}contains a forbidden character U+{ord(found.group()):04X} at position {found.start()}")
    return value


# Issue 45: the fields of an agent's request whose strings are content, not text a person reads as it is:
# stdin (base64 of bytes), a file write's content, a file edit's texts and a search's query (file content,
# shown to operators escaped, in a diff), an armoured signature (its lines).  `displayed` exempts them.
CONTENT_FIELDS = frozenset({"stdin", "content", "old_text", "new_text", "query", "signature"})
_DISPLAYED_DEPTH = 16
# The message's start for values under these keys, as their own checks say it (`env_map`).
_NOUNS = {"env": "env value ", "protected_env": "env value "}


def displayed(untrusted: Any, *, exempt: frozenset[str] = CONTENT_FIELDS, field: str = "") -> None:
    """Refuse a control, bidi or zero-width character in any string of a request, keys included (issue 45).

    Every field an agent sends may reach a person (pending, the relay, a log,
    journald): known fields and unknown ones alike (a sudo-proxy client's
    ``version``).  The error names the field as its own check does
    (``pipeline[0][1]``, ``env.NAME``, ``version``); a top-level field in
    ``exempt`` is content and skipped.  Lengths stay each field's own check.
    """
    stack: list[tuple[str, Any, int, str]] = [(field, untrusted, 0, "")]
    while stack:
        name, value, depth, noun = stack.pop()
        if isinstance(value, str):
            text(name or "value", value, max_len=len(value), noun=noun)
        elif isinstance(value, (dict, list)):
            if depth >= _DISPLAYED_DEPTH:
                raise bad(name or "value", f"is nested more than {_DISPLAYED_DEPTH} levels deep")
            if isinstance(value, list):
                stack.extend((f"{name}[{i}]", item, depth + 1, noun) for i, item in enumerate(value))
                continue
            for key, item in value.items():
                if depth == 0 and key in exempt:
                    continue
                # A key is checked before it names anything (an error never repeats a forbidden character).
                text(f"{name} key" if name else "field name", key, max_len=len(str(key)))
                path = f"{name}.{key}" if name else str(key)
                stack.append((path, item, depth + 1, _NOUNS.get(str(key), noun) if depth == 0 else noun))


def is_request_id(value: Any) -> bool:
    """Whether ``value`` is a request ID airlock accepts: 1-256 of ``[A-Za-z0-9._:-]``."""
    return isinstance(value, str) and _REQUEST_ID.fullmatch(value) is not None


def request_id(field: str, value: Any, code: ErrorCode = ErrorCode.INVALID_ARGUMENTS) -> str:
    """A request ID, or a refusal that says which character (or length) is wrong."""
    if is_request_id(value):
        assert isinstance(value, str)
        return value
    rule = f"a request ID is 1 to {REQUEST_ID_MAX} characters of {REQUEST_ID_CHARS}"
    if not isinstance(value, str):
        message = f"must be a string ({rule})"
    elif not value:
        message = f"must not be empty ({rule})"
    elif len(value) > REQUEST_ID_MAX:
        message = f"longer than {REQUEST_ID_MAX} characters ({rule})"
    else:
        found = _REQUEST_ID_BAD.search(value)
        assert found is not None
        message = f"character U+{ord(found.group()):04X} at position {found.start()} is not allowed ({rule})"
    error = bad(field, message, code)
    error.details["allowed"] = REQUEST_ID_PATTERN
    raise error


def optional_text(field: str, value: Any, *, max_len: int = 4096) -> str | None:
    return None if value is None else text(field, value, max_len=max_len)


def mapping(field: str, value: Any) -> dict[str, Any]:
    """An optional JSON object (absent is empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad(field, "must be an object")
    return value


def boolean(field: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(field, "must be true or false")
    return value


def integer(field: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(field, "must be an integer")
    if value < minimum or (maximum is not None and value > maximum):
        limit = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise bad(field, f"must be {limit}")
    return value


def argv(field: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise bad(field, "must be a non-empty list of strings")
    if len(value) > 4096:
        raise bad(field, "has too many arguments")
    out = []
    for i, arg in enumerate(value):
        out.append(text(f"{field}[{i}]", arg, max_len=128 * 1024))
    if not out[0]:
        raise bad(f"{field}[0]", "the program name must not be empty")
    return tuple(out)


def env_name(field: str, name: Any) -> str:
    if not isinstance(name, str) or not _ENV_NAME.match(name) or len(name) > 256:
        raise bad(field, f"{name!r} is not a valid environment variable name")
    return name


def env_map(field: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad(field, "must be an object of strings")
    out: dict[str, str] = {}
    for name, val in value.items():
        env_name(f"{field} key", name)
        out[name] = text(f"{field}.{name}", val, max_len=128 * 1024, noun="env value ")
    return out


def env_allowed(name: str, patterns: tuple[str, ...]) -> bool:
    for pattern in patterns:
        if pattern.endswith("*"):
            if name.startswith(pattern[:-1]):
                return True
        elif name == pattern:
            return True
    return False


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``8h``, ``2d`` or plain seconds; ValueError otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip()
    factor = units.get(value[-1:], 0)
    number = value[:-1] if factor else value
    if not factor:
        factor = 1
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"not a duration: {text!r} (like 90s, 30m, 8h)")
    return float(int(number) * factor)
