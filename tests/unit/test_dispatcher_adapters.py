"""Product requests built from the operation catalogue: routes, bodies and headers."""

from __future__ import annotations

import json

import pytest

from core.bindings import Binding
from core.execution.adapters import ADAPTERS, RequestUnbuildable, adapter_for
from core.workflow.catalogue import CONNECTION_TYPES

KEY = "a" * 64


def binding(connection_type: str, **changes: object) -> Binding:
    fields: dict[str, object] = {
        "connection": "conn",
        "type": connection_type,
        "base_url": "https://product.internal.example.org/api/",
        "client_id": "coordinator-client",
        "issuer": "https://issuer.example.org",
        "scopes": frozenset({"scope:a"}),
        "profile": "team profile",
        "producer": "coordinator" if connection_type == "casework-review-producer" else None,
    }
    fields.update(changes)
    return Binding(**fields)  # type: ignore[arg-type]


def test_there_is_one_adapter_per_connection_type() -> None:
    assert set(ADAPTERS) == set(CONNECTION_TYPES)
    modules = {type(a).__module__ for a in ADAPTERS.values()}
    assert modules == {"core.execution.adapters.base"}
    with pytest.raises(KeyError):
        adapter_for("ftp")


def test_a_messaging_request_has_the_route_body_and_three_headers() -> None:
    adapter = adapter_for("messaging")
    op = adapter.operation("send-notice")
    command = {"template": "t", "recipientRef": "r", "parameters": {"b": 1, "a": [2]}}
    request = adapter.build(op, binding("messaging"), command, KEY).authorized("tok-1")
    assert request.method == "POST"
    # The base URL's path is kept; the profile is one percent-encoded path segment.
    assert request.url == (
        "https://product.internal.example.org/api/v1/profiles/team%20profile/messages"
    )
    assert json.loads(request.body) == command
    assert request.headers == {
        "Authorization": "Bearer tok-1",
        "Idempotency-Key": KEY,
        "Content-Type": "application/json",
        "Accept": "application/json",
    }
    assert "tok-1" not in repr(request)


def test_casework_requests_carry_the_bindings_producer() -> None:
    adapter = adapter_for("casework-review-producer")
    op = adapter.operation("create-review-request")
    command = {"subjectRef": "APP-1", "summary": "Application APP-1"}
    request = adapter.build(op, binding(op_type := "casework-review-producer"), command, KEY)
    assert op_type == adapter.connection_type
    assert json.loads(request.body) == {**command, "producer": "coordinator"}
    assert request.url.endswith("/v1/projects/team%20profile/review-requests")


def test_a_casework_binding_without_producer_cannot_build_a_request() -> None:
    adapter = adapter_for("casework-review-producer")
    op = adapter.operation("create-review-request")
    with pytest.raises(RequestUnbuildable) as refused:
        adapter.build(op, binding(adapter.connection_type, producer=None), {}, KEY)
    assert refused.value.pointer == "/producer"


@pytest.mark.parametrize("profile", ["a/b", "..", ""])
def test_a_profile_that_is_not_one_path_segment_is_refused(profile: str) -> None:
    adapter = adapter_for("scheduling")
    op = adapter.operation("book-slot")
    with pytest.raises(RequestUnbuildable):
        adapter.url(op, binding("scheduling", profile=profile))


def test_each_catalogued_operation_builds() -> None:
    for name, adapter in ADAPTERS.items():
        kind = CONNECTION_TYPES[name]
        for op in kind.operations.values():
            request = adapter.build(op, binding(name), {}, KEY)
            assert request.method == op.method
            assert request.url.startswith("https://product.internal.example.org/api/v1/")
