-- The admission component's statements. A start is judged and written by one statement
-- (admission_start), so a run never exists without its bindings, its sealed input, its
-- start identity and its first due step, and a start costs one round trip
-- (admission/start.py). The judgements of the hold and the activation serial have one more
-- statement of their own (admission_gate), for the start whose input does not fit: those
-- are judged before the input.

-- name: admission_start
-- A start of an input that fits the workflow's input schema, judged and, when it is new,
-- written. start describes the run it would create (a start_args, transitions.sql): among
-- its fields its bindings, one per connection the workflow uses, under one issuer.
--
-- Answers one row: start_outcome, the first of these that holds:
-- 'activation-changed' when apply changed the activation serial since activation_serial;
-- 'admission-held' when the admission hold is set;
-- 'erased' when retention erased the run the identity started;
-- 'known' when the identity started a run whose input digest is input_digest;
-- 'conflict' when the identity started a run whose input digest is another;
-- 'created' when none of these holds: the run is written in state running, with its
-- bindings, the sealed input, the start identity and the first step, due now (the
-- step_due_notify trigger wakes an idle dispatcher at commit).
-- Then, for created and known, the run as run_read answers it (null columns otherwise).
-- Only created writes anything. No row when the namespace has no hold or deployment row.
-- Unique violation on the run id (derived from the identity) when a concurrent start of
-- the same identity committed after this statement's snapshot: the statement run again
-- finds that identity and answers known or conflict.
-- $1 start (start_args): the run it would create
-- returns: row
-- column start_outcome (text)
-- column id (text, null)
-- column workflow_id (text, null)
-- column workflow_version (text, null)
-- column package_digest (text, null)
-- column principal_iss (text, null)
-- column principal_sub (text, null)
-- column state (text, null)
-- column outcome (text, null)
-- column attention (boolean, null)
-- column cancelling (boolean, null)
-- column failure_kind (text, null)
-- column failure_path (text, null)
-- column failure_step (text, null)
-- column created_at (timestamptz, null)
-- column updated_at (timestamptz, null)
-- column ended_at (timestamptz, null)
WITH given AS (
    SELECT ($1::{{ns}}.start_args).*
), judged AS (
    SELECT CASE WHEN d.activation_serial <> g.activation_serial THEN 'activation-changed'
                WHEN h.admission_hold THEN 'admission-held'
                WHEN t.run_id IS NOT NULL THEN 'erased'
                WHEN i.run_id IS NULL THEN 'created'
                WHEN i.input_digest = g.input_digest THEN 'known'
                ELSE 'conflict'
           END AS start_outcome,
           i.run_id AS known_run
      FROM given g
     CROSS JOIN {{ns}}.hold h
     CROSS JOIN {{ns}}.deployment d
      LEFT JOIN {{ns}}.start_identity i ON i.identity = g.identity
      LEFT JOIN {{ns}}.tombstone t ON t.kind = 'start-identity' AND t.value = g.identity
), created AS (
    INSERT INTO {{ns}}.run (id, workflow_id, package_digest, principal_iss, principal_sub,
                            client_id)
    SELECT g.run_id, g.workflow_id, g.package_digest, g.principal_iss, g.principal_sub,
           g.client_id
      FROM given g, judged
     WHERE start_outcome = 'created'
    RETURNING *
), bound AS (
    INSERT INTO {{ns}}.binding (run_id, connection, connection_type, base_url, client_id,
                                issuer, scopes, audience, profile, producer)
    SELECT c.id, b.connection, b.connection_type, b.base_url, b.client_id, g.issuer,
           b.scopes, b.audience, b.profile, b.producer
      FROM created c, given g, unnest(g.bindings) AS b
), sealed AS (
    INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce, ciphertext)
    SELECT c.id, NULL, 'input', g.key_version, g.nonce, g.ciphertext FROM created c, given g
), identified AS (
    INSERT INTO {{ns}}.start_identity (identity, run_id, input_digest)
    SELECT g.identity, c.id, g.input_digest FROM created c, given g
), first_step AS (
    INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
    SELECT c.id, g.first_step, 1, g.first_step_type, 'ready', {{ns}}.now() FROM created c, given g
), answered AS (
    -- The run to answer with: the one just written, or the known one (read by its key).
    SELECT * FROM created
    UNION ALL
    SELECT k.*
      FROM judged j
      JOIN {{ns}}.run k ON k.id = j.known_run
     WHERE j.start_outcome = 'known'
)
SELECT j.start_outcome,
       r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at
  FROM judged j
  LEFT JOIN answered r ON true
  LEFT JOIN {{ns}}.package p ON p.digest = r.package_digest;

-- name: admission_gate
-- What a start judges before its input, for an input that does not fit (admission_start
-- judges a fitting one): start_outcome 'activation-changed' when apply changed the
-- activation serial since activation_serial; 'admission-held' when the admission hold is
-- set; 'open' otherwise. Writes nothing. No row when the namespace has no hold or
-- deployment row.
-- $1 activation_serial (bigint): the activation serial the service started under
-- returns: row
-- column start_outcome (text)
SELECT CASE WHEN d.activation_serial <> $1::bigint THEN 'activation-changed'
            WHEN h.admission_hold THEN 'admission-held'
            ELSE 'open'
       END AS start_outcome
  FROM {{ns}}.hold h
 CROSS JOIN {{ns}}.deployment d;
