"""The documents recovery and admission answer, as the messages that carry them and back.

A component builds each HTTP document from its own rows (:mod:`core.runs`,
:mod:`recovery.reads`, :mod:`recovery.holds`, :mod:`recovery.retention`); the gateway
shows it to the client. Between the two it travels as a typed message of
``coordinator.proto``. Each ``*_message`` function here turns a document into its message,
and the matching ``*_document`` function renders the message back into the same document,
member for member and in the same order, so a round trip changes nothing (tests/unit/
test_documents.py checks every one). An optional member the document leaves out is an
unset optional field; a member the document shows as ``null`` is an unset optional field
too, rendered as ``None``.

Nothing here reads a row or decides anything: a new member of a document is one field in
the proto file and one line in each direction here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.rpc import coordinator_pb2 as pb

# ------------------------------------------------------------------------------ run status


def status_message(document: Mapping[str, Any]) -> pb.RunStatus:
    """A status document (:meth:`core.runs.RunRecord.status`) as its message."""
    workflow = document["workflow"]
    message = pb.RunStatus(
        run_id=document["runId"],
        workflow=pb.RunStatus.Workflow(
            id=workflow["id"], version=workflow["version"], digest=workflow["digest"]
        ),
        state=document["state"],
        attention=document["attention"],
        cancelling=document.get("cancelling", False),
        created_at=document["createdAt"],
        updated_at=document["updatedAt"],
    )
    if "outcome" in document:
        message.outcome = document["outcome"]
    failure = document.get("failure")
    if failure is not None:
        message.failure.kind = failure["kind"]
        if "failurePath" in failure:
            message.failure.failure_path = failure["failurePath"]
        if failure["step"] is not None:
            message.failure.step = failure["step"]
    if "endedAt" in document:
        message.ended_at = document["endedAt"]
    attention_step = document.get("attentionStep")
    if attention_step is not None:
        message.attention_step.step = attention_step["step"]
        message.attention_step.since = attention_step["since"]
        if "cause" in attention_step:
            message.attention_step.cause = attention_step["cause"]
        if "causeStatus" in attention_step:
            message.attention_step.cause_status = attention_step["causeStatus"]
    return message


def status_document(message: pb.RunStatus) -> dict[str, Any]:
    """The status document a :class:`pb.RunStatus` carries."""
    workflow = message.workflow
    document: dict[str, Any] = {
        "runId": message.run_id,
        "workflow": {"id": workflow.id, "version": workflow.version, "digest": workflow.digest},
        "state": message.state,
    }
    if message.HasField("outcome"):
        document["outcome"] = message.outcome
    document["attention"] = message.attention
    if message.cancelling:
        document["cancelling"] = True
    if message.HasField("failure"):
        failure: dict[str, Any] = {"kind": message.failure.kind}
        if message.failure.HasField("failure_path"):
            failure["failurePath"] = message.failure.failure_path
        failure["step"] = message.failure.step if message.failure.HasField("step") else None
        document["failure"] = failure
    document["createdAt"] = message.created_at
    document["updatedAt"] = message.updated_at
    if message.HasField("ended_at"):
        document["endedAt"] = message.ended_at
    if message.HasField("attention_step"):
        step = message.attention_step
        shown: dict[str, Any] = {"step": step.step}
        if step.HasField("cause"):
            shown["cause"] = step.cause
        if step.HasField("cause_status"):
            shown["causeStatus"] = step.cause_status
        shown["since"] = step.since
        document["attentionStep"] = shown
    return document


def list_message(document: Mapping[str, Any]) -> pb.RunList:
    """A run list page (``{"runs": [status…], "nextCursor": …, "total": N,
    "totalIsEstimate": …}``) as its message."""
    message = pb.RunList(
        runs=[status_message(run) for run in document["runs"]],
        total=document["total"],
        total_is_estimate=document["totalIsEstimate"],
    )
    if document["nextCursor"] is not None:
        message.next_cursor = document["nextCursor"]
    return message


def list_document(message: pb.RunList) -> dict[str, Any]:
    """The run list page a :class:`pb.RunList` carries."""
    return {
        "runs": [status_document(run) for run in message.runs],
        "nextCursor": message.next_cursor if message.HasField("next_cursor") else None,
        "total": message.total,
        "totalIsEstimate": message.total_is_estimate,
    }


# ------------------------------------------------------------------------------ inspection

_STATUS_MEMBERS = frozenset(
    (
        "runId",
        "workflow",
        "state",
        "outcome",
        "attention",
        "cancelling",
        "failure",
        "createdAt",
        "updatedAt",
        "endedAt",
    )
)
"""The members of an inspection that are its run's status."""


def _holds_message(holds: Mapping[str, bool]) -> pb.Holds:
    return pb.Holds(execution=holds["execution"], admission=holds["admission"])


def _holds_document(holds: pb.Holds) -> dict[str, bool]:
    return {"execution": holds.execution, "admission": holds.admission}


def _step_message(step: Mapping[str, Any]) -> pb.Inspection.Step:
    message = pb.Inspection.Step(
        step=step["step"],
        type=step["type"],
        state=step["state"],
        attempts=step["attempts"],
        started_at=step["startedAt"],
    )
    for member, field in (("effect", "effect"), ("cause", "cause"), ("endedAt", "ended_at")):
        if member in step:
            setattr(message, field, step[member])
    if "causeStatus" in step:
        message.cause_status = step["causeStatus"]
    wait = step.get("wait")
    if wait is not None:
        message.wait.checks = wait["checks"]
        for member, field in (
            ("dueAt", "due_at"),
            ("nextCheckAt", "next_check_at"),
            ("timeoutAt", "timeout_at"),
        ):
            if member in wait:
                setattr(message.wait, field, wait[member])
    retry = step.get("retry")
    if retry is not None:
        message.retry.last_cause = retry["lastCause"]
        message.retry.last_attempt_at = retry["lastAttemptAt"]
        for member, field in (
            ("lastStatus", "last_status"),
            ("nextAttemptAt", "next_attempt_at"),
            ("deadlineAt", "deadline_at"),
        ):
            if member in retry:
                setattr(message.retry, field, retry[member])
    return message


def _step_document(message: pb.Inspection.Step) -> dict[str, Any]:
    step: dict[str, Any] = {
        "step": message.step,
        "type": message.type,
        "state": message.state,
        "attempts": message.attempts,
    }
    if message.HasField("effect"):
        step["effect"] = message.effect
    if message.HasField("cause"):
        step["cause"] = message.cause
    if message.HasField("cause_status"):
        step["causeStatus"] = message.cause_status
    if message.HasField("wait"):
        wait: dict[str, Any] = {}
        if message.wait.HasField("due_at"):
            wait["dueAt"] = message.wait.due_at
        if message.wait.HasField("next_check_at"):
            wait["nextCheckAt"] = message.wait.next_check_at
        if message.wait.HasField("timeout_at"):
            wait["timeoutAt"] = message.wait.timeout_at
        wait["checks"] = message.wait.checks
        step["wait"] = wait
    if message.HasField("retry"):
        kept = message.retry
        retry: dict[str, Any] = {"lastCause": kept.last_cause}
        if kept.HasField("last_status"):
            retry["lastStatus"] = kept.last_status
        retry["lastAttemptAt"] = kept.last_attempt_at
        if kept.HasField("next_attempt_at"):
            retry["nextAttemptAt"] = kept.next_attempt_at
        if kept.HasField("deadline_at"):
            retry["deadlineAt"] = kept.deadline_at
        step["retry"] = retry
    step["startedAt"] = message.started_at
    if message.HasField("ended_at"):
        step["endedAt"] = message.ended_at
    return step


def inspection_message(document: Mapping[str, Any]) -> pb.Inspection:
    """An inspection document (:func:`recovery.reads.inspection`) as its message."""
    message = pb.Inspection(
        status=status_message({k: v for k, v in document.items() if k in _STATUS_MEMBERS}),
        steps=[_step_message(step) for step in document["steps"]],
        holds=_holds_message(document["holds"]),
        binding_conflict=document.get("bindingConflict", False),
        conflicting_connections=document.get("conflictingConnections", ()),
    )
    for action in document["lastOperatorActions"]:
        shown = message.last_operator_actions.add(kind=action["kind"], at=action["at"])
        if action["reason"] is not None:
            shown.reason = action["reason"]
    return message


def inspection_document(message: pb.Inspection) -> dict[str, Any]:
    """The inspection document a :class:`pb.Inspection` carries."""
    document = status_document(message.status)
    document["steps"] = [_step_document(step) for step in message.steps]
    document["holds"] = _holds_document(message.holds)
    document["lastOperatorActions"] = [
        {
            "kind": action.kind,
            "reason": action.reason if action.HasField("reason") else None,
            "at": action.at,
        }
        for action in message.last_operator_actions
    ]
    if message.binding_conflict:
        document["bindingConflict"] = True
        document["conflictingConnections"] = list(message.conflicting_connections)
    return document


# ---------------------------------------------------------------------------------- doctor


def doctor_message(document: Mapping[str, Any]) -> pb.DoctorReport:
    """A doctor report (:func:`recovery.reads.doctor`) as its message."""
    state = document["state"]
    return pb.DoctorReport(
        activation_ready=document["activationReady"],
        schema_version=document["schemaVersion"],
        database_id=document["databaseId"],
        workflows=[
            pb.DoctorReport.Workflow(id=workflow["id"], digest=workflow["digest"])
            for workflow in document["workflows"]
        ],
        holds=_holds_message(document["holds"]),
        state=pb.DoctorReport.State(
            audit_ready=state["auditReady"],
            store_ready=state["storeReady"],
            store_host=state["storeHost"],
            uncertain=state["uncertain"],
            held=state["held"],
            retrying=state["retrying"],
            due_jobs=state["dueJobs"],
            waiting=state["waiting"],
            state_key_versions_in_use=state["stateKeyVersionsInUse"],
        ),
        token_refusals=[
            pb.DoctorReport.TokenRefusal(connection=refusal["connection"], error=refusal["error"])
            for refusal in document["tokenRefusals"]
        ],
        mode=document["mode"],
    )


def doctor_document(message: pb.DoctorReport) -> dict[str, Any]:
    """The doctor report a :class:`pb.DoctorReport` carries."""
    state = message.state
    return {
        "activationReady": message.activation_ready,
        "schemaVersion": message.schema_version,
        "databaseId": message.database_id,
        "workflows": [
            {"id": workflow.id, "digest": workflow.digest} for workflow in message.workflows
        ],
        "holds": _holds_document(message.holds),
        "state": {
            "auditReady": state.audit_ready,
            "storeReady": state.store_ready,
            "storeHost": state.store_host,
            "uncertain": state.uncertain,
            "held": state.held,
            "retrying": state.retrying,
            "dueJobs": state.due_jobs,
            "waiting": state.waiting,
            "stateKeyVersionsInUse": list(state.state_key_versions_in_use),
        },
        "tokenRefusals": [
            {"connection": refusal.connection, "error": refusal.error}
            for refusal in message.token_refusals
        ],
        "mode": message.mode,
    }


# ------------------------------------------------------------------ deployment-wide actions


def operator_answer_message(document: Mapping[str, Any]) -> pb.OperatorActionReply:
    """What a deployment-wide action answered (a hold's or retain's document) as its
    message."""
    if "holds" in document:
        hold = pb.HoldAnswer(holds=_holds_message(document["holds"]), epoch=document["epoch"])
        snapshot = document.get("snapshot")
        if snapshot is not None:
            hold.snapshot.steps = snapshot["steps"]
            hold.snapshot.runs = snapshot["runs"]
        if "executionRecoveredAt" in document:
            hold.execution_recovered_at = document["executionRecoveredAt"]
        return pb.OperatorActionReply(hold=hold)
    return pb.OperatorActionReply(
        retain=pb.RetainAnswer(
            dry_run=document.get("dryRun", False),
            erased=document["erased"],
            would_erase=document.get("wouldErase", 0),
            run_ids=document["runIds"],
        )
    )


def operator_answer_document(message: pb.OperatorActionReply) -> dict[str, Any]:
    """The document an :class:`pb.OperatorActionReply` carries."""
    if message.HasField("hold"):
        hold = message.hold
        document: dict[str, Any] = {"holds": _holds_document(hold.holds), "epoch": hold.epoch}
        if hold.HasField("snapshot"):
            document["snapshot"] = {"steps": hold.snapshot.steps, "runs": hold.snapshot.runs}
        if hold.HasField("execution_recovered_at"):
            document["executionRecoveredAt"] = hold.execution_recovered_at
        return document
    retain = message.retain
    if retain.dry_run:
        return {
            "dryRun": True,
            "erased": retain.erased,
            "wouldErase": retain.would_erase,
            "runIds": list(retain.run_ids),
        }
    return {"erased": retain.erased, "runIds": list(retain.run_ids)}
