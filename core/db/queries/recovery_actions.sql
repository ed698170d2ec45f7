-- The run actions of the recovery component: reconcile, retry-same and cancel
-- (recovery/reconcile.py, recovery/retry_same.py, recovery/cancel.py).
--
-- An action first reads the run and its held call without locking anything, does what it
-- must outside a transaction (reconcile reads the product's receipt), and then writes in
-- one transaction that locks the row it decided about and checks it is still as read. Its
-- writes mirror the dispatcher's own (step_settle in core/db/transitions.sql): a next step
-- is made due exactly as it makes one, and a run ends as it ends one. Recovery never sends a command: retry-same only makes the step ready again with its
-- stored command and key, and the dispatcher of an ordinary instance sends it.
--
-- A run's attention follows its steps, as step_wants_attention (schema.sql) decides: it is
-- true while a step is uncertain or not-sent (an operator still has to act) or is a call
-- ready again after sending nothing for a cause only an operator can mend (a refused token,
-- a failed TLS verification), so every write that settles such a step recomputes it.
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
SELECT r.id, r.package_digest, r.state, r.cancelling, r.cancel_seq, r.created_at,
       r.ended_at IS NOT NULL AS ended,
       r.erased_at IS NOT NULL AS erased,
       {{ns}}.now() AS now,
       (SELECT execution_hold FROM {{ns}}.hold) AS execution_hold
  FROM {{ns}}.run r
 WHERE r.id = $1;

-- name: recovery_held_step
-- The newest step of a run in one of the states given: the call an operator acts on. xmin
-- is the row's version, so a later write to the step is noticed even when the (test) clock
-- gave it the same updated_at.
-- $1 run_id (text)
-- $2 states (text[])
-- returns: row
SELECT step_id, seq, step_type, state, attempts, effect, command_key, command_payload_id,
       started_at, first_attempt_at, deadline_at, updated_at, xmin::text AS row_version
  FROM {{ns}}.step
 WHERE run_id = $1 AND state = ANY ($2::text[])
 ORDER BY seq DESC
 LIMIT 1;

-- name: recovery_binding_read
-- The recorded binding of a connection for a run.
-- $1 run_id (text)
-- $2 connection (text)
-- returns: row
SELECT connection, connection_type, base_url, client_id, issuer, scopes, audience, profile,
       producer
  FROM {{ns}}.binding
 WHERE run_id = $1 AND connection = $2;

-- name: recovery_step_lock
-- Lock a step for an action's write, answering the state and version the action compares
-- with what it read first.
-- $1 run_id (text)
-- $2 step_id (text)
-- returns: row
SELECT seq, state, attempts, updated_at, xmin::text AS row_version
  FROM {{ns}}.step
 WHERE run_id = $1 AND step_id = $2
   FOR UPDATE;

-- name: recovery_run_lock
-- Lock a run for an action's write (after its step, when the action has one). Answers the
-- namespace's clock too.
-- $1 run_id (text)
-- returns: row
SELECT state, cancelling, cancel_seq, created_at, ended_at IS NOT NULL AS ended,
       {{ns}}.now() AS now
  FROM {{ns}}.run
 WHERE id = $1
   FOR UPDATE;

-- name: recovery_hold_share
-- The execution hold, share-locked: a restore-hold (which updates the row) waits until a
-- retry-same that found the hold off has committed, and its snapshot then sees that step.
-- Null when the namespace has no hold row.
-- returns: value (boolean, null)
SELECT execution_hold FROM {{ns}}.hold FOR SHARE;

-- name: recovery_scope_payloads
-- The sealed values expressions of a run can read: its input and the values its steps
-- kept (call outputs and wait results), in the order they were stored.
-- $1 run_id (text)
-- returns: rows
SELECT step_id, purpose, key_version, nonce, ciphertext
  FROM {{ns}}.payload
 WHERE run_id = $1 AND purpose IN ('input', 'output', 'wait-result')
 ORDER BY id;

-- name: recovery_payload_insert
-- Store a sealed payload. Answers its id.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 purpose (text)
-- $4 key_version (integer)
-- $5 nonce (bytea)
-- $6 ciphertext (bytea)
-- returns: value (bigint)
INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce, ciphertext)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id;

-- name: recovery_step_end
-- End a step locked by recovery_step_lock. The cause stays only while the effect stays
-- unknown.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 state (text): completed, failed or cancelled
-- $4 effect (text, null): set as given
-- returns: status
UPDATE {{ns}}.step
   SET state = $3,
       effect = $4::text,
       cause = CASE WHEN $4::text = 'unknown' THEN cause END,
       cause_status = CASE WHEN $4::text = 'unknown' THEN cause_status END,
       due_at = NULL,
       ended_at = {{ns}}.now(),
       lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
       updated_at = {{ns}}.now()
 WHERE run_id = $1 AND step_id = $2;

-- name: recovery_step_not_sent
-- A step locked by recovery_step_lock: the product proved it never received the command.
-- Nothing is due; an operator retries the same command or cancels.
-- $1 run_id (text)
-- $2 step_id (text)
-- returns: status
UPDATE {{ns}}.step
   SET state = 'not-sent', effect = NULL, due_at = NULL, cause = NULL, cause_status = NULL,
       updated_at = {{ns}}.now()
 WHERE run_id = $1 AND step_id = $2;

-- name: recovery_step_insert_next
-- Make a step the next step of a run, numbered after every step the run has, due now —
-- unless the run has ended meanwhile (then no row). Answers its seq.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 step_type (text)
-- returns: value (integer, null)
INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
SELECT $1, $2,
       (SELECT coalesce(max(seq), 0) + 1 FROM {{ns}}.step WHERE run_id = $1),
       $3, 'ready', {{ns}}.now()
 WHERE EXISTS (SELECT 1 FROM {{ns}}.run WHERE id = $1 AND ended_at IS NULL)
RETURNING seq;

-- name: recovery_run_continue
-- A run goes on: running, unless another of its steps is still uncertain (then it stays
-- held); attention as the header says. An ended run is left alone.
-- $1 run_id (text)
-- returns: status
UPDATE {{ns}}.run r
   SET state = CASE
                   WHEN EXISTS (SELECT 1 FROM {{ns}}.step s
                                 WHERE s.run_id = r.id AND s.state = 'uncertain')
                   THEN 'held' ELSE 'running'
               END,
       attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND {{ns}}.step_wants_attention(s.state, s.cause)),
       updated_at = {{ns}}.now()
 WHERE r.id = $1 AND r.ended_at IS NULL;

-- name: recovery_run_attention
-- Recompute a run's attention from its steps, leaving its state as it is (an ended or
-- cancelling run whose held call an operator settled).
-- $1 run_id (text)
-- returns: status
UPDATE {{ns}}.run r
   SET attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND {{ns}}.step_wants_attention(s.state, s.cause)),
       updated_at = {{ns}}.now()
 WHERE r.id = $1;

-- name: recovery_run_end
-- End a run with a failure, as step_settle does: a run that is being cancelled ends
-- cancelled instead. Attention is recomputed from the steps. Answers the state it ended
-- in; no row when it had already ended.
-- $1 run_id (text)
-- $2 state (text): failed
-- $3 failure_kind (text, null)
-- $4 failure_path (text, null): a JSON pointer
-- $5 failure_step (text, null)
-- returns: value (text, null)
UPDATE {{ns}}.run r
   SET state = CASE WHEN r.cancelling THEN 'cancelled' ELSE $2 END,
       failure_kind = CASE WHEN r.cancelling THEN NULL ELSE $3 END,
       failure_path = CASE WHEN r.cancelling THEN NULL ELSE $4 END,
       failure_step = CASE WHEN r.cancelling THEN NULL ELSE $5 END,
       attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND {{ns}}.step_wants_attention(s.state, s.cause)),
       ended_at = {{ns}}.now(),
       updated_at = {{ns}}.now()
 WHERE r.id = $1 AND r.ended_at IS NULL
RETURNING state;

-- name: recovery_step_retry_same
-- A step locked by recovery_step_lock is to be sent again: ready and due now, its stored
-- command and command key kept, so the dispatcher sends exactly that command under the
-- same key. The effect, and its cause, stay what they were. Answers its attempts (no row
-- when there is no such step).
-- $1 run_id (text)
-- $2 step_id (text)
-- returns: value (integer, null)
UPDATE {{ns}}.step
   SET state = 'ready',
       due_at = {{ns}}.now(),
       lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
       updated_at = {{ns}}.now()
 WHERE run_id = $1 AND step_id = $2
RETURNING attempts;

-- name: recovery_step_poll
-- What became of a step after a retry-same: its state and how many times it was sent.
-- $1 run_id (text)
-- $2 step_id (text)
-- returns: row
SELECT state, attempts
  FROM {{ns}}.step
 WHERE run_id = $1 AND step_id = $2;

-- name: recovery_steps_cancel
-- Cancel the steps of a run that wait to be worked on and that no dispatcher holds: ready,
-- waiting (the wait is abandoned) and not-sent. Leased steps are settled by their
-- dispatcher; uncertain steps stay uncertain. A step that sent nothing loses its cause
-- with its end (the cause of a ready step whose effect is still unknown stays). Answers
-- the cancelled step ids.
-- $1 run_id (text)
-- returns: rows
UPDATE {{ns}}.step
   SET state = 'cancelled',
       cause = CASE WHEN {{ns}}.sent_nothing(cause) THEN NULL ELSE cause END,
       due_at = NULL,
       ended_at = {{ns}}.now(),
       updated_at = {{ns}}.now()
 WHERE run_id = $1
   AND state IN ('ready', 'waiting', 'not-sent')
   AND lease_owner IS NULL
RETURNING step_id;

-- name: recovery_cancel_path_insert
-- Make the workflow's onCancel step of a run due now, numbered after every step the run
-- has. No row when the run already reached a step of that name. Answers its seq: the
-- run's cancel_seq.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 step_type (text)
-- returns: value (integer, null)
INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
SELECT $1, $2,
       (SELECT coalesce(max(seq), 0) + 1 FROM {{ns}}.step WHERE run_id = $1),
       $3, 'ready', {{ns}}.now()
ON CONFLICT (run_id, step_id) DO NOTHING
RETURNING seq;

-- name: recovery_run_cancelling
-- A run locked by recovery_run_lock is being cancelled. With an onCancel step the run is
-- running along that path; without one it keeps its state until it ends. Attention is
-- recomputed (cancelled not-sent steps no longer need an operator).
-- $1 run_id (text)
-- $2 cancel_seq (integer, null): the seq of its onCancel step
-- returns: status
UPDATE {{ns}}.run r
   SET cancelling = true,
       cancel_seq = $2::integer,
       state = CASE WHEN $2::integer IS NOT NULL THEN 'running' ELSE r.state END,
       attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND {{ns}}.step_wants_attention(s.state, s.cause)),
       updated_at = {{ns}}.now()
 WHERE r.id = $1 AND r.ended_at IS NULL;

-- name: recovery_run_cancel_end
-- End a run cancelled when it is cancelling without an onCancel path and no step of it is
-- still to be worked on or held by a dispatcher (outcome null). An uncertain step keeps the
-- run's attention. Answers the state when the run ended, no row otherwise.
-- $1 run_id (text)
-- returns: value (text, null)
UPDATE {{ns}}.run r
   SET state = 'cancelled',
       attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND {{ns}}.step_wants_attention(s.state, s.cause)),
       ended_at = {{ns}}.now(),
       updated_at = {{ns}}.now()
 WHERE r.id = $1 AND r.ended_at IS NULL AND r.cancelling AND r.cancel_seq IS NULL
   AND NOT EXISTS (SELECT 1 FROM {{ns}}.step s
                    WHERE s.run_id = r.id
                      AND (s.state IN ('ready', 'prepared', 'waiting')
                           OR s.lease_owner IS NOT NULL))
RETURNING state;

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
