"""Every document crosses gRPC member for member (core/documents.py): turned into its
message, serialised, parsed and rendered back, it is the same JSON text, members in the
same order."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from google.protobuf.message import Message

from core.documents import (
    doctor_document,
    doctor_message,
    inspection_document,
    inspection_message,
    list_document,
    list_message,
    operator_answer_document,
    operator_answer_message,
    status_document,
    status_message,
)
from core.rpc import coordinator_pb2 as pb
from core.runs import Holds, OperatorActionRecord, RunRecord, inspection_of
from tests.helpers.run_records import RUN, T0, step

M = TypeVar("M", bound=Message)


def carried(
    document: dict[str, Any],
    to_message: Callable[[dict[str, Any]], M],
    kind: type[M],
    to_document: Callable[[M], dict[str, Any]],
) -> dict[str, Any]:
    """``document`` after the whole trip: message, bytes, message, document."""
    return to_document(kind.FromString(to_message(document).SerializeToString()))


def same(left: dict[str, Any], right: dict[str, Any]) -> bool:
    """The same members with the same values, in the same order."""
    return json.dumps(left) == json.dumps(right)


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"outcome": "approved", "state": "succeeded", "ended_at": T0},
        {"cancelling": True},
        {"cancelling": True, "state": "cancelled", "ended_at": T0},
        {"failure_kind": "mapping-invalid", "failure_path": "/a/0", "failure_step": "send"},
        {"failure_kind": "refused", "failure_step": "send", "state": "failed", "ended_at": T0},
        {"failure_kind": "deadline-exceeded", "failure_path": "", "failure_step": None},
        {"attention": True, "state": "held"},
    ],
)
def test_a_status_crosses_the_wire_member_for_member(change: dict[str, Any]) -> None:
    document = replace(RUN, **change).status()
    assert same(carried(document, status_message, pb.RunStatus, status_document), document)


def _needing_attention(cause: str | None) -> dict[str, Any]:
    document = replace(RUN, id="run-3", attention=True, state="held").status()
    step: dict[str, Any] = {"step": "send"}
    if cause is not None:
        step["cause"] = cause
        if cause == "status-5xx":
            step["causeStatus"] = 502
    step["since"] = "2026-12-04T09:30:00.000Z"
    document["attentionStep"] = step
    return document


@pytest.mark.parametrize(
    ("cursor", "total", "estimated"), [(None, 2, False), ("Y3Vyc29y", 250_000, True)]
)
def test_a_list_page_crosses_the_wire_member_for_member(
    cursor: str | None, total: int, estimated: bool
) -> None:
    document = {
        "runs": [
            RUN.status(),
            replace(RUN, id="run-2", outcome="approved").status(),
            _needing_attention("status-5xx"),
            _needing_attention(None),
        ],
        "nextCursor": cursor,
        "total": total,
        "totalIsEstimate": estimated,
    }
    assert same(carried(document, list_message, pb.RunList, list_document), document)


def _inspection(run: RunRecord) -> dict[str, Any]:
    due = T0 + timedelta(hours=1)
    return inspection_of(
        run,
        [
            step(1, effect="accepted", ended_at=T0 + timedelta(seconds=5)),
            step(2, step_type="wait-until", state="waiting", due_at=due),
            step(
                3,
                step_type="wait-for",
                state="waiting",
                next_check_at=due,
                timeout_at=due + timedelta(days=14),
                checks=4,
            ),
            step(4, step_type="wait-until", state="ready"),
            step(5, state="uncertain", effect="unknown", attempts=2),
        ],
        Holds(execution=True, admission=False),
        [
            OperatorActionRecord("reconcile", "INC-7", T0),
            OperatorActionRecord("retry-same", None, T0 - timedelta(minutes=1)),
        ],
    )


def _with_causes(document: dict[str, Any]) -> dict[str, Any]:
    """The inspection as recovery shows steps with a cause: after the effect, before the
    wait or the start."""
    steps = document["steps"]
    uncertain = steps[4]
    steps[4] = {
        **{k: uncertain[k] for k in ("step", "type", "state", "attempts", "effect")},
        "cause": "response-timeout",
        "startedAt": uncertain["startedAt"],
    }
    refused = steps[0]
    steps[0] = {
        **{k: refused[k] for k in ("step", "type", "state", "attempts", "effect")},
        "cause": "product-refused",
        "causeStatus": 422,
        **{k: refused[k] for k in ("startedAt", "endedAt")},
    }
    return document


@pytest.mark.parametrize(
    "document",
    [
        _inspection(RUN),
        _with_causes(_inspection(replace(RUN, state="held", attention=True))),
        {
            **_inspection(replace(RUN, cancelling=True)),
            "bindingConflict": True,
            "conflictingConnections": ["casework", "messaging"],
        },
        inspection_of(replace(RUN, state="succeeded", ended_at=T0), [], Holds(False, False), []),
    ],
)
def test_an_inspection_crosses_the_wire_member_for_member(document: dict[str, Any]) -> None:
    assert same(carried(document, inspection_message, pb.Inspection, inspection_document), document)


DOCTOR: dict[str, Any] = {
    "activationReady": True,
    "schemaVersion": 4,
    "databaseId": "db-7f3c",
    "workflows": [
        {"id": "approval-notice", "digest": "sha256:" + "ab" * 32},
        {"id": "booking", "digest": "sha256:" + "cd" * 32},
    ],
    "holds": {"execution": False, "admission": True},
    "state": {
        "auditReady": True,
        "storeReady": True,
        "storeHost": "db-a.example.org:5432",
        "uncertain": 3,
        "held": 2,
        "retrying": 7,
        "dueJobs": 40_000_000_000,
        "waiting": 1_000_000,
        "stateKeyVersionsInUse": [1, 2],
    },
    "tokenRefusals": [{"connection": "casework", "error": "invalid_client"}],
    "mode": "ordinary",
}


@pytest.mark.parametrize(
    "document",
    [
        DOCTOR,
        {
            **DOCTOR,
            "activationReady": False,
            "workflows": [],
            "state": {**DOCTOR["state"], "auditReady": False, "stateKeyVersionsInUse": []},
            "tokenRefusals": [],
            "mode": "recovery-only",
        },
    ],
)
def test_a_doctor_report_crosses_the_wire_member_for_member(document: dict[str, Any]) -> None:
    assert same(carried(document, doctor_message, pb.DoctorReport, doctor_document), document)


HOLDS = {"execution": True, "admission": True}


@pytest.mark.parametrize(
    "document",
    [
        {"holds": HOLDS, "epoch": 3, "snapshot": {"steps": 0, "runs": 0}},
        {"holds": HOLDS, "epoch": 3, "executionRecoveredAt": "2026-05-01T09:00:00.123Z"},
        {"holds": {"execution": False, "admission": True}, "epoch": 3},
        {"holds": {"execution": False, "admission": False}, "epoch": 0},
        {"erased": 2, "runIds": ["run-1", "run-2"]},
        {"erased": 0, "runIds": []},
        {"dryRun": True, "erased": 0, "wouldErase": 1, "runIds": ["run-1"]},
        {"dryRun": True, "erased": 0, "wouldErase": 0, "runIds": []},
    ],
)
def test_an_operator_answer_crosses_the_wire_member_for_member(document: dict[str, Any]) -> None:
    back = carried(
        document, operator_answer_message, pb.OperatorActionReply, operator_answer_document
    )
    assert same(back, document)
