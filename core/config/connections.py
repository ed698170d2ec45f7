"""The ``connections`` block of the runtime file: each product connection (CONTRACT §5).

Part of :mod:`core.config.load`, which reads the rest of the file; every rule here can be
judged from the file alone. Which connections the packages need is checked in
:mod:`core.config.check`.
"""

from __future__ import annotations

import re

from core.config import reader as r
from core.config.context import Context
from core.config.model import (
    CASEWORK,
    CONNECTION_TYPES,
    DEFAULT_CALL_TIMEOUT_SECONDS,
    DEFAULT_RESULT_CHECK_SECONDS,
    Completion,
    Connection,
    ConnectionAuthorization,
)
from core.errors import ConfigInvalid
from core.paths import index, key
from core.yamlsafe import FAILED, Maybe, Problems, need, need_all

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,127}")
SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,256}")
URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[\x21-\x7e]+")

_NAME_RULE = "a letter, then up to 63 letters, digits, _ or -"


def check_name(name: str, path: str) -> None:
    """A name an author or operator chose (a connection, a policy, an event source)."""
    if not NAME.fullmatch(name):
        raise ConfigInvalid(path, f"a name must be {_NAME_RULE}")


def read_connections(value: object, path: str, context: Context) -> dict[str, Connection]:
    loaded = context.loaded
    loaded.connections = None
    entries = r.named_entries(value, path)
    loaded.connections = {}
    result: dict[str, Maybe[Connection]] = {}
    bindings: dict[str, str] = {}
    for name, entry in entries.items():
        entry_path = key(path, name)
        named = context.problems.attempt(check_name, name, entry_path)
        connection = context.problems.attempt(_connection, name, entry, entry_path, context)
        if connection is FAILED:
            loaded.unreadable_connections.add(name)
            result[name] = FAILED
            continue
        loaded.connections[name] = connection
        result[name] = FAILED if named is FAILED else connection
        if connection.completion is not None:
            binding = connection.completion.recipient_binding
            if binding in bindings:
                context.problems.add(
                    ConfigInvalid(
                        key(key(entry_path, "completion"), "recipientBinding"),
                        f"the same binding as connections.{bindings[binding]}; "
                        "bindings must be unique",
                    )
                )
                result[name] = FAILED
            else:
                bindings[binding] = name
    return dict(zip(result, need_all(result.values()), strict=True))


_CASEWORK_ONLY = ("producer", "completion", "resultCheckSeconds")


def _connection(name: str, value: object, path: str, context: Context) -> Connection:
    problems = context.problems
    block = r.mapping(
        value,
        path,
        problems,
        required=("type", "baseUrl", "profile", "authorization"),
        optional=(*_CASEWORK_ONLY, "callTimeoutSeconds", "trustedRootCertificateRef"),
    )
    kind = block.read("type", _connection_type)
    producer: Maybe[str | None] = None
    completion: Maybe[Completion | None] = None
    result_check: Maybe[int | None] = None
    # What a connection may and must hold depends on its type; with the type refused, the
    # type-specific keys are not judged.
    if kind is FAILED:
        producer = FAILED
    elif kind != CASEWORK:
        for extra in _CASEWORK_ONLY:
            if extra in block:
                problems.add(
                    ConfigInvalid(key(path, extra), f"only {CASEWORK} connections take {extra}")
                )
                producer = FAILED
    else:
        if "producer" not in block:
            problems.add(
                ConfigInvalid(key(path, "producer"), f"required for {CASEWORK} connections")
            )
        producer = block.read("producer", r.visible, max_len=128)
        completion = block.optional("completion", None, _completion, context)
        result_check = block.optional(
            "resultCheckSeconds", DEFAULT_RESULT_CHECK_SECONDS, r.integer, low=60, high=86400
        )
    call_timeout = block.optional(
        "callTimeoutSeconds", DEFAULT_CALL_TIMEOUT_SECONDS, r.integer, low=1, high=300
    )
    root_ref = block.optional("trustedRootCertificateRef", None, r.reference, context.providers)
    base_url = block.read("baseUrl", r.url)
    profile = block.read(
        "profile",
        r.string,
        pattern=PROFILE,
        expected="1 to 128 of A-Z a-z 0-9 . _ ~ - (not starting with . _ ~ -)",
    )
    authorization = block.read("authorization", _authorization, context)
    return Connection(
        name=name,
        type=need(kind),
        base_url=need(base_url),
        profile=need(profile),
        authorization=need(authorization),
        producer=need(producer),
        completion=need(completion),
        result_check_seconds=need(result_check),
        call_timeout_seconds=need(call_timeout),
        trusted_root_certificate_ref=need(root_ref),
    )


def _connection_type(value: object, path: str) -> str:
    kind = r.string(value, path, max_bytes=64)
    if kind not in CONNECTION_TYPES:
        raise ConfigInvalid(path, "must be one of " + ", ".join(CONNECTION_TYPES))
    return kind


def _authorization(value: object, path: str, context: Context) -> ConnectionAuthorization:
    block = r.mapping(
        value,
        path,
        context.problems,
        required=("clientId", "signingKeyRef", "scopes"),
        optional=("audience",),
    )
    scopes = block.read("scopes", _scopes, context.problems)
    audience = block.optional("audience", None, _token_audience)
    client_id = block.read("clientId", r.visible, max_len=255)
    signing_key = block.read("signingKeyRef", r.reference, context.providers)
    return ConnectionAuthorization(
        client_id=need(client_id),
        signing_key_ref=need(signing_key),
        scopes=need(scopes),
        audience=need(audience),
    )


def _scopes(value: object, path: str, problems: Problems) -> tuple[str, ...]:
    scopes: list[Maybe[str]] = []
    for position, entry in enumerate(r.sequence(value, path, min_items=1)):
        scopes.append(problems.attempt(_scope, entry, index(path, position), scopes))
    return tuple(need_all(scopes))


def _scope(value: object, path: str, earlier: list[Maybe[str]]) -> str:
    scope = r.string(
        value,
        path,
        pattern=SCOPE,
        expected="an OAuth scope: 1 to 256 visible ASCII characters "
        "without spaces, quotes or backslashes",
    )
    if scope in earlier:
        raise ConfigInvalid(path, "listed twice")
    return scope


def _token_audience(value: object, path: str) -> str:
    audience = r.string(value, path, pattern=URI_SCHEME, expected="an absolute URI", max_bytes=2048)
    if "#" in audience:
        raise ConfigInvalid(path, "must not have a fragment")
    return audience


def _completion(value: object, path: str, context: Context) -> Completion:
    block = r.mapping(
        value, path, context.problems, required=("recipientBinding", "bearerTokenRef")
    )
    binding = block.read("recipientBinding", r.visible, max_len=256)
    token = block.read("bearerTokenRef", r.reference, context.providers)
    return Completion(recipient_binding=need(binding), bearer_token_ref=need(token))
