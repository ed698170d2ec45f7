"""Typed readers for the plain data a runtime file parses into.

Each reader takes the value and its dotted key path and either returns a typed value or
raises :class:`core.errors.ConfigInvalid` naming that path. Reasons describe what is
expected; they never repeat the value found (a misplaced secret must not reach a log).

:func:`mapping` is the exception: it keeps every unknown and missing key in
:class:`core.yamlsafe.Problems` and hands back a :class:`Block`, whose members are then read
one by one, so that one run reports every independent mistake of a block.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

from core.config.model import BindAddress, SecretProviders
from core.errors import ConfigInvalid
from core.paths import key
from core.secrets import SecretRef, parse_reference
from core.yamlsafe import FAILED, Maybe, Problems

_VISIBLE = re.compile(r"[\x21-\x7e]+")
_PRIVATE_NETWORKS = (
    ipaddress.ip_network("10.0.0.0/8"),
    ipaddress.ip_network("172.16.0.0/12"),
    ipaddress.ip_network("192.168.0.0/16"),
    ipaddress.ip_network("fc00::/7"),
)

T = TypeVar("T")
D = TypeVar("D")
P = ParamSpec("P")
Reader = Callable[Concatenate[object, str, P], T]


class Block:
    """A mapping of the runtime file whose unknown and missing keys were already reported.

    It holds only the allowed keys; :meth:`read` judges one member, keeping its refusal.
    """

    def __init__(self, values: dict[str, Any], path: str, problems: Problems) -> None:
        self.values = values
        self.path = path
        self.problems = problems

    def __contains__(self, name: object) -> bool:
        return name in self.values

    def items(self) -> Iterator[tuple[str, Any]]:
        """The allowed members, in the file's order."""
        return iter(self.values.items())

    def read(self, name: str, reader: Reader[P, T], *args: P.args, **kwargs: P.kwargs) -> Maybe[T]:
        """Member ``name`` through ``reader``; FAILED when it is absent (a required key's
        absence was reported by :func:`mapping`) or refused."""
        if name not in self.values:
            return FAILED
        return self.problems.attempt(
            reader, self.values[name], key(self.path, name), *args, **kwargs
        )

    def optional(
        self, name: str, default: D, reader: Reader[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> Maybe[T | D]:
        """Member ``name`` through ``reader``, or ``default`` when the key is absent."""
        if name not in self.values:
            return default
        return self.read(name, reader, *args, **kwargs)


def mapping(
    value: object,
    path: str,
    problems: Problems,
    *,
    required: Sequence[str] = (),
    optional: Sequence[str] = (),
) -> Block:
    """A mapping with the allowed keys; every unknown key, then every missing one, is kept
    in ``problems``. Raises only when ``value`` is not a mapping at all."""
    if not isinstance(value, dict):
        raise ConfigInvalid(path, "must be a mapping")
    allowed = set(required) | set(optional)
    known: dict[str, Any] = {}
    odd_key = False
    for name, member in value.items():
        if not isinstance(name, str):
            if not odd_key:
                problems.add(ConfigInvalid(path, "keys must be strings"))
                odd_key = True
        elif name not in allowed:
            problems.add(ConfigInvalid(key(path, name), "unknown key"))
        else:
            known[name] = member
    for name in required:
        if name not in value:
            problems.add(ConfigInvalid(key(path, name), "required key is missing"))
    return Block(known, path, problems)


def named_entries(value: object, path: str) -> dict[str, Any]:
    """A mapping keyed by names the author chooses (connections, policies, sources)."""
    if not isinstance(value, dict):
        raise ConfigInvalid(path, "must be a mapping")
    for name in value:
        if not isinstance(name, str):
            raise ConfigInvalid(path, "keys must be strings")
    return value


def string(
    value: object,
    path: str,
    *,
    pattern: re.Pattern[str] | None = None,
    expected: str = "",
    max_bytes: int = 4096,
) -> str:
    """A non-empty string, at most ``max_bytes`` UTF-8 bytes, matching ``pattern``."""
    if not isinstance(value, str):
        raise ConfigInvalid(path, "must be a string")
    if not value:
        raise ConfigInvalid(path, "must not be empty")
    if len(value.encode("utf-8")) > max_bytes:
        raise ConfigInvalid(path, f"must be at most {max_bytes} bytes")
    if pattern is not None and not pattern.fullmatch(value):
        raise ConfigInvalid(path, f"must be {expected}" if expected else "has a wrong form")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        raise ConfigInvalid(path, "must not contain control characters")
    return value


def visible(value: object, path: str, *, max_len: int) -> str:
    """1..``max_len`` visible ASCII characters (no spaces)."""
    text = string(value, path, max_bytes=max_len * 4)
    if len(text) > max_len or not _VISIBLE.fullmatch(text):
        raise ConfigInvalid(path, f"must be 1 to {max_len} visible ASCII characters, no spaces")
    return text


def integer(value: object, path: str, *, low: int, high: int) -> int:
    """An integer (not a boolean) in ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigInvalid(path, "must be an integer")
    if not low <= value <= high:
        raise ConfigInvalid(path, f"must be between {low} and {high}")
    return value


def boolean(value: object, path: str) -> bool:
    """``true`` or ``false``."""
    if not isinstance(value, bool):
        raise ConfigInvalid(path, "must be true or false")
    return value


def sequence(value: object, path: str, *, min_items: int = 0, max_items: int = 1000) -> list[Any]:
    """A list of ``min_items..max_items`` entries."""
    if not isinstance(value, list):
        raise ConfigInvalid(path, "must be a list")
    if len(value) < min_items:
        raise ConfigInvalid(
            path, f"must have at least {min_items} entr{'y' if min_items == 1 else 'ies'}"
        )
    if len(value) > max_items:
        raise ConfigInvalid(path, f"must have at most {max_items} entries")
    return value


def reference(value: object, path: str, providers: SecretProviders | None) -> SecretRef:
    """A secret reference whose provider is enabled; the secret itself is never touched.

    With ``providers`` None (the file's secretProviders were refused), only its form is
    judged: whether its provider is enabled cannot be told.
    """
    ref = parse_reference(value, path)
    if providers is None:
        return ref
    if ref.provider == "file" and providers.file is None:
        raise ConfigInvalid(path, "secret:file/ references need secretProviders.file")
    if ref.provider == "env" and not providers.environment:
        raise ConfigInvalid(path, "secret:env/ references need secretProviders.environment: {}")
    return ref


def local_path(value: object, path: str, base: Path) -> Path:
    """A filesystem path; a relative one is taken from ``base`` (the runtime file's folder)."""
    text = string(value, path)
    if "\x00" in text:
        raise ConfigInvalid(path, "must be a path")
    candidate = Path(text)
    return candidate if candidate.is_absolute() else base / candidate


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url(value: object, path: str, *, allow_path: bool = True, allow_query: bool = False) -> str:
    """An ``https://`` URL, or ``http://`` to a loopback host; kept verbatim."""
    text = string(value, path, max_bytes=2048)
    if not _VISIBLE.fullmatch(text):
        raise ConfigInvalid(path, "a URL must not contain spaces or non-ASCII characters")
    parts = urlsplit(text)
    if parts.scheme not in ("https", "http") or not parts.netloc or not parts.hostname:
        raise ConfigInvalid(path, "must be an https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ConfigInvalid(path, "must not carry credentials")
    if parts.fragment or "#" in text:
        raise ConfigInvalid(path, "must not have a fragment")
    if parts.query and not allow_query:
        raise ConfigInvalid(path, "must not have a query")
    if parts.path not in ("", "/") and not allow_path:
        raise ConfigInvalid(path, "must not have a path")
    try:
        parts.port  # noqa: B018 - evaluating it validates the port
    except ValueError:
        raise ConfigInvalid(path, "has an invalid port") from None
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise ConfigInvalid(path, "must be https:// (http:// is allowed only to a loopback host)")
    return text


def bind(value: object, path: str) -> BindAddress:
    """``host:port`` on a private (RFC 1918 / ULA), loopback or link-local address."""
    text = string(value, path, max_bytes=64)
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ConfigInvalid(path, "must be host:port (IPv6 as [address]:port)")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon or ":" in host:
            raise ConfigInvalid(path, "must be host:port (IPv6 as [address]:port)")
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigInvalid(path, "needs a port between 1 and 65535")
    if host.lower() == "localhost":
        host = "localhost"
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ConfigInvalid(path, "the host must be an IP address or localhost") from None
        if address.is_unspecified:
            raise ConfigInvalid(path, "must not listen on every address (0.0.0.0 or ::)")
        if not (
            address.is_loopback
            or address.is_link_local
            or any(
                address.version == network.version and address in network
                for network in _PRIVATE_NETWORKS
            )
        ):
            raise ConfigInvalid(
                path, "must be a private (RFC 1918 or ULA), loopback or link-local address"
            )
    return BindAddress(host=host, port=int(port_text))
