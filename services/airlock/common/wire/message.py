"""Typed messages: the one encoding of each internal conversation (the codec half of `wire`).

A `Message` is a frozen dataclass whose fields are its wire keys.
``from_dict`` is the trust-boundary check (types, required keys, no unknown
keys: a message another process sent is refused whole, with the field named,
before a handler sees it) and ``to_dict`` the one encoding.  A field whose
type is ``Any`` or ``dict[str, Any]`` is carried as JSON without a check: its
declaration must say why (a journal payload, say, is the event's own).
Which verb carries which message, and who may call it, is `wire.verb`.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

from airlock.common.errors import AirlockError, ErrorCode


def _bad(cls: type, key: str, message: str) -> AirlockError:
    if getattr(cls, "public", False):  # a front door's refusal reads as its handlers' always did: "field: text"
        return AirlockError(ErrorCode.INVALID_ARGUMENTS, f"{key}: {message}", {"field": key})
    return AirlockError(
        ErrorCode.INVALID_ARGUMENTS, f"{cls.__name__}: {key}: {message}", {"field": key, "message_type": cls.__name__}
    )


# Value types that are not messages but check themselves: ``from_dict(untrusted)`` and ``to_dict()``
# (the exec and file specs, whose digests are over their own encodings).  See `carry`.
_CARRIED: set[type] = set()

T = TypeVar("T")


def carry(cls: type[T]) -> type[T]:
    """Let a message field be ``cls``, a value type with its own trust-boundary check.

    ``cls.from_dict(untrusted)`` must refuse with `AirlockError` and ``to_dict()``
    be its one encoding: so a spec crosses a door once, checked by its own rules.
    """
    _CARRIED.add(cls)
    return cls


# A field's check is compiled once per type (at a class's first decode), not interpreted per value:
# the hot path decodes several messages per exec in every service (issue 37).
Convert = Callable[[type, str, Any], Any]


def _nested(hint: Any) -> Convert:
    """A message or a carried type: its own check, its errors named under this field."""
    own_prefix = hint not in _CARRIED and not getattr(hint, "public", False)  # its errors read "Type: field: text"

    def convert(cls: type, key: str, value: Any) -> Any:
        if not isinstance(value, dict):
            raise _bad(cls, key, "must be an object")
        try:
            return hint.from_dict(value)
        except AirlockError as exc:
            inner = exc.details.get("field", "")
            if own_prefix:
                message = exc.message.split(": ", 2)[-1]
            else:
                message = exc.message.split(": ", 1)[-1] if inner else exc.message
            raise _bad(cls, f"{key}.{inner}" if inner else key, message) from None

    return convert


@functools.cache
def _converter(hint: Any) -> Convert:
    """The check of one field type: returns the value (as its type) or raises naming the field."""
    if hint is Any:
        return lambda cls, key, value: value
    if hint in _CARRIED or (isinstance(hint, type) and issubclass(hint, Message)):
        return _nested(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _union(typing.get_args(hint))
    if origin in (tuple, list, dict):
        return _container(origin, typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint)
    if hint not in _SCALARS:
        raise TypeError(f"type {hint!r} cannot be carried")
    return _scalar(hint)


def _enum(hint: type[enum.Enum]) -> Convert:
    def convert(cls: type, key: str, value: Any) -> Any:
        try:
            return hint(value)
        except ValueError:
            raise _bad(cls, key, f"must be one of {', '.join(str(m.value) for m in hint)}") from None

    return convert


def _union(options: tuple[Any, ...]) -> Convert:
    nullable = type(None) in options
    real = [_converter(option) for option in options if option is not type(None)]
    if len(real) == 1:  # ``T | None``: T's own error, with its field
        only = real[0]

        def optional(cls: type, key: str, value: Any) -> Any:
            return None if value is None and nullable else only(cls, key, value)

        return optional

    def convert(cls: type, key: str, value: Any) -> Any:
        if value is None and nullable:
            return None
        errors = []
        for option in real:
            try:
                return option(cls, key, value)
            except AirlockError as exc:
                errors.append(exc.message.split(": ", 2)[-1])
        raise _bad(cls, key, " or ".join(errors) or "null not allowed")

    return convert


def _container(origin: Any, params: tuple[Any, ...]) -> Convert:
    if origin is dict:
        if params[0] is not str:
            raise TypeError("only dict[str, T] is supported")
        item = _converter(params[1])
        if params[1] is Any:

            def mapping(cls: type, key: str, value: Any) -> Any:
                if type(value) is not dict or not all(type(k) is str for k in value):
                    raise _bad(cls, key, "must be an object")
                return value

            return mapping

        def typed_mapping(cls: type, key: str, value: Any) -> Any:
            if type(value) is not dict or not all(type(k) is str for k in value):
                raise _bad(cls, key, "must be an object")
            return {k: item(cls, f"{key}.{k}", v) for k, v in value.items()}

        return typed_mapping
    if origin is tuple and params[1:] != (Ellipsis,):
        raise TypeError("only tuple[T, ...] is supported")
    element = _converter(params[0])
    make = tuple if origin is tuple else list
    if params[0] is str:

        def strings(cls: type, key: str, value: Any) -> Any:
            if not isinstance(value, list | tuple):
                raise _bad(cls, key, "must be a list")
            for i, v in enumerate(value):
                if type(v) is not str:
                    raise _bad(cls, f"{key}[{i}]", "must be a string")
            return make(value)

        return strings

    def sequence(cls: type, key: str, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise _bad(cls, key, "must be a list")
        return make(element(cls, f"{key}[{i}]", v) for i, v in enumerate(value))

    return sequence


_SCALARS: dict[type, tuple[type | tuple[type, ...], str]] = {
    bool: (bool, "must be true or false"),
    int: (int, "must be an integer"),
    float: ((int, float), "must be a number"),
    str: (str, "must be a string"),
}


def _scalar(hint: type) -> Convert:
    accepted, message = _SCALARS[hint]
    if hint is str:

        def text(cls: type, key: str, value: Any) -> Any:
            if type(value) is not str and not isinstance(value, str):
                raise _bad(cls, key, message)
            return value

        return text

    def convert(cls: type, key: str, value: Any) -> Any:
        if not isinstance(value, accepted) or (hint is not bool and isinstance(value, bool)):
            raise _bad(cls, key, message)
        return float(typing.cast(float, value)) if hint is float else value

    return convert


def _encode(value: Any) -> Any:
    if isinstance(value, Message) or type(value) in _CARRIED:
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _plain(hint: Any) -> bool:
    """Whether values of ``hint`` encode as themselves (no message, enum, tuple inside)."""
    if hint in (str, int, float, bool, type(None)):
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return all(_plain(option) for option in typing.get_args(hint))
    return origin is dict and typing.get_args(hint)[1] is Any


@dataclass(frozen=True, slots=True)
class _Field:
    name: str  # the attribute
    key: str  # the wire key (``metadata={"key": "token.id"}`` renames)
    hint: Any
    required: bool
    null: bool  # ``metadata={"null": True}``: None is carried as null, not left out (a documented public key)
    convert: Convert
    plain: bool  # encodes as itself


class Message:
    """Base of every argument and reply: subclass it as a ``@dataclass(frozen=True)``.

    A field without a default is required; a field that is None is left out of
    the encoding (so optional fields cost nothing on the wire).  Override
    ``check`` for rules beyond types (bounds, patterns); it runs on decode.
    """

    # Internal doors refuse keys they do not know; a front door's message may relax this.
    strict: ClassVar[bool] = True
    # A front door's message (`Public`): its refusals name the field alone, in the words of reference/004.
    public: ClassVar[bool] = False

    @classmethod
    @functools.cache
    def _plan(cls) -> tuple[_Field, ...]:
        hints = typing.get_type_hints(cls)
        plan = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            key = f.metadata.get("key", f.name)
            try:
                convert = _converter(hints[f.name])
            except TypeError as exc:
                raise TypeError(f"{cls.__name__}.{f.name}: {exc}") from None
            null = bool(f.metadata.get("null"))
            plan.append(_Field(f.name, key, hints[f.name], required, null, convert, _plain(hints[f.name])))
        return tuple(plan)

    @classmethod
    @functools.cache
    def _keys(cls) -> frozenset[str]:
        return frozenset(f.key for f in cls._plan())

    @classmethod
    def from_dict(cls, untrusted: Mapping[str, Any]) -> Self:
        """The message ``untrusted`` encodes, or `AirlockError` (invalid_arguments) naming the field."""
        if not isinstance(untrusted, Mapping):
            raise _bad(cls, "", "must be an object")
        plan = cls._plan()
        if cls.strict and not cls._keys().issuperset(untrusted):
            unknown = sorted(set(untrusted) - cls._keys())[0]
            if cls.public:  # a person's typo: say what the verb takes
                raise _bad(cls, unknown, f"unknown argument (known: {', '.join(sorted(cls._keys()))})")
            raise _bad(cls, unknown, "unknown field")
        values: dict[str, Any] = {}
        for f in plan:
            if f.key not in untrusted:
                if f.required:
                    raise _bad(cls, f.key, "required")
                continue
            values[f.name] = f.convert(cls, f.key, untrusted[f.key])
        message = cls(**values)
        message.check()
        return message

    def check(self) -> None:
        """Rules beyond the field types; raise `AirlockError` (invalid_arguments) to refuse."""

    def to_dict(self) -> dict[str, Any]:
        """The one encoding of this message."""
        out: dict[str, Any] = {}
        for f in self._plan():
            value = getattr(self, f.name)
            if value is not None or f.null:
                out[f.key] = value if f.plain else _encode(value)
        return out


@dataclass(frozen=True)
class Empty(Message):
    """A verb that takes no arguments, or replies with nothing but success."""


@dataclass(frozen=True)
class Public(Message):
    """Base of a front door's message (operator.sock, agent.sock): a documented public shape.

    Checked like any message (types, required keys), but a refusal reads
    ``field: text`` with ``details.field``, as the doors' handlers have always
    answered people and agents (docs/protocol.md).  A key it does not declare
    is ignored, as reference/000 tells clients of a public door to expect (a
    client's ``time``, a field a carrier added that nothing signed); a
    message that refuses them says ``strict = True`` (the journal's pages).
    """

    public: ClassVar[bool] = True
    strict: ClassVar[bool] = False


@dataclass(frozen=True)
class Document(Public):
    """A front door's reply that docs/protocol.md spells out as a document, carried key for key.

    For a reply whose keys depend on what it reports (a request's story, the
    status page): its subclass names it, its docstring says where its keys
    are documented.  Never an argument: arguments are declared field by field.
    """

    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, untrusted: Mapping[str, Any]) -> Self:
        if not isinstance(untrusted, Mapping):
            raise _bad(cls, "", "must be an object")
        return cls(dict(untrusted))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)
