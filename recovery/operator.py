"""Deployment-wide operator actions: the restore holds and retention (CONTRACT §10.5, §11).

The gateway validated the body before it called; it is checked again here, since this
component must not act on a body nobody checked (another caller of the internal API, a
gateway of another version). The order: parse the JSON object, check it has exactly the
action's members, check each member, then carry the action out in :mod:`recovery.holds`
or :mod:`recovery.retention`. Every refusal is ``request.invalid`` naming the member at
fault, never the value sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from core.clock import parse_offset_instant
from core.codes import Code
from core.errors import CoordinatorError
from core.runs import MAX_RETAIN_LIMIT, REFERENCE
from recovery import holds, retention
from recovery.env import RecoveryEnv


def _invalid(detail: str) -> CoordinatorError:
    return CoordinatorError(Code.REQUEST_INVALID, detail)


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _invalid("the body repeats a member name")
        found[key] = value
    return found


def _object(body_json: str) -> dict[str, Any]:
    try:
        value = json.loads(body_json, object_pairs_hook=_no_repeats)
    except ValueError:
        raise _invalid("the body is not a JSON object") from None
    if not isinstance(value, dict):
        raise _invalid("the body is not a JSON object")
    return value


def _members(body: Mapping[str, Any], names: tuple[str, ...]) -> None:
    if any(key not in names for key in body):
        raise _invalid("the body has a member this action does not take")
    for name in names:
        if name not in body:
            raise _invalid(f"/{name}: required")


def _reference(body: Mapping[str, Any], name: str) -> str:
    value = body[name]
    if not isinstance(value, str) or not REFERENCE.fullmatch(value):
        raise _invalid(f"/{name}: must be 1-128 characters of letters, digits and . _ : / -")
    return value


def _attested(body: Mapping[str, Any], name: str) -> None:
    if body[name] is not True:
        raise _invalid(f"/{name}: must be true")


def _instant(body: Mapping[str, Any], name: str) -> datetime:
    value = body[name]
    instant = parse_offset_instant(value) if isinstance(value, str) else None
    if instant is not None:
        return instant
    raise _invalid(f"/{name}: must be an RFC 3339 date-time with an offset")


def _limit(body: Mapping[str, Any], name: str) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RETAIN_LIMIT:
        raise _invalid(f"/{name}: must be an integer from 1 to {MAX_RETAIN_LIMIT}")
    return value


def _attestation(body: Mapping[str, Any], history_flag: str) -> str:
    _members(body, ("recoveryReference", history_flag, "priorDeploymentFenced"))
    reference = _reference(body, "recoveryReference")
    _attested(body, history_flag)
    _attested(body, "priorDeploymentFenced")
    return reference


def _reason(body: Mapping[str, Any]) -> str:
    _members(body, ("reason",))
    return _reference(body, "reason")


ACTIONS: Final = (
    "restore-hold",
    "complete-execution-recovery",
    "release-restore-hold",
    "release-admission-hold",
    "retain",
)


async def operator_action(env: RecoveryEnv, action: str, body_json: str) -> dict[str, Any]:
    """Carry out the deployment-wide ``action`` with its validated JSON body."""
    if action not in ACTIONS:
        # The action name is caller text: it is not repeated back.
        raise _invalid("no such operator action")
    body = _object(body_json)
    if action == "restore-hold":
        return await holds.restore_hold(env, _reason(body))
    if action == "complete-execution-recovery":
        reference = _attestation(body, "executionHistoryComplete")
        return await holds.complete_execution_recovery(env, reference)
    if action == "release-restore-hold":
        return await holds.release_restore_hold(env, _reason(body))
    if action == "release-admission-hold":
        reference = _attestation(body, "admissionHistoryComplete")
        return await holds.release_admission_hold(env, reference)
    _members({k: v for k, v in body.items() if k != "dryRun"}, ("before", "limit"))
    before = _instant(body, "before")
    limit = _limit(body, "limit")
    dry_run = body.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise _invalid("/dryRun: must be true or false")
    return await retention.retain(env, before, limit, dry_run=dry_run)
