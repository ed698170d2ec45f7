"""Every code the product can emit, as one type (CONTRACT §2.1, §2.2, §15).

A :class:`Code` is what a :class:`core.errors.CoordinatorError` carries, on every surface:
the gateway answers it as an RFC 9457 problem with the code's HTTP status, a component sends
it over gRPC with the status derived from that, coordinatorctl prints it as
``coordinator.<code>: <detail>``, and the service prints a startup refusal with the code's raw
spelling. Each member's :class:`CodeInfo` says how it looks on each surface and what an
operator does about it; the code tables of ``docs/api.md`` are generated from it
(``python -m core.codes --update docs/api.md``), so a new code cannot go undocumented.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Final

PROBLEM_BASE: Final = "https://registry-coordinator.dev/problems/"


@dataclass(frozen=True)
class Advice:
    """What a code means where an operator meets it, and what to do about it."""

    meaning: str
    action: str


@dataclass(frozen=True)
class CodeInfo:
    """How one code shows on each surface, and what an operator does about it."""

    title: str
    """Short summary, the same for every occurrence; the problem document's ``title``."""
    meaning: str
    """What happened, for the API reference."""
    action: str
    """What an operator should do, for the API reference."""
    status: int | None = None
    """HTTP status the gateway answers with; None for a code that never reaches HTTP (should
    one arrive there, the gateway answers a bare 500 ``internal`` and logs it)."""
    raw: str | None = None
    """Its spelling on the service's standard error (CONTRACT §2.1, §15); a startup refusal
    with a code that has none prints ``deployment.refused``."""
    cli: Advice | None = None
    """For an HTTP code coordinatorctl also raises itself: what it means there."""
    log_only: bool = False
    """Met only inside the service, never by a caller or coordinatorctl."""


class Code(StrEnum):
    """A stable machine-readable code, e.g. ``service.unavailable``."""

    # HTTP problem codes (CONTRACT §15); ``internal`` is the bare answer to an unexpected
    # failure, logged with the same correlation id.
    SERVICE_UNAVAILABLE = "service.unavailable"
    AUDIT_RESPONSE_UNAVAILABLE = "audit.response-unavailable"
    DEPLOYMENT_REFUSED = "deployment.refused"
    DEPLOYMENT_ACTIVATION_CHANGED = "deployment.activation-changed"
    BINDING_CONFLICT = "binding.conflict"
    BINDING_LIVE_CONFLICT = "binding.live-conflict"
    EXECUTION_HELD = "execution.held"
    ADMISSION_HELD = "admission.held"
    ADMISSION_RECOVERY_ONLY = "admission.recovery-only"
    RESTORE_HOLD_REQUIRED = "restore.hold-required"
    RESTORE_UNRESOLVED = "restore.unresolved"
    RESTORE_REVIEW_REQUIRED = "restore.review-required"
    RESTORE_LEASE_INCOMPATIBLE = "restore.lease-incompatible"
    RECONCILE_UNSUPPORTED = "reconcile.unsupported"
    RECONCILE_REFUSED = "reconcile.refused"
    RECONCILE_RACED = "reconcile.raced"
    RETRY_REFUSED = "retry.refused"
    RECEIPT_EXPIRED = "receipt.expired"
    RUN_PAYLOAD_ERASED = "run.payload-erased"
    CANCEL_REFUSED = "cancel.refused"
    START_CONFLICT = "start.conflict"
    AUTHENTICATION_REFUSED = "authentication.refused"
    AUTHORIZATION_REFUSED = "authorization.refused"
    RUN_NOT_FOUND = "run.not-found"
    WORKFLOW_NOT_FOUND = "workflow.not-found"
    INPUT_INVALID = "input.invalid"
    REQUEST_INVALID = "request.invalid"
    REQUEST_TOO_LARGE = "request.too-large"
    NOT_FOUND = "not-found"
    METHOD_NOT_ALLOWED = "method-not-allowed"
    INTERNAL = "internal"
    # Codes of coordinatorctl and of startup (CONTRACT §2.1, §2.2).
    CONFIG_INVALID = "config.invalid"
    PACKAGE_INVALID = "package.invalid"
    PACKAGE_DIGEST_MISMATCH = "package.digest-mismatch"
    DEPLOYMENT_WORKFLOW_UNLISTED = "deployment.workflow-unlisted"
    DEPLOYMENT_WORKFLOW_LIVE_RUNS = "deployment.workflow-live-runs"
    DEPLOYMENT_SCHEMA_TOO_OLD = "deployment.schema-too-old"
    STATE_KEY_CUSTODY = "command.state-key-custody"
    LIVE_BINDING_CONFLICT = "command.live-binding-conflict"
    STORE_UNAVAILABLE = "store.unavailable"
    # Codes, not secrets (ruff's S105 reads the names).
    SECRET_UNREADABLE = "secret.unreadable"  # noqa: S105
    SECRET_INSECURE = "secret.insecure"  # noqa: S105
    SECRET_MALFORMED = "secret.malformed"  # noqa: S105
    AUTH_TOKEN_FILE = "auth.token-file"  # noqa: S105
    AUTH_LOGIN_REFUSED = "auth.login-refused"
    USAGE_INVALID = "usage.invalid"
    # The audit journal file, met by auditd at startup and by `coordinatorctl audit seal-tail`.
    AUDIT_JOURNAL_BROKEN = "audit.journal-broken"
    AUDIT_JOURNAL_LOCKED = "audit.journal-locked"
    AUDIT_JOURNAL_INSECURE = "audit.journal-insecure"
    # Codes met only inside the service.
    STATE_PAYLOAD_UNAUTHENTIC = "state.payload-unauthentic"

    @property
    def info(self) -> CodeInfo:
        """This code's metadata."""
        return _INFO[self]

    @property
    def status(self) -> int | None:
        """HTTP status, or None for a code that never reaches HTTP."""
        return _INFO[self].status

    @property
    def raw(self) -> str | None:
        """Spelling on the service's standard error, where the contract gives one."""
        return _INFO[self].raw

    @property
    def type_uri(self) -> str:
        """The problem ``type`` member."""
        return PROBLEM_BASE + self.value

    @classmethod
    def parse(cls, text: str) -> Code | None:
        """The member spelled ``text``, or None for a string that is no code of ours."""
        try:
            return cls(text)
        except ValueError:
            return None


_INFO: Final[Mapping[Code, CodeInfo]] = MappingProxyType(
    {
        Code.SERVICE_UNAVAILABLE: CodeInfo(
            status=503,
            title="A dependency of the service is unavailable",
            meaning=(
                "The database, the audit journal or the token verifier cannot be reached; for "
                "`reconcile`, no usable answer came back from the product (the run is still held). "
                "A `--recovery-only` instance also answers review completions with it."
            ),
            action="Retry after it recovers; `/ready` says which.",
            cli=Advice(
                meaning="The coordinator's URL cannot be reached.",
                action="Check `--url` and the network; retry.",
            ),
        ),
        Code.AUDIT_RESPONSE_UNAVAILABLE: CodeInfo(
            status=503,
            title="The audited result of the operation was not released",
            meaning=(
                "The action may have taken effect, but its audit record could not be written, so "
                "its result was withheld."
            ),
            action="Inspect the run before repeating anything.",
        ),
        Code.DEPLOYMENT_REFUSED: CodeInfo(
            status=409,
            title="The deployment check failed",
            raw="deployment.refused",
            meaning="Activation, runtime file or key custody check failed.",
            action="Run `coordinatorctl deployment-status`.",
            cli=Advice(
                meaning="The database, runtime role, databaseId or activation check failed.",
                action="Read the detail; it names the reason, never a password.",
            ),
        ),
        Code.DEPLOYMENT_ACTIVATION_CHANGED: CodeInfo(
            status=409,
            title="The active packages changed after the service started",
            meaning=(
                "`apply` changed the active packages after this service started. Every API call but"
                " `/ready` answers this until the restart."
            ),
            action="Restart every service with the runtime file `apply` used.",
        ),
        Code.BINDING_CONFLICT: CodeInfo(
            status=409,
            title="The runtime file conflicts with the activation",
            meaning="The runtime file's connection settings differ from the activation.",
            action="Restore the settings and restart.",
        ),
        Code.BINDING_LIVE_CONFLICT: CodeInfo(
            status=409,
            title="A live run depends on connection settings that changed",
            meaning=(
                "A run in flight depends on connection settings that changed; an action on it would"
                " act under the new ones."
            ),
            action=(
                "Restore the settings and restart, or investigate with `--recovery-only` "
                "(inspection shows `conflictingConnections`)."
            ),
        ),
        Code.EXECUTION_HELD: CodeInfo(
            status=409,
            title="The restore hold stops execution",
            meaning=(
                "The restore hold is set: nothing is dispatched, so `retry-same` cannot resend. "
                "Reconcile and cancel still work."
            ),
            action="Finish the restore procedure (runbook, section 9), then retry.",
        ),
        Code.ADMISSION_HELD: CodeInfo(
            status=409,
            title="The admission hold stops new runs",
            meaning="The admission hold stops new runs (starts and signed events).",
            action="Retry after the operator's `release-admission-hold`, the last restore step.",
        ),
        Code.ADMISSION_RECOVERY_ONLY: CodeInfo(
            status=409,
            title="This instance admits no runs",
            meaning="A `--recovery-only` instance admits nothing.",
            action="Send starts to the ordinary service.",
        ),
        Code.RESTORE_HOLD_REQUIRED: CodeInfo(
            status=409,
            title="This step needs the restore hold in the right state",
            meaning=(
                "A restore step came out of order: `complete-execution-recovery` or "
                "`release-restore-hold` without the execution hold, or `release-admission-hold` "
                "while the execution hold is still set."
            ),
            action="Check `doctor`'s `holds` and take the steps in the runbook's order.",
        ),
        Code.RESTORE_UNRESOLVED: CodeInfo(
            status=409,
            title="Held work still needs an operator decision",
            meaning=(
                "Steps taken into the hold's snapshot are still uncertain and nobody has settled or"
                " reviewed them; the detail says how many."
            ),
            action=(
                "Reconcile each (for BReg and Casework calls too: the `reconcile.unsupported` "
                "answer records the review), or cancel its run; then release again."
            ),
        ),
        Code.RESTORE_REVIEW_REQUIRED: CodeInfo(
            status=409,
            title="Execution recovery has not been attested",
            meaning="`complete-execution-recovery` has not been recorded for this hold.",
            action="Attest the execution history once your evidence establishes it, then release.",
        ),
        Code.RESTORE_LEASE_INCOMPATIBLE: CodeInfo(
            status=409,
            title="A lease from before the hold cannot be honoured",
            meaning=(
                "A dispatcher came back with a lease from before the hold; its answer was not "
                "written and the step stays uncertain. Appears in the dispatcher's log, naming the "
                "run."
            ),
            action="Reconcile that run; find and stop whatever still works from before the hold.",
        ),
        Code.RECONCILE_UNSUPPORTED: CodeInfo(
            status=409,
            title="The product keeps no receipt for this call",
            meaning=(
                "The product keeps no receipts for this call (BReg Actions, Casework review "
                "requests). Under a restore hold, the refusal records that the step was reviewed."
            ),
            action=(
                "Use `retry-same` within 24 hours of the first attempt, or establish the outcome "
                "with the product's operators and cancel."
            ),
        ),
        Code.RECONCILE_REFUSED: CodeInfo(
            status=409,
            title="The step is not uncertain",
            meaning="No step of the run is uncertain.",
            action="Inspect the run; a `not-sent` step needs `retry-same` or `cancel`.",
        ),
        Code.RECONCILE_RACED: CodeInfo(
            status=409,
            title="The step changed while the operator acted",
            meaning=(
                "The step changed while the receipt was being fetched (another operator, a "
                "dispatcher). Nothing was written."
            ),
            action="Inspect again, then decide.",
        ),
        Code.RETRY_REFUSED: CodeInfo(
            status=409,
            title="The call cannot be retried with the same key",
            meaning=(
                "The call cannot be resent with its key: this instance is `--recovery-only`, the "
                "run has ended, no call is held, the product's window (7 days Messaging and "
                "Scheduling, 24 hours BReg and Casework, from the first attempt) or the step's "
                "deadline has passed, or the step changed meanwhile. The detail says which."
            ),
            action="Use the ordinary service; otherwise reconcile where possible, or cancel.",
        ),
        Code.RECEIPT_EXPIRED: CodeInfo(
            status=409,
            title="The product no longer holds the receipt",
            meaning=(
                "The product no longer keeps receipts that old. It is no evidence either way: the "
                "command may or may not have arrived. The run stays held."
            ),
            action=(
                "Use `retry-same` while the product's window is open; otherwise establish the "
                "outcome with the product's operators, then cancel."
            ),
        ),
        Code.RUN_PAYLOAD_ERASED: CodeInfo(
            status=409,
            title="Retention erased the run's payloads",
            meaning=(
                "Retention erased the run's payloads: it can no longer be reconciled or retried, "
                "and its start key answers this instead of starting again."
            ),
            action=(
                "Nothing to retry. Work started under a new key is new work: check what the erased "
                "run already did first."
            ),
        ),
        Code.CANCEL_REFUSED: CodeInfo(
            status=409,
            title="The run has already ended",
            meaning="The run has already ended.",
            action="Nothing; a cancel never undoes an accepted effect anyway.",
        ),
        Code.START_CONFLICT: CodeInfo(
            status=409,
            title="The idempotency key was used with a different input",
            meaning="The idempotency key was used before with a different input.",
            action="Use the original input, or a new key for new work.",
        ),
        Code.AUTHENTICATION_REFUSED: CodeInfo(
            status=401,
            title="The request is not authenticated",
            meaning="Missing or invalid bearer token (or completion credentials).",
            action="Obtain a valid access token.",
        ),
        Code.AUTHORIZATION_REFUSED: CodeInfo(
            status=403,
            title="The caller may not perform this action",
            meaning="No policy of the token's client allows this action on this workflow.",
            action="Adjust `deployment.authentication.policies`.",
        ),
        Code.RUN_NOT_FOUND: CodeInfo(
            status=404,
            title="No such run",
            meaning="No such run, or a run another principal started.",
            action="Check the run id and the token.",
        ),
        Code.WORKFLOW_NOT_FOUND: CodeInfo(
            status=404,
            title="No such workflow",
            meaning="The workflow is not active in this deployment.",
            action="Check the id; see `deployment-status`.",
        ),
        Code.INPUT_INVALID: CodeInfo(
            status=422,
            title="The start input does not match the workflow's input schema",
            meaning=(
                "The start input breaks the workflow's input schema; `errors` lists JSON pointers."
            ),
            action="Correct the input.",
        ),
        Code.REQUEST_INVALID: CodeInfo(
            status=400,
            title="The request is malformed",
            meaning="Malformed JSON, wrong types, or a bad reference.",
            action="Correct the request.",
            cli=Advice(
                meaning=(
                    "A `--reason`, `--recovery-reference`, `--before` or input file was refused "
                    "before sending, or a `workflow simulate` script was refused (the detail "
                    "names its key path)."
                ),
                action="Correct the option or the file.",
            ),
        ),
        Code.REQUEST_TOO_LARGE: CodeInfo(
            status=413,
            title="The request body is too large",
            meaning="The body is over 64 KiB.",
            action="Send less.",
        ),
        Code.NOT_FOUND: CodeInfo(
            status=404,
            title="No such route",
            meaning="No such route.",
            action="Check the path.",
        ),
        Code.METHOD_NOT_ALLOWED: CodeInfo(
            status=405,
            title="The route does not accept this method",
            meaning="The route does not take this method.",
            action="Check the method.",
        ),
        Code.INTERNAL: CodeInfo(
            status=500,
            title="The service failed unexpectedly",
            meaning=(
                "An unexpected failure; the body's `correlationId` matches the service's log line. "
                "Never carries a traceback."
            ),
            action="Report it with the correlation id.",
            cli=Advice(
                meaning="An unexpected failure inside coordinatorctl.",
                action="Report it, with the command you ran.",
            ),
        ),
        Code.CONFIG_INVALID: CodeInfo(
            title="The runtime file breaks a rule",
            meaning=(
                "The runtime file breaks a rule; the detail starts with the key path, e.g. "
                "`deployment.packages[3].root`."
            ),
            action="Correct the file at that key path and run `coordinatorctl check` again.",
        ),
        Code.PACKAGE_INVALID: CodeInfo(
            title="A workflow source or package is malformed",
            meaning=(
                "A workflow source or package is malformed; the detail names the key path or file."
            ),
            action=(
                "Correct the source, check it with `coordinatorctl workflow check`, and build the "
                "package again."
            ),
        ),
        Code.PACKAGE_DIGEST_MISMATCH: CodeInfo(
            title="A package does not match its digest",
            meaning=(
                "A package's bytes do not match its manifest or pinned digest; the detail names the"
                " file."
            ),
            action=(
                "Use the package exactly as its author built it, with the digest they gave; never "
                "edit a built package."
            ),
        ),
        Code.DEPLOYMENT_WORKFLOW_UNLISTED: CodeInfo(
            title="An active workflow is not listed",
            meaning="A workflow is active but missing from the runtime file.",
            action="List it again, or pass `--remove-workflow` to remove it.",
        ),
        Code.DEPLOYMENT_WORKFLOW_LIVE_RUNS: CodeInfo(
            title="The workflow still has runs",
            meaning="`--remove-workflow` while that workflow has runs that have not ended.",
            action="Let them end (or cancel them), then retry.",
        ),
        Code.DEPLOYMENT_SCHEMA_TOO_OLD: CodeInfo(
            title="The namespace holds an earlier schema",
            meaning="The namespace holds an earlier state layout.",
            action=(
                "Settle its runs with the release that made it, then use a fresh namespace and "
                "databaseId."
            ),
        ),
        Code.STATE_KEY_CUSTODY: CodeInfo(
            title="Key custody failed",
            raw="state-key-custody",
            meaning=(
                "A state key version is missing or differs from its recorded fingerprint, or the "
                "admission key differs."
            ),
            action=(
                "Restore the right key file or list the missing version; a key with no recorded "
                "fingerprint yet needs `apply`."
            ),
        ),
        Code.LIVE_BINDING_CONFLICT: CodeInfo(
            title="A live run's connection settings changed",
            raw="live-binding-conflict",
            meaning="A live run's connection binding differs from the runtime file.",
            action=(
                "Put the old settings back, or change the connection only once those runs have "
                "ended."
            ),
        ),
        Code.STORE_UNAVAILABLE: CodeInfo(
            title="The database cannot be reached",
            raw="store-unavailable",
            meaning="The database cannot be reached.",
            action="Check the host, port and network; retry.",
        ),
        Code.SECRET_UNREADABLE: CodeInfo(
            title="A secret cannot be read",
            meaning=(
                "A referenced secret is missing, a symlink, not a regular file, an unset variable, "
                "or its provider is not configured. The detail names the reference, never the "
                "content."
            ),
            action=(
                "Provide the file or variable the reference names, or configure its provider in "
                "`secretProviders`."
            ),
        ),
        Code.SECRET_INSECURE: CodeInfo(
            title="A secret file is not private",
            meaning=(
                "A secret file is readable or writable by group or others, or belongs to another "
                "user."
            ),
            action="Make the coordinator's user its owner and `chmod 600` it.",
        ),
        Code.SECRET_MALFORMED: CodeInfo(
            title="A secret has the wrong form",
            meaning=(
                "A secret has the wrong length or encoding (keys are exactly 32 bytes; JWKs must be"
                " private keys with `kid` and `alg`)."
            ),
            action=(
                "Write the secret again in the form its key expects (see the configuration "
                "reference)."
            ),
        ),
        Code.AUTH_TOKEN_FILE: CodeInfo(
            title="The token file cannot be used",
            meaning=(
                "The token file is missing, empty, unreadable, or readable/writable by group or "
                "others."
            ),
            action=(
                "Put the token in a file only you can read (`chmod 600`) and pass it with "
                "`--token-file`."
            ),
        ),
        Code.AUTH_LOGIN_REFUSED: CodeInfo(
            title="No token could be had from the issuer",
            meaning=(
                "`coordinatorctl login` could not get an access token the API would take: the "
                "issuer could not be reached or its discovery document names another issuer, "
                "it refused the client, the sign-in was declined or its code expired, or the "
                "token it issued has the wrong shape (not an `at+jwt` JWT, another `iss` or "
                "`aud`, no `sub` or `client_id`, an algorithm the deployment does not allow). "
                "Nothing was written to the token file."
            ),
            action=(
                "Read the detail: it names the issuer, the client and what was wrong. For a "
                "token's shape, configure the issuer as docs/issuers.md shows; for a refused "
                "client, check its registration (grant types, key) at the issuer."
            ),
        ),
        Code.USAGE_INVALID: CodeInfo(
            title="The command line is not valid",
            meaning=(
                "coordinatorctl could not make sense of its command line (an unknown command "
                "or option, a missing required one, a value out of range) and ran nothing; it "
                "exits 2. Only under `--output json` does the code appear, in the JSON document "
                "on standard error; in text the usage and the error follow as always."
            ),
            action="Read the message and `coordinatorctl <command> --help`, then run it again.",
        ),
        Code.AUDIT_JOURNAL_BROKEN: CodeInfo(
            title="The audit journal is broken",
            meaning=(
                "The audit journal's last line is torn (cut short: no newline, or not a record), "
                "its last record is not valid, or the file is not a regular file. auditd does not "
                "start: its line on standard error starts with `deployment.refused: "
                "audit.journal-broken:`, names the file and line and, for a torn line, the "
                "command that seals it. `coordinatorctl audit seal-tail` refuses with it when "
                "the break is anything but a torn last line, and `coordinatorctl audit verify` "
                "when any record breaks the chain, the sequence or the record shape, naming "
                "the first one by its `seq` and line."
            ),
            action=(
                "A torn last line (a full disk or a crash cut a write short): with auditd "
                "stopped, run `coordinatorctl audit seal-tail`. Anything else: check the file "
                "with `coordinatorctl audit verify`, keep it as evidence and investigate before "
                "pointing `deployment.auditFile` at a new file."
            ),
        ),
        Code.AUDIT_JOURNAL_LOCKED: CodeInfo(
            title="Another process holds the audit journal",
            meaning=(
                "Another process holds the journal's lock: a second auditd on the same file, or "
                "`coordinatorctl audit seal-tail` while auditd runs. Two writers would break the "
                "hash chain, so the second one stops."
            ),
            action=(
                "Run one auditd per journal file; stop auditd before `audit seal-tail`. Find the "
                "holder with `fuser` or `lsof` on the file."
            ),
        ),
        Code.AUDIT_JOURNAL_INSECURE: CodeInfo(
            title="The audit journal file is not private",
            meaning=(
                "`deployment.auditFile` is a symbolic link, or group or others have access to the "
                "file. auditd refuses it and changes nothing: a file others could write may hold "
                "lines auditd never wrote."
            ),
            action=(
                "Name the file itself, not a link. Find out who could have written it, check it "
                "with `coordinatorctl audit verify`, then `chmod 600` it."
            ),
        ),
        Code.STATE_PAYLOAD_UNAUTHENTIC: CodeInfo(
            title="A stored payload does not authenticate",
            log_only=True,
            meaning=(
                "A sealed payload is missing, malformed, or does not authenticate under its state "
                "key: the row was altered, or belongs to another run or namespace. The dispatcher "
                "executes nothing for that step and tries it again later."
            ),
            action=(
                "Treat it as tampering or a mixed-up restore: compare the database with its backup,"
                " and the state keys with their recorded fingerprints."
            ),
        ),
    }
)


# ----------------------------------------------------------------------------- API reference


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    lines = [_row(*header), "|" + "---|" * len(header)]
    lines += [_row(*cells) for cells in rows]
    return "\n".join(lines)


def http_table() -> str:
    """The HTTP problem codes with status, meaning and what to do."""
    return _table(
        ("code", "status", "meaning", "what to do"),
        (
            (f"`{code}`", str(code.status), code.info.meaning, code.info.action)
            for code in Code
            if code.status is not None
        ),
    )


def cli_table() -> str:
    """The codes coordinatorctl adds to the HTTP ones, then the HTTP codes it raises itself."""
    own = [
        (code, Advice(code.info.meaning, code.info.action))
        for code in Code
        if code.status is None and not code.info.log_only
    ]
    shared = [(code, code.info.cli) for code in Code if code.info.cli is not None]
    return _table(
        ("code", "meaning", "what to do"),
        ((f"`coordinator.{code}`", advice.meaning, advice.action) for code, advice in own + shared),
    )


def log_table() -> str:
    """The codes met only inside the service."""
    return _table(
        ("code", "meaning", "what to do"),
        ((f"`{code}`", code.info.meaning, code.info.action) for code in Code if code.info.log_only),
    )


TABLES: Final = {"http": http_table, "cli": cli_table, "log": log_table}
"""The generated tables by marker name: ``<!-- codes:NAME -->`` … ``<!-- /codes:NAME -->``."""


def update_markdown(text: str) -> str:
    """``text`` with each marked code table replaced by the generated one."""
    for name, table in TABLES.items():
        begin, end = f"<!-- codes:{name} -->\n", f"\n<!-- /codes:{name} -->"
        if text.count(begin) != 1 or text.count(end) != 1:
            raise ValueError(f"expected one <!-- codes:{name} --> block")
        head, rest = text.split(begin)
        _old, tail = rest.split(end)
        text = head + begin + table() + end + tail
    return text


def main(argv: list[str] | None = None) -> None:
    """``--markdown`` prints the generated tables; ``--update FILE`` rewrites them in FILE."""
    parser = argparse.ArgumentParser(prog="python -m core.codes")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the code tables")
    group.add_argument("--update", metavar="FILE", type=Path, help="rewrite the tables in FILE")
    args = parser.parse_args(argv)
    if args.update is not None:
        args.update.write_text(update_markdown(args.update.read_text()))
        return
    for name, table in TABLES.items():
        sys.stdout.write(f"<!-- codes:{name} -->\n{table()}\n<!-- /codes:{name} -->\n\n")


if __name__ == "__main__":
    main()
