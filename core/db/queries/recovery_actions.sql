-- The run actions of the recovery component: reconcile, retry-same and cancel
-- (recovery/reconcile.py, recovery/retry_same.py, recovery/cancel.py).
--
-- An action first reads the run and its held call without locking anything, does what it
-- must outside a transaction (reconcile reads the product's receipt), and then writes in
-- one transaction. The writes to a held call are operator mode of the step transitions
-- (core/db/transitions.sql): each names the row version of the step the action read and
-- is refused (outcome changed) when the step moved meanwhile, and settling goes through
-- step_settle itself, so a next step is made due, and a run ends, exactly as when a
-- dispatcher settles its step. Recovery never sends a command: retry-same only makes the
-- step ready again with its stored command and key, and the dispatcher of an ordinary
-- instance sends it.
--
-- A run's attention follows its steps, as step_wants_attention (schema.sql) decides: it is
-- true while a step is uncertain or not-sent (an operator still has to act) or is a call
-- ready again after sending nothing for a cause only an operator can mend (a refused token,
-- a failed TLS verification), so every write that settles such a step recomputes it
-- (run_attention_recompute in transitions.sql).
--
-- A step's cause (why its effect is unknown) stays while an operator's action leaves the
-- effect unknown (retry-same makes the step ready with it) and is cleared when the effect
-- becomes known: accepted on a receipt, or nothing when the product proves it never
-- received the command.
-- All time comes from {{ns}}.now(), so tests move a fake clock instead of waiting.

-- name: recovery_action_run
-- A run as a run action needs it, with the namespace's clock and the execution hold. No
-- row when there is no such run.
-- $1 run_id (text)
-- returns: row
-- column id (text)
-- column package_digest (text)
-- column state (text)
-- column created_at (timestamptz)
-- column ended (boolean)
-- column erased (boolean)
-- column now (timestamptz)
-- column execution_hold (boolean, null)
SELECT r.id, r.package_digest, r.state, r.created_at,
       r.ended_at IS NOT NULL AS ended,
       r.erased_at IS NOT NULL AS erased,
       {{ns}}.now() AS now,
       (SELECT execution_hold FROM {{ns}}.hold) AS execution_hold
  FROM {{ns}}.run r
 WHERE r.id = $1;

-- name: recovery_held_step
-- The newest step of a run in one of the states given: the call an operator acts on, with
-- whether a cancel abandoned it (step_abandoned in transitions.sql, decided again under
-- the locks by the operator-mode functions). row_version is the row's xmin, which every
-- write to the step changes: the action's write names it, and is refused when the step
-- changed since.
-- $1 run_id (text)
-- $2 states (text[])
-- returns: row
-- column step_id (text)
-- column seq (integer)
-- column step_type (text)
-- column state (text)
-- column attempts (integer)
-- column effect (text, null)
-- column command_key (text, null)
-- column command_payload_id (bigint, null)
-- column started_at (timestamptz)
-- column first_attempt_at (timestamptz, null)
-- column deadline_at (timestamptz, null)
-- column updated_at (timestamptz)
-- column row_version (text)
-- column abandoned (boolean)
SELECT s.step_id, s.seq, s.step_type, s.state, s.attempts, s.effect, s.command_key,
       s.command_payload_id, s.started_at, s.first_attempt_at, s.deadline_at, s.updated_at,
       s.xmin::text AS row_version,
       {{ns}}.step_abandoned(r.cancelling, r.cancel_seq, s.seq) AS abandoned
  FROM {{ns}}.step s
  JOIN {{ns}}.run r ON r.id = s.run_id
 WHERE s.run_id = $1 AND s.state = ANY ($2::text[])
 ORDER BY s.seq DESC
 LIMIT 1;

-- name: recovery_binding_read
-- The recorded binding of a connection for a run.
-- $1 run_id (text)
-- $2 connection (text)
-- returns: row
-- column connection (text)
-- column connection_type (text)
-- column base_url (text)
-- column client_id (text)
-- column issuer (text)
-- column scopes (text[])
-- column audience (text)
-- column profile (text)
-- column producer (text, null): Casework only
SELECT connection, connection_type, base_url, client_id, issuer, scopes, audience, profile,
       producer
  FROM {{ns}}.binding
 WHERE run_id = $1 AND connection = $2;

-- name: recovery_scope_payloads
-- The sealed values expressions of a run can read: its input and the values its steps
-- kept (call outputs and wait results), in the order they were stored.
-- $1 run_id (text)
-- returns: rows
-- column step_id (text, null): null for the run's input
-- column purpose (text)
-- column key_version (integer)
-- column nonce (bytea)
-- column ciphertext (bytea)
SELECT step_id, purpose, key_version, nonce, ciphertext
  FROM {{ns}}.payload
 WHERE run_id = $1 AND purpose IN ('input', 'output', 'wait-result')
 ORDER BY id;

-- name: recovery_step_settle
-- Settle an operator's step in operator mode, as settle says (what step_settle takes after
-- its owner; the step's effect becomes exactly its effect): one call of
-- step_operator_settle in transitions.sql, which says what each outcome wrote (changed: the
-- step is no longer the version read, nothing written); always one row.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 row_version (text): the step's version as recovery_held_step read it
-- $4 settle (settle_args): how the step ends and where its run goes
-- returns: row
-- column outcome (text)
-- column run_state (text, null)
SELECT outcome, run_state
  FROM {{ns}}.step_operator_settle($1, $2, $3, $4::{{ns}}.settle_args);

-- name: recovery_step_not_sent
-- The product proved it never received an operator's step's command: one call of
-- step_operator_not_sent in transitions.sql, which says what each outcome wrote; always
-- one row.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 row_version (text): the step's version as recovery_held_step read it
-- returns: row
-- column outcome (text)
-- column run_state (text, null)
SELECT outcome, run_state FROM {{ns}}.step_operator_not_sent($1, $2, $3);

-- name: recovery_step_retry_same
-- Make an operator's step ready to be sent again with its stored command and key: one call
-- of step_retry_same in transitions.sql, which says what each outcome wrote; always one
-- row, attempts set when written.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 row_version (text): the step's version as recovery_held_step read it
-- returns: row
-- column outcome (text)
-- column attempts (integer, null)
SELECT outcome, attempts FROM {{ns}}.step_retry_same($1, $2, $3);

-- name: recovery_step_poll
-- What became of a step after a retry-same: its state and how many times it was sent.
-- $1 run_id (text)
-- $2 step_id (text)
-- returns: row
-- column state (text)
-- column attempts (integer)
SELECT state, attempts
  FROM {{ns}}.step
 WHERE run_id = $1 AND step_id = $2;

-- name: recovery_run_cancel
-- Cancel a run: one call of run_cancel in transitions.sql, which says what it wrote;
-- always one row (outcome run-ended: the run had ended, nothing written).
-- $1 run_id (text)
-- $2 on_cancel (text, null): the workflow's onCancel step
-- $3 on_cancel_type (text, null): its type
-- returns: row
-- column outcome (text)
-- column run_state (text, null)
SELECT outcome, run_state FROM {{ns}}.run_cancel($1, $2, $3);

-- name: recovery_snapshot_resolve
-- Record how the operator settled a run's snapshotted steps of the current hold epoch.
-- $1 run_id (text)
-- $2 step_id (text, null): null for every step of the run
-- $3 resolution (text): reconciled, retry or cancel
-- $4 overwrite (boolean): false marks only unresolved rows; true overwrites an earlier one
-- returns: status
UPDATE {{ns}}.restore_snapshot
   SET resolution = $3, resolved_at = {{ns}}.now()
 WHERE epoch = (SELECT epoch FROM {{ns}}.hold)
   AND run_id = $1
   AND ($2::text IS NULL OR step_id = $2::text)
   AND (resolution IS NULL OR $4::boolean);

-- name: recovery_operator_action_insert
-- Log an operator action on a run.
-- $1 run_id (text)
-- $2 kind (text): reconcile, retry-same or cancel
-- $3 reason (text)
-- returns: status
INSERT INTO {{ns}}.operator_action (run_id, kind, reason) VALUES ($1, $2, $3);
