"""HTML that escapes by default: every value put into a template is escaped unless it is `Markup`.

Templates are constants in the code (`pages.py`); what fills them (a request's
argv, reason, paths, an account name) is text from elsewhere.  `html()` runs
each value through `airlock.common.render.sanitise` (no control or bidi
character can make the text lie) and then HTML-escapes it, quotes included, so
it is data in an element and in a quoted attribute alike.  Only `Markup` (what
`html()` itself returned) goes in as is.
"""

from __future__ import annotations

import html as _html
import string
from collections.abc import Iterable
from typing import Any

from airlock.common.render import sanitise


class Markup(str):
    """Text that is already HTML (made by `html()` or `join()`): inserted unescaped."""

    __slots__ = ()


def escape(value: object) -> Markup:
    """``value`` as HTML text: sanitised, then ``& < > " '`` escaped."""
    if isinstance(value, Markup):
        return value
    text = "" if value is None else sanitise(value)
    return Markup(_html.escape(text, quote=True))


def lines(text: object) -> Markup:
    """Multi-line text for a ``<pre>`` (a diff, a statement): each line escaped, the line breaks kept."""
    return Markup("\n".join(escape(line) for line in ("" if text is None else str(text)).splitlines()))


class _Escaping(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, Markup):
            return value
        return escape(format(value, format_spec) if format_spec else value)


_FORMATTER = _Escaping()


def html(template: str, /, **values: Any) -> Markup:
    """``template`` (a constant) with each ``{name}`` replaced by its value, escaped unless `Markup`."""
    return Markup(_FORMATTER.vformat(template, (), values))


def join(parts: Iterable[object], sep: str = "") -> Markup:
    """Several pieces of HTML (values escaped) as one."""
    return Markup(sep.join(escape(p) for p in parts))
