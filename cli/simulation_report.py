"""What ``coordinatorctl workflow simulate`` says of a simulated run: where it differs from
the script's ``expect`` (its end, its path, each step's state), the trace as JSON (every
decision a field) and as text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cli.simulate import Event, Simulation
from core import clock

# ------------------------------------------------------------------------------------ the verdict


def mismatches(expect: Mapping[str, Any], end: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Where the run's end differs from ``expect`` (only what ``expect`` names is compared)."""
    out: list[str] = []
    for name, wanted in expect.items():
        if not prefix and name in ("steps", "path"):
            continue  # about the way, not the end: see differences
        got = end.get(name)
        if isinstance(wanted, dict) and isinstance(got, dict):
            out.extend(mismatches(wanted, got, f"{prefix}{name}."))
        elif wanted != got:
            out.append(
                f"expect.{prefix}{name}: expected {_show(wanted)}, the run gave {_show(got)}"
            )
    return out


def differences(expect: Mapping[str, Any], simulation: Simulation) -> list[str]:
    """Where the run differs from ``expect``: its end, then its path, then its steps."""
    out = mismatches(expect, simulation.end)
    wanted_path = expect.get("path")
    taken = [ev.step for ev in simulation.events]
    if wanted_path is not None and list(wanted_path) != taken:
        at = next(
            (
                i
                for i, pair in enumerate(zip(wanted_path, taken, strict=False))
                if len(set(pair)) > 1
            ),
            min(len(wanted_path), len(taken)),
        )
        out.append(
            f"expect.path: expected {_show(list(wanted_path))}, the run took {_show(taken)} "
            f"(first difference at [{at}])"
        )
    for step_id, wanted in (expect.get("steps") or {}).items():
        where = f"expect.steps.{step_id}"
        state = wanted["state"] if isinstance(wanted, dict) else wanted
        last = next((ev for ev in reversed(simulation.events) if ev.step == step_id), None)
        if last is None:
            out.append(f"{where}: expected {_show(state)}, the run never reached it")
            continue
        if last.state != state:
            out.append(f"{where}: expected {_show(state)}, the step ended {_show(last.state)}")
        if isinstance(wanted, dict) and "at" in wanted:
            instant = (
                wanted["at"].isoformat() if isinstance(wanted["at"], datetime) else wanted["at"]
            )
            when = last.ended_at or last.at
            if clock.parse_instant(instant) != clock.parse_instant(when):
                out.append(f"{where}.at: expected {instant}, the step ended at {when}")
    return out


def _show(value: Any) -> str:
    return "nothing" if value is None else json.dumps(value, ensure_ascii=False)


def document(simulation: Simulation, expect: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON form (``--output json``)."""
    wrong = differences(expect, simulation)
    return {
        "workflow": {"id": simulation.workflow.id, "version": simulation.workflow.version},
        "runId": simulation.run_id,
        "startedAt": clock.timestamp(simulation.started_at),
        "path": [e.document() for e in simulation.events],
        "end": simulation.end,
        "asExpected": not wrong,
        "mismatches": wrong,
    }


def _pairs(values: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{name}={value if isinstance(value, str) else _show(value)}"
        for name, value in values.items()
    )


def _event_lines(ev: Event) -> list[str]:
    """The lines of one step below its heading: every decision the step made."""
    lines: list[str] = []
    if ev.operator is not None:
        action = ev.operator
        line = f"operator {action['action']} at {action['at']}"
        if "receipt" in action:
            line += f": receipt {action['receipt']}"
        if "refused" in action:
            line += f"; refused: {action['refused']}"
            if "detail" in action:
                line += f" ({action['detail']})"
        lines.append(line)
    if ev.request is not None:
        req = ev.request
        lines.append(f"send    {req['method']} {req['url']}")
        lines.append(f"key     {req['key']}")
        lines.append(f"command {json.dumps(req['body'], ensure_ascii=False, sort_keys=True)}")
    for attempt in ev.attempts:
        cause = f", cause {attempt['cause']}" if "cause" in attempt else ""
        line = (
            f"answer  {attempt['at']}  {attempt['answer']} -> {attempt['result']} "
            f"({attempt['reason']}{cause})"
        )
        if "nextAttemptAt" in attempt:
            following = attempt["nextAttemptAt"]
            line += (
                f"; next attempt {following}"
                if following is not None
                else "; no next attempt: the deadline comes first"
            )
        lines.append(line)
    if ev.branch is not None:
        branch = "otherwise" if ev.branch == "otherwise" else f"branch {ev.branch}"
        lines.append(f"took    {branch} -> {ev.next}")
        if ev.read:
            lines.append(f"read    {_pairs(ev.read)}")
    if ev.fired is not None:
        why, at = ev.fired["why"], ev.fired["at"]
        if why == "decision":
            lines.append(f"fired   decision at {at}: {_pairs(ev.decision or {})}")
        elif why == "timeout":
            lines.append(f"fired   timeout at {at}")
            if ev.ignored is not None:
                lines.append(
                    f"ignored the decision scripted for {ev.ignored['at']}: it comes after "
                    "the timeout"
                )
        elif why == "due":
            lines.append(f"fired   due at {at}")
        else:
            lines.append(f"fired   cancel at {at}: an operator cancels the run here")
    if ev.kept:
        lines.append(f"kept    {_pairs(ev.kept)}")
    if ev.outcome is not None:
        lines.append(f"outcome {ev.outcome}")
    if ev.held is not None:
        lines.append(
            f"held    effect unknown (cause {ev.held['cause']}): never resent automatically; "
            "an operator settles it"
        )
    if ev.failure is not None:
        path = ev.failure.get("failurePath")
        lines.append(f"failed  {ev.failure['kind']}" + (f" at {path}" if path else ""))
    if ev.undecided is not None:
        lines.append(f"the step cannot be decided ({ev.undecided})")
    lines.append(f"state   {ev.state}" + (f" at {ev.ended_at}" if ev.ended_at else ""))
    return lines


def text(simulation: Simulation, expect: Mapping[str, Any]) -> list[str]:
    """The readable form: the path step by step, the end, the verdict."""
    wf = simulation.workflow
    lines = [
        f"simulating {wf.id} {wf.version}: run {simulation.run_id}, "
        f"started {clock.timestamp(simulation.started_at)} (simulated time, simulation key)",
    ]
    for number, ev in enumerate(simulation.events, 1):
        lines.append(f"{number:>3}  {ev.at}  {ev.step} ({ev.type})")
        lines.extend(f"       {line}" for line in _event_lines(ev))
    end = simulation.end
    summary = f"end: {end['state']}"
    if "outcome" in end:
        summary += f", outcome {end['outcome']}"
    if "failure" in end:
        failure = end["failure"]
        summary += f", failure {failure['kind']} at step {failure['step']}"
        if "failurePath" in failure:
            summary += f", failurePath {failure['failurePath'] or '(the whole command)'}"
    if "held" in end:
        summary += f" at step {end['held']['step']} (effect unknown, cause {end['held']['cause']})"
    if "stuck" in end:
        summary += f": step {end['stuck']} cannot be decided"
    lines.append(summary)
    wrong = differences(expect, simulation)
    lines.extend(wrong or ["as expected"])
    return lines
