"""What apply would change: the runtime file's packages against the active ones (§6.4)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from core.codes import Code
from core.deploy.model import PlanEntry
from core.errors import CoordinatorError

_WORKFLOW_ID = re.compile(r"[a-z][a-z0-9-]{0,62}")


def removal_ids(remove: Sequence[str]) -> frozenset[str]:
    """The ``--remove-workflow`` values, each checked to be a workflow id."""
    for value in remove:
        if not _WORKFLOW_ID.fullmatch(value):
            # The value is not echoed: it is not known to be an identifier.
            raise CoordinatorError(Code.DEPLOYMENT_REFUSED, "--remove-workflow: not a workflow id")
    return frozenset(remove)


def compute_plan(
    listed: Mapping[str, str], active: Mapping[str, str], remove: Sequence[str]
) -> list[PlanEntry]:
    """One entry per workflow listed or active, ordered by id.

    ``listed`` and ``active`` map workflow id → digest. A workflow that is active, not
    listed and not in ``remove`` refuses with ``deployment.workflow-unlisted``; one listed
    and also named in ``remove`` is a contradiction and refuses with ``deployment.refused``.
    A removal of a workflow that is not active has nothing to do and yields no entry.
    """
    removals = removal_ids(remove)
    for workflow_id in sorted(removals & listed.keys()):
        raise CoordinatorError(
            Code.DEPLOYMENT_REFUSED,
            f"workflow '{workflow_id}' is listed in deployment.packages and cannot be removed",
        )
    entries: list[PlanEntry] = []
    for workflow_id in sorted(listed.keys() | active.keys()):
        current = active.get(workflow_id)
        planned = listed.get(workflow_id)
        if planned is not None:
            if current is None:
                entries.append(PlanEntry(workflow_id, "install", None, planned))
            elif current == planned:
                entries.append(PlanEntry(workflow_id, "unchanged", current, planned))
            else:
                entries.append(PlanEntry(workflow_id, "replace", current, planned))
        elif workflow_id in removals:
            entries.append(PlanEntry(workflow_id, "remove", current, None))
        else:
            raise CoordinatorError(
                Code.DEPLOYMENT_WORKFLOW_UNLISTED,
                f"workflow '{workflow_id}' is active but not listed",
            )
    return entries
