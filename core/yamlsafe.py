"""Strict YAML loading for workflow sources and runtime files, and the bookkeeping both
loaders share to report every problem of a source in one run.

Only plain data is accepted: anchors, aliases, explicit tags (``!secret`` and ``!!str``
alike), duplicate keys, non-scalar keys and multiple documents are refused. Timestamps stay
strings so that instants are checked by our own rules, not by YAML's resolver. A source that
breaks these rules is refused at once, with one problem: nothing in it can be trusted.

A source that loads is then judged rule by rule. :class:`Problems` keeps every refusal found
(with the line and column of its key path, from :class:`Marks`) so that an author sees all of
them at once; a reader that meets a value already refused raises :class:`AlreadyReported`
instead of judging what depends on it, so one mistake is reported once, not again as noise.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Literal, ParamSpec, TypeAlias, TypeVar

import yaml

from core.errors import ConfigInvalid, CoordinatorError, PackageInvalid
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


# ------------------------------------------------------------------------------------- marks


@dataclass(frozen=True)
class Marks:
    """Where each key path of a loaded source sits: a 1-based (line, column).

    A mapping member is placed at its key, a list item at the item itself.
    """

    positions: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: str) -> tuple[int, int] | None:
        """The position of ``path``, else of its nearest ancestor in the source.

        A missing key is placed at the mapping that lacks it; the whole document ("") has
        no position.
        """
        while path:
            found = self.positions.get(path)
            if found is not None:
                return found
            path = _parent(path)
        return None


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def _line(event: Any) -> int:
    mark = getattr(event, "start_mark", None)
    return int(mark.line) + 1 if mark is not None else 0


def _position(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


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


def _check_keys(
    node: yaml.Node, path: str, error: ErrorFactory, positions: dict[str, tuple[int, int]]
) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise error(path, f"line {key_node.start_mark.line + 1}: keys must be scalars")
            name = str(key_node.value)
            if name in seen:
                mark = key_node.start_mark
                first = positions.get(key(path, name))
                earlier = f"; first at line {first[0]}" if first is not None else ""
                raise error(
                    key(path, name),
                    f"duplicate key (line {mark.line + 1}, column {mark.column + 1}{earlier})",
                )
            seen.add(name)
            positions.setdefault(key(path, name), _position(key_node))
            _check_keys(value_node, key(path, name), error, positions)
    elif isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            positions.setdefault(index(path, position), _position(item))
            _check_keys(item, index(path, position), error, positions)


def load(source: str | bytes, error: ErrorFactory) -> Any:
    """Parse one strict YAML document; refusals come from ``error(path, reason)``."""
    document, _ = load_marked(source, error)
    return document


def load_marked(source: str | bytes, error: ErrorFactory) -> tuple[Any, Marks]:
    """Parse one strict YAML document and say where each of its key paths sits."""
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
            return None, Marks()
        positions: dict[str, tuple[int, int]] = {}
        _check_keys(node, "", error, positions)
        document = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
        return document, Marks(positions)
    except yaml.MarkedYAMLError as exc:
        # Only the position and the parser's reason: the snippet could echo a value.
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise error("", f"not valid YAML: {where}{exc.problem or 'syntax error'}") from None
    except yaml.YAMLError:
        raise error("", "not valid YAML") from None


# ---------------------------------------------------------------------------------- problems


PROBLEMS: Final = "problems"
"""The member of ``CoordinatorError.extra`` that carries every problem of a source."""


class Failed(Enum):
    """The value of a reading that was refused (the refusal is in :class:`Problems`)."""

    FAILED = "failed"


FAILED: Final = Failed.FAILED

T = TypeVar("T")
P = ParamSpec("P")
Maybe: TypeAlias = T | Literal[Failed.FAILED]


class AlreadyReported(Exception):
    """Raised by a reader that cannot go on because a value it needs was refused already."""


def need(value: Maybe[T]) -> T:
    """``value`` itself, or :class:`AlreadyReported` when its reading was refused."""
    if value is FAILED:
        raise AlreadyReported
    return value


def need_all(values: Iterable[Maybe[T]]) -> list[T]:
    """Every value, or :class:`AlreadyReported` when any reading was refused.

    Takes the whole iterable first, so every item has been judged before it gives up.
    """
    items = list(values)
    if any(item is FAILED for item in items):
        raise AlreadyReported
    return [need(item) for item in items]


def _path_of(error: CoordinatorError) -> str | None:
    return error.path if isinstance(error, ConfigInvalid | PackageInvalid) else None


@dataclass
class Problems:
    """The refusals found in one source, in the order a reader met them.

    The first is the one a single-line surface shows (the service's startup refusal, an
    exception's message); ``coordinatorctl`` shows them all. Each entry is plain data, safe to
    show: code, detail, key path and, when the source says, line and column.
    """

    marks: Marks = field(default_factory=Marks)
    errors: list[CoordinatorError] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.errors)

    def add(self, error: CoordinatorError, *, at: str | None = None) -> None:
        """Keep ``error``; ``at`` is the key path to place it at when its own path is not one
        (a package's file is found through ``deployment.packages[N]``)."""
        entry: dict[str, Any] = {"code": str(error.code), "detail": error.detail}
        path = _path_of(error)
        if path:
            entry["path"] = path
        where = self.marks.locate(at if at is not None else path or "")
        if where is not None:
            entry["line"], entry["column"] = where
        self.errors.append(error)
        self.entries.append(entry)

    def attempt(self, read: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Maybe[T]:
        """``read(*args, **kwargs)``, or FAILED with its refusal kept."""
        try:
            return read(*args, **kwargs)
        except AlreadyReported:
            return FAILED
        except CoordinatorError as error:
            self.add(error)
            return FAILED

    def raise_first(self) -> None:
        """Raise the first refusal, carrying all of them as ``extra["problems"]``; else
        return."""
        if self.errors:
            first = self.errors[0]
            first.extra[PROBLEMS] = list(self.entries)
            raise first


def problems_of(error: CoordinatorError) -> list[dict[str, Any]]:
    """Every problem a refusal carries: the entries :class:`Problems` attached, else itself."""
    found = error.extra.get(PROBLEMS)
    if isinstance(found, list) and found and all(_is_entry(entry) for entry in found):
        return found
    entry: dict[str, Any] = {"code": str(error.code), "detail": error.detail}
    path = _path_of(error)
    if path:
        entry["path"] = path
    return [entry]


def _is_entry(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("code"), str)
        and isinstance(entry.get("detail"), str)
    )
