"""Build small, valid workflow packages for tests.

``make_package`` writes a minimal workflow that the workflow checker accepts: an input
schema with one string field, one call step per connection (with that connection type's
operation and a fitting input), then a finish. The package folder and manifest are produced
with :mod:`core.workflow.package`, so ``verify_package`` accepts it under the returned digest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from core.workflow.package import MANIFEST, SOURCE, build_manifest, digest_of

WORKFLOW_FORMAT = "registry-coordinator/workflow/v1"

# One operation per connection type with an input that fits its command (CONTRACT §14).
_CALLS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "casework-review-producer": (
        "create-review-request",
        {"subjectRef": "${input.subjectRef}", "summary": "Review ${input.subjectRef}"},
        {"reviewId": "${response.reviewId}"},
    ),
    "messaging": (
        "send-notice",
        {"template": "test-notice", "recipientRef": "${input.subjectRef}", "parameters": {}},
        {"messageId": "${response.messageId}"},
    ),
    "scheduling": (
        "book-slot",
        {"slotRef": "slot-1", "subjectRef": "${input.subjectRef}"},
        {"bookingId": "${response.bookingId}"},
    ),
    "breg-action": (
        "submit-action",
        {"actionType": "test-action", "subjectRef": "${input.subjectRef}", "payload": {}},
        {"actionId": "${response.actionId}"},
    ),
}


def workflow_source(workflow_id: str, connections: dict[str, str], version: str = "1.0.0") -> bytes:
    """The ``workflow.yaml`` bytes of a minimal valid workflow using ``connections``."""
    steps: dict[str, Any] = {}
    names = sorted(connections)
    step_ids = [f"call-{name}" for name in names]
    for position, name in enumerate(names):
        operation, command, output = _CALLS[connections[name]]
        steps[step_ids[position]] = {
            "call": {
                "connection": name,
                "operation": operation,
                "input": command,
                "output": output,
            },
            "next": step_ids[position + 1] if position + 1 < len(names) else "done",
        }
    steps["done"] = {"finish": {"outcome": "completed"}}
    document = {
        "format": WORKFLOW_FORMAT,
        "id": workflow_id,
        "version": version,
        "description": "A test workflow.",
        "input": {
            "type": "object",
            "additionalProperties": False,
            "required": ["subjectRef"],
            "properties": {"subjectRef": {"type": "string", "maxLength": 64}},
        },
        "connections": dict(sorted(connections.items())),
        "outcomes": ["completed"],
        "start": step_ids[0] if step_ids else "done",
        "steps": steps,
    }
    return yaml.safe_dump(document, sort_keys=False).encode("utf-8")


def make_package(
    directory: Path, workflow_id: str, connections: dict[str, str], version: str = "1.0.0"
) -> tuple[Path, str]:
    """Write the package ``directory/<id>-<version>/``; return its root and digest."""
    source = workflow_source(workflow_id, connections, version)
    manifest = build_manifest(workflow_id, version, connections, source)
    root = directory / f"{workflow_id}-{version}"
    root.mkdir(parents=True)
    (root / SOURCE).write_bytes(source)
    (root / MANIFEST).write_bytes(manifest)
    return root, digest_of(manifest)
