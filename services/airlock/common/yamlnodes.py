"""YAML nodes as config and the policy read them: tags, where a node is, what it holds.

`common.config` and approval's policy files (`approval.policyfile`) compose
YAML with the safe loader (`compose`) and keep the nodes, so every message can say
``path:line:col: key.path: message (got 'value')``.  The tag names, the null
check, the location, the ``(got ...)`` part and the syntax-error line are
here, once.  Pure: no I/O (yaml only).
"""

from __future__ import annotations

import yaml

STR = "tag:yaml.org,2002:str"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
BOOL = "tag:yaml.org,2002:bool"
NULL = "tag:yaml.org,2002:null"


def compose(text: str) -> yaml.Node | None:
    """``text``'s node tree, as the safe loader composes it.

    libyaml's parser when PyYAML has it: ~10x quicker than the Python one, and
    every service, and `airlock dev up` three times, composes airlock.yaml
    before it is ready (issue 50: ~2 ms each).  Text it refuses is composed
    again by the Python parser, whose messages `syntax_error` words.
    """
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return yaml.compose(text, Loader=fast)
        except yaml.YAMLError:
            pass
    return yaml.compose(text, Loader=yaml.SafeLoader)


def where(path: str, node: yaml.Node | None) -> str:
    """``path:line:col`` of a node (1-based); the path alone without a node."""
    if node is None:
        return path
    mark = node.start_mark
    return f"{path}:{mark.line + 1}:{mark.column + 1}"


def got(node: yaml.Node | None, *, null_as_written: bool = False) -> str:
    """What a message says it got: `` (got 'value')``, `` (got null)``, `` (got a list)``, `` (got a mapping)``.

    No node: nothing.  ``null_as_written`` shows a null as its text (``''``
    for an empty value), as config's messages always have.
    """
    if node is None:
        return ""
    if isinstance(node, yaml.ScalarNode):
        return f" (got {node.value!r})" if node.tag != NULL or null_as_written else " (got null)"
    if isinstance(node, yaml.SequenceNode):
        return " (got a list)"
    return " (got a mapping)"


def is_null(node: yaml.Node | None) -> bool:
    """No node, or a null scalar (``~``, ``null`` or nothing)."""
    return node is None or (isinstance(node, yaml.ScalarNode) and node.tag == NULL)


def syntax_error(path: str, exc: yaml.YAMLError) -> str:
    """The line for text that is not YAML at all: ``path:line:col: not valid YAML: problem``."""
    mark = getattr(exc, "problem_mark", None)
    location = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{location}: not valid YAML: {problem}"
