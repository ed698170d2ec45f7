-- The admission component's statements: what a start reads, then everything it writes in
-- one statement, both in one transaction (admission/start.py), so a run never exists
-- without its bindings, its sealed input, its start identity and its first due step.

-- name: admission_lookup
-- What a start reads before it writes, in one statement: the admission hold and the
-- activation serial (a service that started under an older serial may not admit any more);
-- erased_run, the run of start identity $1 (64 hex digits) if retention erased it; and
-- known_run with known_digest, the run that identity started and the keyed digest of its
-- input (both null for a new identity).
SELECT h.admission_hold, d.activation_serial,
       (SELECT t.run_id FROM {{ns}}.tombstone t
         WHERE t.kind = 'start-identity' AND t.value = $1) AS erased_run,
       i.run_id AS known_run, i.input_digest AS known_digest
  FROM {{ns}}.hold h
 CROSS JOIN {{ns}}.deployment d
  LEFT JOIN {{ns}}.start_identity i ON i.identity = $1;

-- name: admission_run_create
-- A new run, everything of it in one statement: the run in state running ($1 run id, $2
-- workflow id, $3 package digest, $4 principal iss, $5 principal sub, $6 client_id, null
-- for event starts); one binding per connection the workflow uses, as parallel arrays ($7
-- connection names, $8 connection types, $9 base URLs, $10 client ids, $12 scopes each as
-- a JSON array text, $13 token audiences, $14 profiles, $15 producers, null outside
-- Casework; all text[]) under issuer $11 (text); the sealed input ($16 state key version,
-- $17 nonce, $18 ciphertext with its GCM tag); start identity $19 (64 hex digits) with the
-- keyed input digest $20 (64 hex); and the first step $21 (text, type $22), due now (the
-- step_due_notify trigger wakes an idle dispatcher at commit). Answers the run as run_read
-- does. Unique violation on the run id when a concurrent start of the same identity
-- committed first.
WITH created AS (
    INSERT INTO {{ns}}.run (id, workflow_id, package_digest, principal_iss, principal_sub,
                            client_id)
    VALUES ($1, $2, $3, $4, $5, $6)
    RETURNING *
), bound AS (
    INSERT INTO {{ns}}.binding (run_id, connection, connection_type, base_url, client_id,
                                issuer, scopes, audience, profile, producer)
    SELECT $1, b.connection, b.connection_type, b.base_url, b.client_id, $11,
           ARRAY(SELECT jsonb_array_elements_text(b.scopes::jsonb)), b.audience, b.profile,
           b.producer
      FROM unnest($7::text[], $8::text[], $9::text[], $10::text[], $12::text[], $13::text[],
                  $14::text[], $15::text[])
           AS b(connection, connection_type, base_url, client_id, scopes, audience, profile,
                producer)
), sealed AS (
    INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce, ciphertext)
    VALUES ($1, NULL, 'input', $16, $17, $18)
), identified AS (
    INSERT INTO {{ns}}.start_identity (identity, run_id, input_digest) VALUES ($19, $1, $20)
), first_step AS (
    INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
    VALUES ($1, $21, 1, $22, 'ready', {{ns}}.now())
)
SELECT r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at
  FROM created r
  JOIN {{ns}}.package p ON p.digest = r.package_digest;

-- name: admission_run_create_checked
-- admission_lookup and admission_run_create in one statement, for a start whose input
-- already passed the workflow's schema. The parameters are admission_run_create's: $1 run
-- id, $2 workflow id, $3 package digest, $4 principal iss, $5 principal sub, $6 client_id;
-- the bindings as parallel arrays ($7 connection names, $8 connection types, $9 base URLs,
-- $10 client ids, $12 scopes each as a JSON array text, $13 token audiences, $14 profiles,
-- $15 producers) under issuer $11; the sealed input ($16 state key version, $17 nonce, $18
-- ciphertext); start identity $19 with keyed input digest $20; the first step $21 (type
-- $22) — and $23 (bigint), the activation serial this service started under. The run is
-- written only when the common case holds: the admission hold is off, the serial is still
-- $23, and identity $19 neither started a run nor was erased by retention. Then it answers
-- the run as admission_run_create does; otherwise no row and nothing written, and the caller
-- takes the lookup transaction, which tells the other cases apart. Unique violation on the
-- run id when a concurrent start of the same identity committed first.
WITH created AS (
    INSERT INTO {{ns}}.run (id, workflow_id, package_digest, principal_iss, principal_sub,
                            client_id)
    SELECT $1, $2, $3, $4, $5, $6
      FROM {{ns}}.hold h CROSS JOIN {{ns}}.deployment d
     WHERE NOT h.admission_hold
       AND d.activation_serial = $23::bigint
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.start_identity i WHERE i.identity = $19)
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.tombstone t
                        WHERE t.kind = 'start-identity' AND t.value = $19)
    RETURNING *
), bound AS (
    INSERT INTO {{ns}}.binding (run_id, connection, connection_type, base_url, client_id,
                                issuer, scopes, audience, profile, producer)
    SELECT $1, b.connection, b.connection_type, b.base_url, b.client_id, $11,
           ARRAY(SELECT jsonb_array_elements_text(b.scopes::jsonb)), b.audience, b.profile,
           b.producer
      FROM created,
           unnest($7::text[], $8::text[], $9::text[], $10::text[], $12::text[], $13::text[],
                  $14::text[], $15::text[])
           AS b(connection, connection_type, base_url, client_id, scopes, audience, profile,
                producer)
), sealed AS (
    INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce, ciphertext)
    SELECT $1, NULL, 'input', $16, $17, $18 FROM created
), identified AS (
    INSERT INTO {{ns}}.start_identity (identity, run_id, input_digest)
    SELECT $19, $1, $20 FROM created
), first_step AS (
    INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
    SELECT $1, $21, 1, $22, 'ready', {{ns}}.now() FROM created
)
SELECT r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at
  FROM created r
  JOIN {{ns}}.package p ON p.digest = r.package_digest;
