"""Many waiting runs, inserted straight into a test deployment's tables."""

from __future__ import annotations

from datetime import datetime

from tests.helpers.review_kit import (
    CASEWORK,
    PRODUCER,
    PROJECT,
    REVIEW_CLIENT,
    REVIEW_SCOPES,
    WAIT,
    WORKFLOW,
    ReviewKit,
)


async def insert_waiting_runs(
    kit: ReviewKit, count: int, at: datetime, *, analyze: bool = True
) -> None:
    """``count`` runs waiting for a review decision, one INSERT … SELECT per table: each
    with its bindings and a ``wait-for`` step checked once, next checked in the day after
    ``at`` and timing out two weeks out. ``analyze`` refreshes the statistics afterwards;
    without it they stay whatever they were (a bulk load nobody analysed yet)."""
    ns = kit.ns
    digest = kit.checked.packages[WORKFLOW].digest
    config = kit.checked.config
    notices = config.connections["notices"]
    issuer = config.deployment.authentication.issuer
    async with kit.db.transaction():
        await kit.db.execute(
            f"INSERT INTO {ns}.run (id, workflow_id, package_digest, principal_iss, "
            "principal_sub, client_id, state, created_at, updated_at) "
            "SELECT 'scale-' || i, $1, $2, 'https://issuer.example.org', 'scale', 'intake', "
            "'waiting', $3, $3 FROM generate_series(1, $4) AS i",
            WORKFLOW,
            digest,
            at,
            count,
        )
        bindings = [
            ("review", "casework-review-producer", CASEWORK, REVIEW_CLIENT, list(REVIEW_SCOPES),
             CASEWORK, PROJECT, PRODUCER),
            ("notices", "messaging", notices.base_url, notices.authorization.client_id,
             list(notices.authorization.scopes), notices.token_audience, notices.profile, None),
        ]  # fmt: skip
        for name, kind, base, client, scopes, audience, profile, producer in bindings:
            await kit.db.execute(
                f"INSERT INTO {ns}.binding (run_id, connection, connection_type, base_url, "
                "client_id, issuer, scopes, audience, profile, producer) "
                "SELECT 'scale-' || i, $1, $2, $3, $4, $5, $6, $7, $8, $9 "
                "FROM generate_series(1, $10) AS i",
                name, kind, base, client, issuer, scopes, audience, profile, producer, count,
            )  # fmt: skip
        await _identities_and_inputs(kit, "scale-", count)
        # Next checks spread over the day after ``at``; timeouts two weeks out.
        await kit.db.execute(
            f"INSERT INTO {ns}.step (run_id, step_id, seq, step_type, state, due_at, "
            "next_check_at, timeout_at, wait_match, checks, started_at, updated_at) "
            "SELECT 'scale-' || i, $1, 2, 'wait-for', 'waiting', "
            "$2::timestamptz + make_interval(secs => 3600 + i * 15), "
            "$2::timestamptz + make_interval(secs => 3600 + i * 15), "
            "$2::timestamptz + interval '14 days', sha256(convert_to('scale-' || i, 'UTF8')), "
            "1, $2, $2 "
            "FROM generate_series(1, $3) AS i",
            WAIT,
            at,
            count,
        )
    if analyze:
        await kit.db.execute(f"ANALYZE {ns}.run, {ns}.step, {ns}.binding")


async def _identities_and_inputs(kit: ReviewKit, prefix: str, count: int) -> None:
    """Each run's start identity and (sealed-looking) input, as admission writes them."""
    await kit.db.execute(
        f"INSERT INTO {kit.ns}.start_identity (identity, run_id, input_digest) "
        "SELECT encode(sha256(convert_to('identity-' || $1 || i, 'UTF8')), 'hex'), $1 || i, "
        "repeat('0', 64) FROM generate_series(1, $2) AS i",
        prefix,
        count,
    )
    await kit.db.execute(
        f"INSERT INTO {kit.ns}.payload (run_id, purpose, key_version, nonce, ciphertext) "
        "SELECT $1 || i, 'input', 1, '\\x000000000000000000000000'::bytea, '\\x00'::bytea "
        "FROM generate_series(1, $2) AS i",
        prefix,
        count,
    )


async def insert_ended_runs(kit: ReviewKit, count: int, at: datetime) -> None:
    """``count`` runs that succeeded at ``at`` (with start identities, inputs and a
    command-key tombstone each), one INSERT … SELECT per table: the history a deployment
    keeps beside its live runs."""
    await kit.db.execute(
        f"INSERT INTO {kit.ns}.run (id, workflow_id, package_digest, principal_iss, "
        "principal_sub, client_id, state, outcome, created_at, updated_at, ended_at) "
        "SELECT 'ended-' || i, $1, $2, 'https://issuer.example.org', 'scale', 'intake', "
        "'succeeded', 'approved', $3, $3, $3 FROM generate_series(1, $4) AS i",
        WORKFLOW,
        kit.checked.packages[WORKFLOW].digest,
        at,
        count,
    )
    await _identities_and_inputs(kit, "ended-", count)
    await kit.db.execute(
        f"INSERT INTO {kit.ns}.tombstone (kind, value, run_id) "
        "SELECT 'command-key', 'key-ended-' || i, 'ended-' || i FROM generate_series(1, $1) AS i",
        count,
    )
