"""Admitting a run from the API (CONTRACT §9.1).

A start is judged in this order: the instance admits at all (not ``--recovery-only``), the
workflow is active, the admission hold is off, the input fits the workflow's input schema.
Then the start identity is derived with the admission key from the principal, the workflow
and the client's idempotency key. A known identity answers its run again when the input is
the same (a keyed digest of the canonical input tells) and ``start.conflict`` when it is
not; an identity whose run retention erased answers ``run.payload-erased``. A new identity
becomes, in one transaction: the run, a binding per connection the workflow uses, the
input sealed under the active state key, the start identity and the first step, due now.

The common start — a valid input, a new identity, no hold, the activation unchanged — is
one statement (``admission_run_create_checked``) that makes those checks itself and writes
nothing when one fails; the lookup transaction then runs as above and answers with the
refusal (or the known run) in the order given here.

Two identical starts racing each other both try to insert the same run id (it is derived
from the identity); the loser's insert fails on the primary key once the winner commits,
and the loser reads the winner's run back instead.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Final, overload

import asyncpg

from core import clock, derive
from core.callers import Caller
from core.canonical import canonical_json
from core.codes import Code
from core.crypto import Keyring, keyring_from_config, seal
from core.errors import CoordinatorError
from core.payloads import statement
from core.runs import RunRecord, StartResult, check_idempotency_key, read_run
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

    def refuse_recovery_only(self) -> None:
        """Refuse every start in a recovery-only instance: it is judged before anything else."""
        if self.runtime.recovery_only:
            raise CoordinatorError(
                Code.ADMISSION_RECOVERY_ONLY, "this instance runs in recovery-only mode"
            )

    def _active(self, workflow_id: str) -> tuple[str, Workflow]:
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
        return package.digest, package.workflow

    async def start(
        self, caller: Caller, workflow_id: str, idempotency_key: str, value: Any
    ) -> StartResult:
        """Admit one API start (or answer the run an earlier identical start created)."""
        self.refuse_recovery_only()
        check_idempotency_key(idempotency_key)
        identity = derive.api_start_identity(
            self._admission_key, caller.iss, caller.sub, workflow_id, idempotency_key
        )
        return await self.start_identified(caller, workflow_id, identity, value)

    async def start_identified(
        self, caller: Caller, workflow_id: str, identity: str, value: Any
    ) -> StartResult:
        """Admit a start whose identity is already derived (a signed event's source and id)."""
        self.refuse_recovery_only()
        digest, workflow = self._active(workflow_id)
        for attempt in range(_ATTEMPTS):
            try:
                return await self._attempt(caller, workflow, digest, identity, value)
            except asyncpg.UniqueViolationError:
                if attempt + 1 == _ATTEMPTS:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(
        self, caller: Caller, workflow: Workflow, digest: str, identity: str, value: Any
    ) -> StartResult:
        created = await self._create_checked(caller, workflow, digest, identity, value)
        if created is not None:
            return created  # the common case, in one statement
        q = self.store.queries
        activation = self.store.activation
        assert activation is not None  # checked by _active
        async with self.store.connection() as conn, conn.transaction():
            # Every default timestamp and the first step's due time come from SQL now().
            await clock.apply_to(conn)
            context = await conn.fetchrow(q["admission_lookup"], identity)
            if context is None:
                raise CoordinatorError(Code.SERVICE_UNAVAILABLE, "the namespace has no hold row")
            if int(context["activation_serial"]) != activation.serial:
                raise CoordinatorError(
                    Code.DEPLOYMENT_ACTIVATION_CHANGED,
                    "apply changed the active packages; restart the service with its runtime file",
                )
            if context["admission_hold"]:
                raise CoordinatorError(
                    Code.ADMISSION_HELD, "the admission hold is set; release-admission-hold ends it"
                )
            input_errors(workflow, value)
            plaintext = canonical_input(value)
            keyed = input_digest(self._admission_key, plaintext)
            if context["erased_run"] is not None:
                raise CoordinatorError(
                    Code.RUN_PAYLOAD_ERASED,
                    "the run of this idempotency key was erased by retention",
                )
            if context["known_run"] is not None:
                if not hmac.compare_digest(context["known_digest"], keyed):
                    raise CoordinatorError(
                        Code.START_CONFLICT,
                        "this idempotency key started a run with a different input",
                    )
                return await self._answer(conn, context["known_run"], created=False)
            run_id = derive.run_id(self._admission_key, identity)
            row = await self._insert(
                conn, caller, workflow, digest, run_id, identity, keyed, plaintext
            )
            return StartResult(created=True, run_id=run_id, status=RunRecord.from_row(row).status())

    async def _create_checked(
        self, caller: Caller, workflow: Workflow, digest: str, identity: str, value: Any
    ) -> StartResult | None:
        """A new run of a valid input written by one statement that also makes every check
        of the lookup transaction (hold, activation serial, identity unknown and not
        erased); ``None`` when the input is invalid or a check did not pass — nothing was
        written, and the lookup transaction answers with the right refusal or run."""
        activation = self.store.activation
        assert activation is not None  # checked by _active
        try:
            input_errors(workflow, value)
        except CoordinatorError:
            return None
        plaintext = canonical_input(value)
        keyed = input_digest(self._admission_key, plaintext)
        run_id = derive.run_id(self._admission_key, identity)
        async with statement(self.store) as conn:
            row = await self._insert(
                conn,
                caller,
                workflow,
                digest,
                run_id,
                identity,
                keyed,
                plaintext,
                activation_serial=activation.serial,
            )
        if row is None:
            return None
        return StartResult(created=True, run_id=run_id, status=RunRecord.from_row(row).status())

    @overload
    async def _insert(
        self,
        conn: asyncpg.Connection,
        caller: Caller,
        workflow: Workflow,
        digest: str,
        run_id: str,
        identity: str,
        keyed_digest: str,
        plaintext: bytes,
    ) -> asyncpg.Record: ...

    @overload
    async def _insert(
        self,
        conn: asyncpg.Connection,
        caller: Caller,
        workflow: Workflow,
        digest: str,
        run_id: str,
        identity: str,
        keyed_digest: str,
        plaintext: bytes,
        *,
        activation_serial: int,
    ) -> asyncpg.Record | None: ...

    async def _insert(
        self,
        conn: asyncpg.Connection,
        caller: Caller,
        workflow: Workflow,
        digest: str,
        run_id: str,
        identity: str,
        keyed_digest: str,
        plaintext: bytes,
        *,
        activation_serial: int | None = None,
    ) -> asyncpg.Record | None:
        """Write the run and everything of it in one statement; answers its run row.

        With ``activation_serial`` the statement also checks what the lookup would have
        (``admission_run_create_checked``) and answers ``None`` when a check fails."""
        config = self.runtime.config
        connections = []
        for name in sorted(workflow.connections):
            connection = config.connections.get(name)
            if connection is None:  # the runtime file check makes this unreachable
                raise CoordinatorError(Code.DEPLOYMENT_REFUSED, f"connections.{name}: missing")
            connections.append((name, connection))
        sealed = seal(self._keyring, config.namespace, run_id, "input", plaintext)
        first = workflow.step(workflow.start)
        checked = activation_serial is not None
        query = self.store.queries[
            "admission_run_create_checked" if checked else "admission_run_create"
        ]
        extra = (activation_serial,) if checked else ()
        row: asyncpg.Record | None = await conn.fetchrow(
            query,
            run_id,
            workflow.id,
            digest,
            caller.iss,
            caller.sub,
            caller.client_id or None,
            [name for name, _ in connections],
            [c.type for _, c in connections],
            [c.base_url for _, c in connections],
            [c.authorization.client_id for _, c in connections],
            config.deployment.authentication.issuer,
            [json.dumps(list(c.authorization.scopes)) for _, c in connections],
            [c.token_audience for _, c in connections],
            [c.profile for _, c in connections],
            [c.producer for _, c in connections],
            sealed.key_version,
            sealed.nonce,
            sealed.ciphertext,
            identity,
            keyed_digest,
            workflow.start,
            step_kind(first),
            *extra,
        )
        if row is None and not checked:  # an INSERT ... RETURNING of one row answers it
            raise CoordinatorError(Code.INTERNAL, "the new run was not answered")
        return row

    async def _answer(self, conn: asyncpg.Connection, run_id: str, *, created: bool) -> StartResult:
        run: RunRecord | None = await read_run(conn, self.store.queries, run_id)
        if run is None:  # the identity row references the run, so it exists
            raise CoordinatorError(Code.RUN_NOT_FOUND, "the run of this start is missing")
        return StartResult(created=created, run_id=run_id, status=run.status())


async def admit(
    store: Store,
    runtime: Runtime,
    caller: Caller,
    workflow_id: str,
    key: str,
    input: Any,
) -> tuple[bool, str]:
    """Start a run outside gRPC (for tests and tools): answer ``(created, run_id)``.

    ``store`` must be an opened admission store; its activation is verified here if it was
    not yet.
    """
    if store.activation is None:
        await store.verify()
    result = await Admitter.from_runtime(runtime, store).start(caller, workflow_id, key, input)
    return result.created, result.run_id
