"""Admitting a run from the API (CONTRACT §9.1).

A start is judged in this order: the instance admits at all (not ``--recovery-only``), the
workflow is active, the activation is still the one this service started under, the
admission hold is off, the input fits the workflow's input schema. Then the start identity
is derived with the admission key from the principal, the workflow and the client's
idempotency key. An identity whose run retention erased answers ``run.payload-erased``. A
known identity answers its run again when the input is the same (a keyed digest of the
canonical input tells) and ``start.conflict`` when it is not. A new identity becomes, in
one transaction: the run, a binding per connection the workflow uses, the input sealed
under the active state key, the start identity and the first step, due now.

What needs no database is done once, here: the input is checked against the schema and
made canonical, its keyed digest taken, the run id derived from the identity and the input
sealed. Then one statement, ``admission_start``, judges all the database knows, in the
order above, and writes the new run only when every judgement lets it; it answers the
outcome (and the run, new or known), which :meth:`Admitter.start_identified` turns into
the result or the refusal. A valid new start is that one statement in one implicit
transaction. An input that does not fit is refused only after the activation and the hold,
which come first: one read (``admission_gate``) judges those two.

The recovery-only refusal is :func:`core.runs.refuse_recovery_only`, applied first by
:meth:`Admitter.start` and by the event start (admission/events.py), once per start.

Two starts of one identity racing each other both try to insert the same run id (it is
derived from the identity); the loser's insert fails on the primary key once the winner
commits, and the loser's statement, run once more, finds the winner's identity: the same
run for the same input, ``start.conflict`` for another.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final, TypeVar

import asyncpg

from core import derive
from core.callers import Caller
from core.canonical import canonical_json
from core.codes import Code
from core.crypto import Keyring, keyring_from_config, seal
from core.db.statements import AdmissionGateRow, AdmissionStartRow, BindingArgs, StartArgs
from core.errors import CoordinatorError
from core.payloads import statement
from core.runs import RunRecord, StartResult, check_idempotency_key, refuse_recovery_only
from core.runtime import Runtime, Store
from core.workflow.model import Workflow, step_kind
from core.workflow.schema import validate_input

MAX_INPUT_BYTES: Final = 64 * 1024
INPUT_DIGEST_LABEL: Final = "registry-coordinator input-digest v1"
# How often a start is tried when a concurrent identical start wins the insert; the second
# try always finds the winner's identity row, so two are enough.
_ATTEMPTS: Final = 2


def parse_input(text: str) -> Any:
    """The start input from its JSON text; malformed JSON is ``request.invalid``."""
    if len(text.encode("utf-8")) > MAX_INPUT_BYTES:
        raise CoordinatorError(Code.REQUEST_TOO_LARGE, "the start input is larger than 64 KiB")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError):
        raise CoordinatorError(Code.REQUEST_INVALID, "input: not a JSON document") from None


def canonical_input(value: Any) -> bytes:
    """RFC 8785 bytes of the input: what is sealed and what the input digest covers."""
    try:
        return canonical_json(value)
    except (ValueError, TypeError, RecursionError):
        # rfc8785 refuses numbers JSON peers cannot all read alike (beyond 2**53, NaN).
        raise CoordinatorError(
            Code.INPUT_INVALID,
            "input holds a number outside the range every JSON reader agrees on",
            {"errors": [{"pointer": "", "reason": "holds a number outside the safe range"}]},
        ) from None


def input_digest(admission_key: bytes, canonical_bytes: bytes) -> str:
    """Keyed digest of a canonical input (hex HMAC-SHA-256 under the admission key).

    Keyed, so the stored digest of a small input cannot be tested against guesses by
    someone who reads the database without the key.
    """
    message = derive.encode_fields(INPUT_DIGEST_LABEL) + canonical_bytes
    return hmac.new(admission_key, message, hashlib.sha256).hexdigest()


def input_errors(workflow: Workflow, value: Any) -> None:
    """Refuse an input that breaks the workflow's input schema (pointers, never values)."""
    problems = validate_input(workflow.input_schema, value)
    if problems:
        errors = [{"pointer": pointer, "reason": reason} for pointer, reason in problems]
        first_pointer, first_reason = problems[0]
        raise CoordinatorError(
            Code.INPUT_INVALID,
            f"input{first_pointer or ''}: {first_reason}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            {"errors": errors},
        )


class StartOutcome(StrEnum):
    """What ``admission_start`` judged (``admission_gate`` judges the first two, or open)."""

    ACTIVATION_CHANGED = "activation-changed"
    ADMISSION_HELD = "admission-held"
    OPEN = "open"
    ERASED = "erased"
    KNOWN = "known"
    CONFLICT = "conflict"
    CREATED = "created"


_REFUSALS: Final[Mapping[StartOutcome, tuple[Code, str]]] = {
    StartOutcome.ACTIVATION_CHANGED: (
        Code.DEPLOYMENT_ACTIVATION_CHANGED,
        "apply changed the active packages; restart the service with its runtime file",
    ),
    StartOutcome.ADMISSION_HELD: (
        Code.ADMISSION_HELD,
        "the admission hold is set; release-admission-hold ends it",
    ),
    StartOutcome.ERASED: (
        Code.RUN_PAYLOAD_ERASED,
        "the run of this idempotency key was erased by retention",
    ),
    StartOutcome.CONFLICT: (
        Code.START_CONFLICT,
        "this idempotency key started a run with a different input",
    ),
}


_Judged = TypeVar("_Judged", AdmissionStartRow, AdmissionGateRow)
_Value = TypeVar("_Value")


def _judged(row: _Judged | None) -> tuple[StartOutcome, _Judged]:
    """The outcome an ``admission_start`` or ``admission_gate`` row names, with the row;
    the refusal raised when the outcome is one."""
    if row is None:
        raise CoordinatorError(Code.SERVICE_UNAVAILABLE, "the namespace has no hold row")
    outcome = StartOutcome(row.start_outcome)
    refusal = _REFUSALS.get(outcome)
    if refusal is not None:
        code, detail = refusal
        raise CoordinatorError(code, detail)
    return outcome, row


def _present(value: _Value | None) -> _Value:
    """A run column of an ``admission_start`` row that answers a run (created or known):
    null only when the row has no run, which a known identity's row never lacks (it
    references its run)."""
    if value is None:
        raise CoordinatorError(Code.RUN_NOT_FOUND, "the run of this start is missing")
    return value


def _answered_run(row: AdmissionStartRow) -> RunRecord:
    """The run an ``admission_start`` row answers with (its columns are ``run_read``'s,
    each null when the row answers no run)."""
    return RunRecord(
        id=_present(row.id),
        workflow_id=_present(row.workflow_id),
        workflow_version=_present(row.workflow_version),
        package_digest=_present(row.package_digest),
        principal_iss=_present(row.principal_iss),
        principal_sub=_present(row.principal_sub),
        state=_present(row.state),
        outcome=row.outcome,
        attention=_present(row.attention),
        cancelling=_present(row.cancelling),
        failure_kind=row.failure_kind,
        failure_path=row.failure_path,
        failure_step=row.failure_step,
        created_at=_present(row.created_at),
        updated_at=_present(row.updated_at),
        ended_at=row.ended_at,
    )


class Admitter:
    """Starts runs for one deployment; shared by every Start call of the servicer."""

    def __init__(self, runtime: Runtime, store: Store, admission_key: bytes, keyring: Keyring):
        self.runtime = runtime
        self.store = store
        self._admission_key = admission_key
        self._keyring = keyring

    @classmethod
    def from_runtime(cls, runtime: Runtime, store: Store) -> Admitter:
        """Read the admission key and the state keys named by the runtime file."""
        config = runtime.config
        admission_key = runtime.resolver.read_key(config.deployment.admission_key_ref)
        return cls(runtime, store, admission_key, keyring_from_config(config, runtime.resolver))

    def _active(self, workflow_id: str) -> tuple[str, Workflow, int]:
        activation = self.store.activation
        if activation is None:
            raise CoordinatorError(Code.SERVICE_UNAVAILABLE, "the activation is not verified yet")
        active = activation.packages.get(workflow_id)
        package = self.runtime.checked.packages.get(workflow_id)
        # Startup verified that the active packages are exactly the runtime file's pins, so
        # the two agree; a workflow in neither is simply not served here.
        if active is None or package is None or package.digest != active.digest:
            raise CoordinatorError(
                Code.WORKFLOW_NOT_FOUND, f"workflow '{workflow_id}' is not active"
            )
        return package.digest, package.workflow, activation.serial

    async def start(
        self, caller: Caller, workflow_id: str, idempotency_key: str, value: Any
    ) -> StartResult:
        """Admit one API start (or answer the run an earlier identical start created)."""
        refuse_recovery_only(self.runtime.recovery_only)
        check_idempotency_key(idempotency_key)
        identity = derive.api_start_identity(
            self._admission_key, caller.iss, caller.sub, workflow_id, idempotency_key
        )
        return await self.start_identified(caller, workflow_id, identity, value)

    async def start_identified(
        self, caller: Caller, workflow_id: str, identity: str, value: Any
    ) -> StartResult:
        """Admit a start whose identity is already derived (a signed event's source and id)
        and whose caller already applied the recovery-only refusal."""
        digest, workflow, serial = self._active(workflow_id)
        plaintext = await self._fitting(workflow, serial, value)
        outcome, row = _judged(
            await self._decide(caller, workflow, digest, serial, identity, plaintext)
        )
        run = _answered_run(row)
        return StartResult(
            created=outcome is StartOutcome.CREATED, run_id=run.id, status=run.status()
        )

    async def _fitting(self, workflow: Workflow, serial: int, value: Any) -> bytes:
        """The canonical bytes of an input that fits the workflow's input schema.

        One that does not is refused with ``input.invalid``, but only after the activation
        and the hold are judged (they come first): one read on this rare path."""
        try:
            input_errors(workflow, value)
            return canonical_input(value)
        except CoordinatorError as error:
            unfit = error
        async with self.store.connection() as conn:
            _judged(await self.store.queries.admission_gate(conn, activation_serial=serial))
        raise unfit

    async def _decide(
        self,
        caller: Caller,
        workflow: Workflow,
        digest: str,
        serial: int,
        identity: str,
        plaintext: bytes,
    ) -> AdmissionStartRow | None:
        """Run ``admission_start`` for a fitting input: its one row (or none), and the new run
        written when the outcome is created."""
        config = self.runtime.config
        bindings = []
        for name in sorted(workflow.connections):
            connection = config.connections.get(name)
            if connection is None:  # the runtime file check makes this unreachable
                raise CoordinatorError(Code.DEPLOYMENT_REFUSED, f"connections.{name}: missing")
            bindings.append(
                BindingArgs(
                    connection=name,
                    connection_type=connection.type,
                    base_url=connection.base_url,
                    client_id=connection.authorization.client_id,
                    scopes=list(connection.authorization.scopes),
                    audience=connection.token_audience,
                    profile=connection.profile,
                    producer=connection.producer,
                )
            )
        run_id = derive.run_id(self._admission_key, identity)
        sealed = seal(self._keyring, config.namespace, run_id, "input", plaintext)
        start = StartArgs(
            run_id=run_id,
            workflow_id=workflow.id,
            package_digest=digest,
            principal_iss=caller.iss,
            principal_sub=caller.sub,
            client_id=caller.client_id or None,
            issuer=config.deployment.authentication.issuer,
            bindings=bindings,
            key_version=sealed.key_version,
            nonce=sealed.nonce,
            ciphertext=sealed.ciphertext,
            identity=identity,
            input_digest=input_digest(self._admission_key, plaintext),
            first_step=workflow.start,
            first_step_type=step_kind(workflow.step(workflow.start)),
            activation_serial=serial,
        )
        for attempt in range(_ATTEMPTS):
            try:
                # Every default timestamp and the first step's due time come from SQL now().
                async with statement(self.store) as conn:
                    row = await self.store.queries.admission_start(conn, start=start)
                return row
            except asyncpg.UniqueViolationError:
                if attempt + 1 == _ATTEMPTS:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover
