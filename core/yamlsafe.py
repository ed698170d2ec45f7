"""Strict YAML loading for workflow sources and runtime files.

Only plain data is accepted: anchors, aliases, explicit tags (``!secret`` and ``!!str``
alike), duplicate keys, non-scalar keys and multiple documents are refused. Timestamps stay
strings so that instants are checked by our own rules, not by YAML's resolver.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

from core.errors import CoordinatorError
from core.paths import index, key

ErrorFactory = Callable[[str, str], CoordinatorError]

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_BOOL = "tag:yaml.org,2002:bool"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without the timestamp resolver and with YAML 1.2 booleans only."""


# YAML 1.1 reads yes/no/on/off as booleans (`country: no` becomes false); only the
# spellings true/false (any case) are booleans here, everything else stays a string.
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_TIMESTAMP, _BOOL)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _first in "tTfF":
    _StrictLoader.yaml_implicit_resolvers.setdefault(_first, []).append(
        (_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"))
    )


def _line(event: Any) -> int:
    mark = getattr(event, "start_mark", None)
    return int(mark.line) + 1 if mark is not None else 0


def _check_events(text: str, error: ErrorFactory) -> None:
    documents = 0
    for event in yaml.parse(text, Loader=_StrictLoader):
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise error("", f"line {_line(event)}: only one YAML document is allowed")
        if isinstance(event, yaml.AliasEvent):
            raise error("", f"line {_line(event)}: YAML aliases are not allowed")
        if getattr(event, "anchor", None) is not None:
            raise error("", f"line {_line(event)}: YAML anchors are not allowed")
        if getattr(event, "tag", None) is not None:
            raise error("", f"line {_line(event)}: explicit YAML tags are not allowed")


def _check_keys(node: yaml.Node, path: str, error: ErrorFactory) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise error(path, f"line {key_node.start_mark.line + 1}: keys must be scalars")
            name = str(key_node.value)
            if name in seen:
                raise error(key(path, name), "duplicate key")
            seen.add(name)
            _check_keys(value_node, key(path, name), error)
    elif isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            _check_keys(item, index(path, position), error)


def load(source: str | bytes, error: ErrorFactory) -> Any:
    """Parse one strict YAML document; refusals come from ``error(path, reason)``."""
    if isinstance(source, bytes):
        try:
            text = source.decode("utf-8")
        except UnicodeDecodeError:
            raise error("", "the file is not UTF-8 text") from None
    else:
        text = source
    try:
        _check_events(text, error)
        node = yaml.compose(text, Loader=_StrictLoader)
        if node is None:
            return None
        _check_keys(node, "", error)
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        # Only the position and the parser's reason: the snippet could echo a value.
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise error("", f"not valid YAML: {where}{exc.problem or 'syntax error'}") from None
    except yaml.YAMLError:
        raise error("", "not valid YAML") from None
