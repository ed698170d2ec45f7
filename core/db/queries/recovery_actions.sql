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
-- A run's attention follows its steps: it is true while a step is uncertain or not-sent
-- (an operator still has to act) or is a call ready again after the issuer refused its
-- token (the dispatcher cannot act), so every write that settles such a step recomputes it.
--
-- A step's cause (why its effect is unknown) stays while an operator's action leaves the
-- effect unknown (retry-same makes the step ready with it) and is cleared when the effect
-- becomes known: accepted on a receipt, or nothing when the product proves it never
-- received the command.
-- All time comes from {{ns}}.now(), so tests move a fake clock instead of waiting.

-- name: recovery_action_run
-- Run $1 (text) as a run action needs it, with the namespace's clock and the execution
-- hold. No row when there is no such run.
SELECT r.id, r.package_digest, r.state, r.cancelling, r.cancel_seq, r.created_at,
       r.ended_at IS NOT NULL AS ended,
       r.erased_at IS NOT NULL AS erased,
       {{ns}}.now() AS now,
       (SELECT execution_hold FROM {{ns}}.hold) AS execution_hold
  FROM {{ns}}.run r
 WHERE r.id = $1;

-- name: recovery_held_step
-- The newest step of run $1 (text) in one of the states $2 (text[]): the call an operator
-- acts on. xmin is the row's version, so a later write to the step is noticed even when
-- the (test) clock gave it the same updated_at.
SELECT step_id, seq, step_type, state, attempts, effect, command_key, command_payload_id,
       started_at, first_attempt_at, deadline_at, updated_at, xmin::text AS row_version
  FROM {{ns}}.step
 WHERE run_id = $1 AND state = ANY ($2::text[])
 ORDER BY seq DESC
 LIMIT 1;

-- name: recovery_binding_read
-- The recorded binding of connection $2 (text) for run $1 (text).
SELECT connection, connection_type, base_url, client_id, issuer, scopes, audience, profile,
       producer
  FROM {{ns}}.binding
 WHERE run_id = $1 AND connection = $2;

-- name: recovery_step_lock
-- Lock step $2 (text) of run $1 (text) for an action's write, answering the state and
-- version the action compares with what it read first.
SELECT seq, state, attempts, updated_at, xmin::text AS row_version
  FROM {{ns}}.step
 WHERE run_id = $1 AND step_id = $2
   FOR UPDATE;

-- name: recovery_run_lock
-- Lock run $1 (text) for an action's write (after its step, when the action has one).
-- Answers the namespace's clock too.
SELECT state, cancelling, cancel_seq, created_at, ended_at IS NOT NULL AS ended,
       {{ns}}.now() AS now
  FROM {{ns}}.run
 WHERE id = $1
   FOR UPDATE;

-- name: recovery_hold_share
-- The execution hold, share-locked: a restore-hold (which updates the row) waits until a
-- retry-same that found the hold off has committed, and its snapshot then sees that step.
SELECT execution_hold FROM {{ns}}.hold FOR SHARE;

-- name: recovery_scope_payloads
-- The sealed values expressions of run $1 (text) can read: its input and the values its
-- steps kept (call outputs and wait results), in the order they were stored.
SELECT step_id, purpose, key_version, nonce, ciphertext
  FROM {{ns}}.payload
 WHERE run_id = $1 AND purpose IN ('input', 'output', 'wait-result')
 ORDER BY id;

-- name: recovery_payload_insert
-- Store a sealed payload: $1 run (text), $2 step (text), $3 purpose (text), $4 key version
-- (integer), $5 nonce (bytea), $6 ciphertext (bytea). Answers its id.
INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce, ciphertext)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id;

-- name: recovery_step_end
-- End step $2 (text) of run $1 (text), locked by recovery_step_lock, in state $3
-- (completed, failed or cancelled) with effect $4 (text or null, set as given). The cause
-- stays only while the effect stays unknown.
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
-- Step $2 (text) of run $1 (text), locked by recovery_step_lock: the product proved it never
-- received the command. Nothing is due; an operator retries the same command or cancels.
UPDATE {{ns}}.step
   SET state = 'not-sent', effect = NULL, due_at = NULL, cause = NULL, cause_status = NULL,
       updated_at = {{ns}}.now()
 WHERE run_id = $1 AND step_id = $2;

-- name: recovery_step_insert_next
-- Make step $2 (text, type $3) the next step of run $1 (text), numbered after every step the
-- run has, due now — unless the run has ended meanwhile (then no row). Answers its seq.
INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
SELECT $1, $2,
       (SELECT coalesce(max(seq), 0) + 1 FROM {{ns}}.step WHERE run_id = $1),
       $3, 'ready', {{ns}}.now()
 WHERE EXISTS (SELECT 1 FROM {{ns}}.run WHERE id = $1 AND ended_at IS NULL)
RETURNING seq;

-- name: recovery_run_continue
-- Run $1 (text) goes on: running, unless another of its steps is still uncertain (then it
-- stays held); attention as the header says. An ended run is left alone.
UPDATE {{ns}}.run r
   SET state = CASE
                   WHEN EXISTS (SELECT 1 FROM {{ns}}.step s
                                 WHERE s.run_id = r.id AND s.state = 'uncertain')
                   THEN 'held' ELSE 'running'
               END,
       attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND (s.state IN ('uncertain', 'not-sent')
                                   OR (s.state = 'ready' AND s.cause = 'token-refused'))),
       updated_at = {{ns}}.now()
 WHERE r.id = $1 AND r.ended_at IS NULL;

-- name: recovery_run_attention
-- Recompute run $1's (text) attention from its steps, leaving its state as it is (an ended
-- or cancelling run whose held call an operator settled).
UPDATE {{ns}}.run r
   SET attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND (s.state IN ('uncertain', 'not-sent')
                                   OR (s.state = 'ready' AND s.cause = 'token-refused'))),
       updated_at = {{ns}}.now()
 WHERE r.id = $1;

-- name: recovery_run_end
-- End run $1 (text) in state $2 (failed) with failure $3 kind, $4 JSON pointer, $5 step
-- (each text or null), as step_settle does: a run that is being cancelled ends
-- cancelled instead. Attention is recomputed from the steps.
UPDATE {{ns}}.run r
   SET state = CASE WHEN r.cancelling THEN 'cancelled' ELSE $2 END,
       failure_kind = CASE WHEN r.cancelling THEN NULL ELSE $3 END,
       failure_path = CASE WHEN r.cancelling THEN NULL ELSE $4 END,
       failure_step = CASE WHEN r.cancelling THEN NULL ELSE $5 END,
       attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND (s.state IN ('uncertain', 'not-sent')
                                   OR (s.state = 'ready' AND s.cause = 'token-refused'))),
       ended_at = {{ns}}.now(),
       updated_at = {{ns}}.now()
 WHERE r.id = $1 AND r.ended_at IS NULL
RETURNING state;

-- name: recovery_step_retry_same
-- Step $2 (text) of run $1 (text), locked by recovery_step_lock, is to be sent again: ready
-- and due now, its stored command and command key kept, so the dispatcher sends exactly
-- that command under the same key. The effect, and its cause, stay what they were.
UPDATE {{ns}}.step
   SET state = 'ready',
       due_at = {{ns}}.now(),
       lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
       updated_at = {{ns}}.now()
 WHERE run_id = $1 AND step_id = $2
RETURNING attempts;

-- name: recovery_step_poll
-- What became of step $2 (text) of run $1 (text) after a retry-same: its state and how
-- many times it was sent.
SELECT state, attempts
  FROM {{ns}}.step
 WHERE run_id = $1 AND step_id = $2;

-- name: recovery_steps_cancel
-- Cancel the steps of run $1 (text) that wait to be worked on and that no dispatcher holds:
-- ready, waiting (the wait is abandoned) and not-sent. Leased steps are settled by their
-- dispatcher; uncertain steps stay uncertain. Answers the cancelled step ids.
UPDATE {{ns}}.step
   SET state = 'cancelled',
       due_at = NULL,
       ended_at = {{ns}}.now(),
       updated_at = {{ns}}.now()
 WHERE run_id = $1
   AND state IN ('ready', 'waiting', 'not-sent')
   AND lease_owner IS NULL
RETURNING step_id;

-- name: recovery_cancel_path_insert
-- Make the workflow's onCancel step $2 (text, type $3) of run $1 (text) due now, numbered
-- after every step the run has. No row when the run already reached a step of that name.
-- Answers its seq: the run's cancel_seq.
INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
SELECT $1, $2,
       (SELECT coalesce(max(seq), 0) + 1 FROM {{ns}}.step WHERE run_id = $1),
       $3, 'ready', {{ns}}.now()
ON CONFLICT (run_id, step_id) DO NOTHING
RETURNING seq;

-- name: recovery_run_cancelling
-- Run $1 (text), locked by recovery_run_lock, is being cancelled. $2 (integer or null) is
-- the seq of its onCancel step: with one the run is running along that path; without one it
-- keeps its state until it ends. Attention is recomputed (cancelled not-sent steps no longer
-- need an operator).
UPDATE {{ns}}.run r
   SET cancelling = true,
       cancel_seq = $2::integer,
       state = CASE WHEN $2::integer IS NOT NULL THEN 'running' ELSE r.state END,
       attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND (s.state IN ('uncertain', 'not-sent')
                                   OR (s.state = 'ready' AND s.cause = 'token-refused'))),
       updated_at = {{ns}}.now()
 WHERE r.id = $1 AND r.ended_at IS NULL;

-- name: recovery_run_cancel_end
-- End run $1 (text) cancelled when it is cancelling without an onCancel path and no step
-- of it is still to be worked on or held by a dispatcher (outcome null). An uncertain step
-- keeps the run's attention. Answers the state when the run ended, no row otherwise.
UPDATE {{ns}}.run r
   SET state = 'cancelled',
       attention = EXISTS (SELECT 1 FROM {{ns}}.step s
                            WHERE s.run_id = r.id
                              AND (s.state IN ('uncertain', 'not-sent')
                                   OR (s.state = 'ready' AND s.cause = 'token-refused'))),
       ended_at = {{ns}}.now(),
       updated_at = {{ns}}.now()
 WHERE r.id = $1 AND r.ended_at IS NULL AND r.cancelling AND r.cancel_seq IS NULL
   AND NOT EXISTS (SELECT 1 FROM {{ns}}.step s
                    WHERE s.run_id = r.id
                      AND (s.state IN ('ready', 'prepared', 'waiting')
                           OR s.lease_owner IS NOT NULL))
RETURNING state;

-- name: recovery_snapshot_resolve
-- Record how the operator settled run $1's (text) snapshotted steps of the current hold
-- epoch: step $2 (text, or null for every step of the run) gets resolution $3 (reconciled,
-- retry or cancel). With $4 (boolean) false only unresolved rows are marked; true overwrites
-- an earlier resolution with the one that settled the step.
UPDATE {{ns}}.restore_snapshot
   SET resolution = $3, resolved_at = {{ns}}.now()
 WHERE epoch = (SELECT epoch FROM {{ns}}.hold)
   AND run_id = $1
   AND ($2::text IS NULL OR step_id = $2::text)
   AND (resolution IS NULL OR $4::boolean);

-- name: recovery_operator_action_insert
-- Log operator action $2 (text: reconcile, retry-same or cancel) on run $1 (text) with
-- reason $3 (text).
INSERT INTO {{ns}}.operator_action (run_id, kind, reason) VALUES ($1, $2, $3);
