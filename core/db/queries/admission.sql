-- The admission component's statements: everything a start does, in the order it does it.
-- A start runs them in one transaction (admission/start.py), so a run never exists without
-- its bindings, its sealed input, its start identity and its first due step.

-- name: admission_context
-- What a start checks before it writes: the admission hold and the activation serial (a
-- service that started under an older serial may not admit any more).
SELECT h.admission_hold, d.activation_serial
  FROM {{ns}}.hold h, {{ns}}.deployment d;

-- name: admission_tombstone
-- Whether retention erased the run of start identity $1 (64 hex digits): its run id, or
-- no row.
SELECT run_id FROM {{ns}}.tombstone WHERE kind = 'start-identity' AND value = $1;

-- name: admission_identity_read
-- The run of start identity $1 (64 hex digits) and the keyed digest of the input it was
-- started with; no row for a new identity.
SELECT run_id, input_digest FROM {{ns}}.start_identity WHERE identity = $1;

-- name: admission_run_insert
-- A new run in state running: $1 run id, $2 workflow id, $3 package digest, $4 principal
-- iss, $5 principal sub, $6 client_id (null for event starts). Unique violation on the id
-- when a concurrent start of the same identity committed first.
INSERT INTO {{ns}}.run (id, workflow_id, package_digest, principal_iss, principal_sub, client_id)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: admission_binding_insert
-- The settings run $1 depends on for connection $2: $3 connection type, $4 base URL,
-- $5 client id, $6 issuer, $7 scopes (text[]), $8 token audience, $9 profile, $10 producer
-- (Casework only, else null).
INSERT INTO {{ns}}.binding (run_id, connection, connection_type, base_url, client_id, issuer,
                            scopes, audience, profile, producer)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: admission_payload_insert
-- A sealed run-level payload of run $1: $2 purpose ('input' or 'event'), $3 state key
-- version, $4 nonce (12 bytes), $5 ciphertext with its GCM tag.
INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce, ciphertext)
VALUES ($1, NULL, $2, $3, $4, $5);

-- name: admission_identity_insert
-- Record start identity $1 (64 hex digits) of run $2 with its input digest $3 (64 hex).
INSERT INTO {{ns}}.start_identity (identity, run_id, input_digest) VALUES ($1, $2, $3);

-- name: admission_first_step_insert
-- The run's first step, due now: $1 run id, $2 step id, $3 step type. The step_due_notify
-- trigger wakes an idle dispatcher when the transaction commits.
INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
VALUES ($1, $2, 1, $3, 'ready', {{ns}}.now());
