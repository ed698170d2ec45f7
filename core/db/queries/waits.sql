-- Waiting for a product result (wait-for, CONTRACT §9.5): the dispatcher's side, which plans
-- and records each read of the result, and admission's side, which brings a waiting step's
-- next read forward when a completion event names it.
--
-- A waiting wait-for step is ordinary due work: its due_at is the earlier of its next check
-- and its timeout, so the dispatcher's claim (dispatcher_claim, over the partial index
-- step_due) finds it when a check is due and never looks at the others. Nothing is kept in
-- memory per waiting run, and no statement walks the waiting steps.
--
-- The order of one check is what makes an event that arrives during a read count:
--   1. waits_plan_check, before the read, stores the instant of the following check in
--      next_check_at (the step stays leased and due);
--   2. the read happens, outside any transaction;
--   3. waits_schedule makes the step due at the earlier of next_check_at and timeout_at.
-- A completion event in between sets next_check_at to now (waits_wake), so step 3 makes the
-- step due at once and the result is read again, instead of the event being overwritten by
-- the planned check.

-- name: waits_plan_check
-- Before reading the result for a wait-for step leased to owner: the step is waiting,
-- found by the keyed digest match, times out timeout_seconds from now (null for no timeout;
-- kept when one is set already), its following check delay seconds from now, and with
-- entering its run is waiting. One call of step_plan_check in transitions.sql, which says
-- what each outcome wrote (an abandoned step ends cancelled); always one row.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 match (bytea)
-- $5 timeout_seconds (float8, null): null for no timeout
-- $6 delay (float8)
-- $7 entering (boolean): the step has just started waiting
-- returns: row
SELECT outcome, run_state FROM {{ns}}.step_plan_check($1, $2, $3, $4, $5, $6, $7);

-- name: waits_schedule
-- A read of a step locked by dispatcher_step_lock found no decision (or failed): count
-- the check, make the step due at its next check or its timeout, whichever comes first,
-- and give up the lease. A completion event that arrived during the read had set
-- next_check_at to its own instant, so the step is due at once.
-- $1 run_id (text)
-- $2 step_id (text)
-- returns: row
UPDATE {{ns}}.step
   SET checks = checks + 1,
       due_at = least(next_check_at, timeout_at),
       lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
       updated_at = {{ns}}.now()
 WHERE run_id = $1 AND step_id = $2
RETURNING due_at;

-- name: waits_last_check
-- Count the read of a step locked by dispatcher_step_lock that ends the wait (a
-- decision, or the timeout); no further check is planned.
-- $1 run_id (text)
-- $2 step_id (text)
-- returns: status
UPDATE {{ns}}.step
   SET checks = checks + 1, next_check_at = NULL, updated_at = {{ns}}.now()
 WHERE run_id = $1 AND step_id = $2;

-- name: waits_run_attention
-- Set a run's attention while it waits: true when the product refused to show it the
-- result or failed TLS verification, false again once a read is answered. Attention is
-- never cleared from a run with a step that asks for it (step_wants_attention in
-- schema.sql: an uncertain or not-sent step is an operator's business, as is a call that
-- sent nothing for a refused token or a failed TLS verification), nor from an ended run.
-- Answers the run id when something changed.
-- $1 run_id (text)
-- $2 attention (boolean)
-- returns: row
UPDATE {{ns}}.run r
   SET attention = $2::boolean, updated_at = {{ns}}.now()
 WHERE r.id = $1
   AND r.ended_at IS NULL
   AND r.attention IS DISTINCT FROM $2::boolean
   AND ($2::boolean
        OR NOT EXISTS (SELECT 1 FROM {{ns}}.step s
                        WHERE s.run_id = r.id
                          AND {{ns}}.step_wants_attention(s.state, s.cause)))
RETURNING r.id;

-- name: waits_wake
-- A completion event for the result whose keyed digest is match: bring the next check
-- of the waiting step that awaits it forward to now (an earlier due time is kept). Finds
-- the step through the partial index step_wait_match; a step of an ended run is left
-- alone. Admission may change only due_at, next_check_at and updated_at. Answers the run
-- of each step woken (none for an unknown review).
-- $1 match (bytea)
-- returns: rows
UPDATE {{ns}}.step s
   SET due_at = CASE WHEN s.due_at IS NULL OR s.due_at > {{ns}}.now()
                     THEN {{ns}}.now() ELSE s.due_at END,
       next_check_at = CASE WHEN s.next_check_at IS NULL OR s.next_check_at > {{ns}}.now()
                            THEN {{ns}}.now() ELSE s.next_check_at END,
       updated_at = {{ns}}.now()
 WHERE s.wait_match = $1::bytea
   AND s.state = 'waiting'
   AND EXISTS (SELECT 1 FROM {{ns}}.run r WHERE r.id = s.run_id AND r.ended_at IS NULL)
RETURNING s.run_id;
