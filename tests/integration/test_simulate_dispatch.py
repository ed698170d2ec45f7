"""``coordinatorctl workflow simulate`` and the real dispatcher, on the same workflow, input,
admission key and run id: the same path, the same command bodies, the same keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import simulate as sim
from cli import simulation_script as scripts
from devstack.postgres import DatabaseHandle
from tests.helpers.dispatching import (
    FORMAT,
    INPUT_SCHEMA,
    ScriptedProduct,
    dispatch_kit,
    notice_call,
)

pytestmark = pytest.mark.postgres

# Two calls, the second mapping what the first kept and the run's id, a choice between them
# on the kept value; then a finish.
STEPS: dict[str, Any] = {
    "send": {"call": notice_call(), "next": "check"},
    "check": {
        "choose": [{"when": {"exists": "${steps.send.messageId}"}, "next": "follow-up"}],
        "otherwise": "lost",
    },
    "follow-up": {
        "call": {
            **notice_call("follow-up"),
            "input": {
                "template": "follow-up",
                "recipientRef": "${input.applicantRef}",
                "parameters": {"previous": "${steps.send.messageId}", "run": "${run.id}"},
            },
        },
        "next": "sent",
    },
    "sent": {"finish": {"outcome": "sent"}},
    "lost": {"finish": {"outcome": "lost"}},
}
WORKFLOW = {
    "format": FORMAT,
    "id": "simulated",
    "version": "1.0.0",
    "description": "Two notices, the second naming the first.",
    "input": INPUT_SCHEMA,
    "connections": {"notices": "messaging"},
    "outcomes": ["sent", "lost"],
    "start": "send",
    "steps": STEPS,
}
ANSWERS = [
    {"messageId": "msg-first", "acceptedAt": "2027-03-01T08:00:00.000Z"},
    {"messageId": "msg-second", "acceptedAt": "2027-03-01T08:00:01.000Z"},
]
RUN_INPUT = {"applicantRef": "applicant-7"}


async def test_the_simulator_sends_what_the_dispatcher_sends(
    tmp_path: Path, database: DatabaseHandle
) -> None:
    workflows = {"simulated": yaml.safe_dump(WORKFLOW, sort_keys=False).encode()}
    async with dispatch_kit(tmp_path, database, workflows=workflows) as kit:
        product = ScriptedProduct(*((202, answer) for answer in ANSWERS))
        kit.product(product)
        dispatcher = await kit.dispatcher()
        run_id = await kit.start("simulated", RUN_INPUT)
        await dispatcher.drain()
        run = await kit.run(run_id)
        dispatched_path = await kit.step_ids(run_id)
        workflow = kit.checked.packages["simulated"].workflow
        admission_key = kit.admission_key

    assert (run["state"], run["outcome"]) == ("succeeded", "sent")
    sent = [
        (json.loads(r["body"]), r["headers"]["idempotency-key"])
        for r in product.requests
        if r["method"] == "POST"
    ]

    script = scripts.parse_script(
        workflow,
        {
            "input": RUN_INPUT,
            "answers": {
                "send": {"status": 202, "body": ANSWERS[0]},
                "follow-up": {"status": 202, "body": ANSWERS[1]},
            },
            "expect": {"state": "succeeded", "outcome": "sent"},
        },
    )
    simulation = sim.simulate(workflow, script, admission_key=admission_key, run_id=run_id)

    assert simulation.end == {"state": "succeeded", "outcome": "sent"}
    assert [e.step for e in simulation.events] == dispatched_path
    simulated = [(c["body"], c["key"]) for c in simulation.commands]
    assert simulated == sent
    # What the comparison compares: both calls, the second carrying the first's kept value.
    assert [body["parameters"] for body, _ in sent] == [
        {"run": run_id},
        {"previous": "msg-first", "run": run_id},
    ]
    assert len({key for _, key in sent}) == 2
