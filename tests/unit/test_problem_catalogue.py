"""The problem catalogue is complete and documented."""

from __future__ import annotations

import re
from pathlib import Path

from core.problems import CATALOGUE, PROBLEM_BASE, lookup

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_CODES = {
    "service.unavailable": 503,
    "audit.response-unavailable": 503,
    "deployment.refused": 409,
    "deployment.activation-changed": 409,
    "binding.conflict": 409,
    "binding.live-conflict": 409,
    "execution.held": 409,
    "admission.held": 409,
    "admission.recovery-only": 409,
    "restore.hold-required": 409,
    "restore.unresolved": 409,
    "restore.review-required": 409,
    "restore.lease-incompatible": 409,
    "reconcile.unsupported": 409,
    "reconcile.refused": 409,
    "reconcile.raced": 409,
    "retry.refused": 409,
    "receipt.expired": 409,
    "run.payload-erased": 409,
    "cancel.refused": 409,
    "start.conflict": 409,
    "authentication.refused": 401,
    "authorization.refused": 403,
    "run.not-found": 404,
    "workflow.not-found": 404,
    "input.invalid": 422,
    "request.invalid": 400,
    "request.too-large": 413,
    "not-found": 404,
    "method-not-allowed": 405,
}


def test_catalogue_has_every_contract_code_with_its_status() -> None:
    assert {code: p.status for code, p in CATALOGUE.items()} == {
        **CONTRACT_CODES,
        "internal": 500,
    }


def test_problem_type_uri() -> None:
    assert lookup("execution.held").type_uri == PROBLEM_BASE + "execution.held"


def test_api_reference_lists_every_code() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^\| `([a-z.-]+)` \| (\d{3}) \|", text, flags=re.MULTILINE))
    expected = {(code, str(status)) for code, status in CONTRACT_CODES.items()}
    assert documented == expected | {("internal", "500")}
