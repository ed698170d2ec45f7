"""The operation catalogue: the product routes of CONTRACT §14, and the guide generated from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.workflow import catalogue
from core.workflow.catalogue import (
    CONNECTION_TYPES,
    fill_path,
    operations_markdown,
    results_markdown,
    validate_command,
)

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "authoring.md"

# (type, operation, method and route, author fields, success, response, receipts, window days)
ROUTES = [
    (
        "messaging",
        "send-notice",
        "POST /v1/profiles/{profile}/messages",
        ["template", "recipientRef", "parameters"],
        202,
        ["messageId", "acceptedAt"],
        True,
        7,
    ),
    (
        "scheduling",
        "book-slot",
        "POST /v1/profiles/{profile}/bookings",
        ["slotRef", "subjectRef"],
        201,
        ["bookingId"],
        True,
        7,
    ),
    (
        "breg-action",
        "submit-action",
        "POST /v1/registers/{profile}/actions",
        ["actionType", "subjectRef", "payload"],
        201,
        ["actionId"],
        False,
        1,
    ),
    (
        "breg-action",
        "create-proposal",
        "POST /v1/registers/{profile}/proposals",
        ["subjectRef", "changes"],
        201,
        ["proposalId"],
        False,
        1,
    ),
    (
        "casework-review-producer",
        "create-review-request",
        "POST /v1/projects/{profile}/review-requests",
        ["subjectRef", "summary"],
        201,
        ["reviewId"],
        False,
        1,
    ),
]


@pytest.mark.parametrize(
    ("kind", "name", "route", "fields", "status", "response", "receipts", "days"), ROUTES
)
def test_each_operation_matches_the_product_contract(
    kind: str,
    name: str,
    route: str,
    fields: list[str],
    status: int,
    response: list[str],
    receipts: bool,
    days: int,
) -> None:
    op = catalogue.operation(kind, name)
    assert op is not None
    assert f"{op.method} {op.path}" == route
    assert [f.name for f in op.command] == fields
    assert all(f.required for f in op.command)
    assert op.success_status == status
    assert [f.name for f in op.response] == response
    assert op.has_receipts is receipts
    if receipts:
        assert op.receipt_path == "/v1/profiles/{profile}/receipts/{key}"
    assert op.retry_same_seconds == days * 86_400


def test_the_catalogue_holds_exactly_the_contract_operations_and_results() -> None:
    listed = {(t.name, o) for t in CONNECTION_TYPES.values() for o in t.operations}
    assert listed == {(kind, name) for kind, name, *_ in ROUTES}
    decision = catalogue.result("casework-review-producer", "review-decision")
    assert decision is not None
    assert f"{decision.method} {decision.path}" == (
        "GET /v1/projects/{profile}/review-requests/{reviewId}"
    )
    assert [f.name for f in decision.identifying] == ["reviewId"]
    assert [f.name for f in decision.fields] == ["outcome", "decidedAt"]
    others = [t for t in CONNECTION_TYPES.values() if t.name != "casework-review-producer"]
    assert all(not t.results for t in others)


def test_producer_comes_from_the_connection_not_the_author() -> None:
    op = catalogue.operation("casework-review-producer", "create-review-request")
    assert op is not None
    assert op.connection_fields == (("producer", "producer"),)
    assert op.command_field("producer") is None
    assert "producer" in CONNECTION_TYPES["casework-review-producer"].settings


def test_validate_command_reports_pointers_without_values() -> None:
    op = catalogue.operation("messaging", "send-notice")
    assert op is not None
    good = {"template": "t", "recipientRef": "r", "parameters": {"a": 1}}
    assert validate_command(op, good) == []
    problems = validate_command(op, {"template": 5, "parameters": "secret-value", "other/x": True})
    assert problems == [
        ("/template", "must be a string, not integer"),
        ("/recipientRef", "is required"),
        ("/parameters", "must be an object, not string"),
        ("/other~1x", "is not a field of send-notice"),
    ]
    assert all("secret-value" not in reason for _, reason in problems)
    assert validate_command(op, ["not", "an", "object"]) == [
        ("", "the command must be a JSON object")
    ]


def test_fill_path_fills_one_segment_per_slot() -> None:
    assert fill_path("/v1/profiles/{profile}/receipts/{key}", {"profile": "p 1", "key": "k:2"}) == (
        "/v1/profiles/p%201/receipts/k:2"
    )
    for bad in ("a/b", "..", ""):
        with pytest.raises(ValueError, match="single path segment"):
            fill_path("/v1/projects/{profile}/review-requests", {"profile": bad})


def test_the_authoring_guide_carries_the_generated_tables() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    assert operations_markdown() in guide, "regenerate with: python -m core.workflow.catalogue"
    assert results_markdown() in guide
    for kind in CONNECTION_TYPES.values():
        for name in (*kind.operations, *kind.results):
            assert f"`{name}`" in guide
