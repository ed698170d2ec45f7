"""How a step ends: what a room that runs steps hands to the transition functions.

A :class:`Settlement` says how a step ends and where its run goes; ``step_settle`` in
``core/db/transitions.sql`` writes it in one call (the dispatcher's
``Settler.conclude``; an operator's reconcile through ``step_operator_settle``),
and the transitions that end a step on the way (a retry past its deadline, a wait-for read
that ends the wait) hand theirs to the same function from inside their own. That function
also decides the cases the executor does not know of — a lost lease, a cancel that abandoned
the step, the execution hold, an ended or erased run — and answers which it met as a
:class:`core.states.Transition`. Each transition is one statement, so a crash leaves either
all of an outcome or none of it (CONTRACT §9.3: an outcome is committed before the next step
is due).

A step abandoned by a cancel (the run is cancelling and the step comes before its onCancel
path, or there is no such path; ``step_leased`` decides it under the lock) still gets its own
outcome — an accepted effect is kept, a refusal or an uncertain answer recorded — but nothing
follows it: a retry or a wait ends it ``cancelled``, and when the cancel has no onCancel path
and the run is left with no live step, the same statement ends the run ``cancelled``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from core.crypto import Keyring
from core.db.statements import SettleArgs
from core.execution.onward import Onward
from core.payloads import seal_json
from core.states import RunState, StepState, Transition

UNCERTAIN_CAUSES: Final = frozenset(
    {
        "timeout-after-send",
        "connection-lost",
        "status-5xx",
        "unreadable-answer",
        "framing-violation",
        "answer-too-large",
        "lease-expired",
    }
)
"""Why a call the dispatcher settles as uncertain has an unknown effect (CONTRACT §8.4;
``step.cause`` in schema.sql). ``restore-snapshot`` is recovery's, and the causes of
:class:`core.states.SentNothing` belong to a step that sent nothing, so none of them is
one."""


def misses_deadline(deadline_at: datetime | None, now: datetime, delay: float) -> bool:
    """Whether a retry ``delay`` seconds after ``now`` would come too late for a step due
    by ``deadline_at`` (then the run fails ``deadline-exceeded``): the simulator's copy of
    the rule ``step_retry`` (transitions.sql) applies in the database."""
    return deadline_at is not None and (deadline_at - now).total_seconds() <= delay


@dataclass(frozen=True)
class Failure:
    """Why a run failed (CONTRACT §8.3): kind, and a JSON pointer where one applies."""

    kind: str
    path: str | None = None


@dataclass(frozen=True)
class Settlement:
    """How a step ends and where its run goes next: what ``step_settle`` writes."""

    state: str
    """The step's end: completed, refused, failed, or cancelled."""
    effect: str | None = None
    """The call's effect; ``None`` keeps the present one."""
    keep: Mapping[str, Any] = field(default_factory=dict)
    """Payloads of the step to store (purpose -> value), sealed on the way."""
    way: Onward | None = None
    """Where the run continues; ``None`` when it ends here."""
    run_state: str | None = None
    """The run's end (succeeded, failed) when it ends."""
    outcome: str | None = None
    failure: Failure | None = None

    @classmethod
    def onward(
        cls,
        way: Onward,
        *,
        state: str = StepState.COMPLETED,
        effect: str | None = None,
        keep: Mapping[str, Any] | None = None,
    ) -> Settlement:
        """The step ends and the run goes ``way``: through its local steps to its next
        step, or to the finish that ends it."""
        if way.next_step is None:
            return cls(state, effect, keep or {}, way, RunState.SUCCEEDED, way.outcome)
        return cls(state, effect, keep or {}, way)

    @classmethod
    def finishing(cls, outcome: str) -> Settlement:
        """A finish step: the run ends with ``outcome``."""
        return cls(StepState.COMPLETED, run_state=RunState.SUCCEEDED, outcome=outcome)

    @classmethod
    def failing(
        cls,
        failure: Failure,
        *,
        state: str = StepState.FAILED,
        effect: str | None = None,
        keep: Mapping[str, Any] | None = None,
    ) -> Settlement:
        """The step ends ``state`` and the run fails with ``failure``."""
        return cls(state, effect, keep or {}, None, RunState.FAILED, failure=failure)

    def arguments(self, keyring: Keyring, namespace: str, run_id: str) -> SettleArgs:
        """The ``settle_args`` value ``step_settle`` takes after run, step and owner (and
        ``step_operator_settle`` after the row version): the ``settle`` argument of
        ``dispatcher_step_settle``, ``recovery_step_settle`` and ``waits_record_read``, with
        the payloads sealed (once: a retried settle reuses it)."""
        way = self.way
        failure = self.failure
        sealed = [seal_json(keyring, namespace, run_id, p, v) for p, v in self.keep.items()]
        return SettleArgs(
            state=self.state,
            effect=self.effect,
            purposes=list(self.keep),
            key_versions=[x.key_version for x in sealed],
            nonces=[x.nonce for x in sealed],
            ciphertexts=[x.ciphertext for x in sealed],
            passed_ids=[] if way is None else way.step_ids,
            passed_types=[] if way is None else way.step_types,
            next_step=None if way is None else way.next_step,
            next_type=None if way is None else way.next_kind,
            run_state=self.run_state,
            outcome=self.outcome,
            failure_kind=None if failure is None else failure.kind,
            failure_path=None if failure is None else failure.path,
        )

    def describe(self, outcome: Transition) -> str:
        """One line for the info log of what the settle wrote."""
        if outcome is Transition.WRITTEN:
            way = self.way
            passed = "" if way is None else "".join(f"; {i} ({k}) completed" for i, k in way.passed)
            if way is None:
                return f"{self.state}; the run {self.run_state} (outcome {self.outcome})"
            if way.next_step is not None:
                return f"{self.state}{passed}; next step {way.next_step} is due"
            return f"{self.state}{passed}; the run ended at its finish (outcome {self.outcome})"
        if outcome is Transition.HELD and self.way is not None and self.way.passed:
            return f"{self.state}; under the execution hold, {self.way.passed[0][0]} is due"
        if outcome is Transition.ABANDONED:
            return f"{self.state}, abandoned by a cancel: nothing follows"
        return f"{self.state} ({outcome}): nothing follows"


CANCEL: Final = Settlement(StepState.CANCELLED)
"""The end of a step a cancel abandoned: whatever it was about to do is not done."""
