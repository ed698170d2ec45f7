-- The recovery component's deployment-wide operator actions: the restore holds with their
-- recovery record and snapshot, and retention.
--
-- Every hold action first locks the one hold row (recovery_hold_lock) and keeps it locked
-- until it commits, so two operators' actions on the holds run one after the other and each
-- decides on what the previous one left. A restore-hold raises the hold epoch: a lease a
-- dispatcher took in an older epoch can no longer prepare or settle its step, which is what
-- makes the snapshot taken in the same transaction complete. All time comes from
-- {{ns}}.now(), so tests move a fake clock instead of waiting.

-- name: recovery_hold_lock
-- The holds and the current hold epoch, with the hold row locked until the transaction
-- ends.
-- returns: row
-- column execution_hold (boolean)
-- column admission_hold (boolean)
-- column epoch (bigint)
SELECT execution_hold, admission_hold, epoch
  FROM {{ns}}.hold
   FOR UPDATE;

-- name: recovery_hold_raise
-- restore-hold: set both holds, start the next hold epoch and open its recovery record
-- with the operator's reference. Answers the new epoch (no row without a hold row).
-- $1 reason (text): the operator's reference
-- returns: value (bigint, null)
WITH raised AS (
    UPDATE {{ns}}.hold
       SET execution_hold = true, admission_hold = true, epoch = epoch + 1,
           updated_at = {{ns}}.now()
    RETURNING epoch
)
INSERT INTO {{ns}}.recovery_record (epoch, restore_reason)
SELECT epoch, $1 FROM raised
RETURNING epoch;

-- name: recovery_snapshot_take
-- restore-hold: record in an epoch every call step that may have sent a command
-- nobody saw answered, and hold it for review. That is a call step that has not ended and
-- either has a command whose effect is not accepted (a command key, prepared, or already
-- uncertain: an earlier snapshot also holds leased steps that never stored a key), or is
-- held under a lease (its holder may have prepared and sent since). Each becomes uncertain
-- with an unknown effect and cause restore-snapshot (one already uncertain keeps the cause
-- it had), not due, without a lease and without a record of retries; its run, unless
-- ended, is held with attention.
-- Answers how many steps and runs the snapshot holds.
-- $1 epoch (bigint)
-- returns: row
-- column steps (bigint)
-- column runs (bigint)
WITH found AS (
    SELECT s.run_id, s.step_id
      FROM {{ns}}.step s
     WHERE s.step_type = 'call'
       AND s.state NOT IN ('completed', 'refused', 'failed', 'cancelled')
       AND (((s.command_key IS NOT NULL OR s.state IN ('prepared', 'uncertain'))
             AND s.effect IS DISTINCT FROM 'accepted')
            OR s.lease_owner IS NOT NULL)
       FOR UPDATE
), recorded AS (
    INSERT INTO {{ns}}.restore_snapshot (epoch, run_id, step_id)
    SELECT $1, run_id, step_id FROM found
), uncertain AS (
    UPDATE {{ns}}.step s
       SET state = 'uncertain', effect = 'unknown', due_at = NULL,
           cause = CASE WHEN s.state = 'uncertain' AND s.cause IS NOT NULL
                        THEN s.cause ELSE 'restore-snapshot' END,
           cause_status = CASE WHEN s.state = 'uncertain' AND s.cause IS NOT NULL
                               THEN s.cause_status END,
           retry_cause = NULL, retry_status = NULL, retry_last_at = NULL,
           retry_since = NULL, retry_attention_at = NULL,
           lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
           updated_at = {{ns}}.now()
      FROM found f
     WHERE s.run_id = f.run_id AND s.step_id = f.step_id
    RETURNING s.run_id
), held AS (
    UPDATE {{ns}}.run r
       SET state = 'held', attention = true, updated_at = {{ns}}.now()
     WHERE r.id IN (SELECT run_id FROM uncertain) AND r.ended_at IS NULL
)
SELECT count(*) AS steps, count(DISTINCT run_id) AS runs FROM found;

-- name: recovery_leases_drop
-- restore-hold: every other step still under a lease (waits, choices, finishes) loses it
-- and is due again, so that a dispatcher claims it afresh after the release. The epoch
-- raised in the same transaction already keeps the old holder from moving it. A step that
-- can be due keeps its due time (or becomes due now when it had none). Answers how many
-- leases were dropped.
-- returns: value (bigint)
WITH dropped AS (
    UPDATE {{ns}}.step
       SET lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
           due_at = CASE WHEN state IN ('ready', 'prepared', 'waiting')
                         THEN coalesce(due_at, {{ns}}.now()) END,
           updated_at = {{ns}}.now()
     WHERE lease_owner IS NOT NULL
    RETURNING 1
)
SELECT count(*) AS dropped FROM dropped;

-- name: recovery_record_read
-- The recovery record of an epoch; no row when that epoch has none.
-- $1 epoch (bigint)
-- returns: row
-- column epoch (bigint)
-- column execution_recovered_at (timestamptz, null)
-- column restore_released_at (timestamptz, null)
-- column admission_released_at (timestamptz, null)
SELECT epoch, execution_recovered_at, restore_released_at, admission_released_at
  FROM {{ns}}.recovery_record
 WHERE epoch = $1;

-- name: recovery_execution_recovered
-- complete-execution-recovery: record in an epoch's recovery record the operator's
-- reference and that the execution history is complete and the prior deployment fenced
-- (the body only validates with both attested). Answers when; no row when the epoch has
-- no recovery record.
-- $1 epoch (bigint)
-- $2 reference (text)
-- returns: value (timestamptz, null)
UPDATE {{ns}}.recovery_record
   SET execution_recovery_reference = $2,
       execution_history_complete = true,
       execution_deployment_fenced = true,
       execution_recovered_at = {{ns}}.now()
 WHERE epoch = $1
RETURNING execution_recovered_at;

-- name: recovery_snapshot_unresolved
-- How many steps of an epoch's snapshot still need an operator's decision: no
-- resolution recorded and the step still uncertain. A step settled or cancelled since, or
-- explicitly left for retry-same or cancel, no longer counts.
-- $1 epoch (bigint)
-- returns: value (bigint)
SELECT count(*) AS unresolved
  FROM {{ns}}.restore_snapshot rs
  JOIN {{ns}}.step s ON s.run_id = rs.run_id AND s.step_id = rs.step_id
 WHERE rs.epoch = $1 AND rs.resolution IS NULL AND s.state = 'uncertain';

-- name: recovery_execution_release
-- release-restore-hold: lift the execution hold and record in an epoch's recovery record
-- the operator's reference and when.
-- $1 epoch (bigint)
-- $2 reason (text): the operator's reference
-- returns: status
WITH released AS (
    UPDATE {{ns}}.hold
       SET execution_hold = false, updated_at = {{ns}}.now()
)
UPDATE {{ns}}.recovery_record
   SET restore_release_reason = $2, restore_released_at = {{ns}}.now()
 WHERE epoch = $1;

-- name: recovery_admission_release
-- release-admission-hold: lift the admission hold and record in the latest recovery
-- record the operator's reference with both attestations (the body only validates with
-- them), unless that record's admission release is already recorded. Without such a
-- record only the hold is written.
-- $1 reference (text)
-- returns: status
WITH released AS (
    UPDATE {{ns}}.hold
       SET admission_hold = false, updated_at = {{ns}}.now()
), latest AS (
    SELECT epoch FROM {{ns}}.recovery_record ORDER BY epoch DESC LIMIT 1
)
UPDATE {{ns}}.recovery_record r
   SET admission_recovery_reference = $1,
       admission_history_complete = true,
       admission_deployment_fenced = true,
       admission_released_at = {{ns}}.now()
  FROM latest
 WHERE r.epoch = latest.epoch AND r.admission_released_at IS NULL;

-- name: recovery_operator_log
-- Log an operator action.
-- $1 run_id (text, null): the run it concerns; null for deployment-wide ones
-- $2 kind (text)
-- $3 reason (text, null): its reason or recovery reference; null for retain
-- returns: status
INSERT INTO {{ns}}.operator_action (run_id, kind, reason) VALUES ($1, $2, $3);

-- name: recovery_retain_check
-- Whether the cutoff is later than now: retain refuses it (a mistyped year would otherwise
-- erase runs that ended a moment ago).
-- $1 before (timestamptz): the cutoff
-- returns: value (boolean)
SELECT $1::timestamptz > {{ns}}.now() AS future;

-- name: recovery_retain_preview
-- retain --dry-run: the runs recovery_retain would erase for the same cutoff and limit,
-- chosen the same way and in the same order, with nothing locked, written or erased.
-- Answers their ids, oldest ended first.
-- $1 before (timestamptz): the cutoff
-- $2 limit (integer)
-- returns: rows
-- column id (text)
SELECT r.id
  FROM {{ns}}.run r
 WHERE r.ended_at IS NOT NULL AND r.erased_at IS NULL
   AND r.ended_at < $1
   AND NOT EXISTS (SELECT 1 FROM {{ns}}.step s
                    WHERE s.run_id = r.id AND s.state = 'uncertain')
 ORDER BY r.ended_at, r.id
 LIMIT $2;

-- name: recovery_retain
-- Retention: erase the payloads of up to limit runs that ended before the cutoff, are not
-- erased yet and hold no uncertain step, oldest ended first, skipping runs another
-- transaction has locked. For each: tombstone its start identity and every command key its
-- steps used, forget the start identity, delete every payload row (a step's command
-- reference becomes null with it) and stamp erased_at. Ids, states, outcomes, failures
-- and timings stay. Answers the erased run ids, oldest ended first.
-- $1 before (timestamptz): the cutoff
-- $2 limit (integer)
-- returns: rows
-- column id (text)
WITH chosen AS (
    SELECT r.id, r.ended_at
      FROM {{ns}}.run r
     WHERE r.ended_at IS NOT NULL AND r.erased_at IS NULL
       AND r.ended_at < $1
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.step s
                        WHERE s.run_id = r.id AND s.state = 'uncertain')
     ORDER BY r.ended_at, r.id
     LIMIT $2
       FOR UPDATE OF r SKIP LOCKED
), spent_identities AS (
    INSERT INTO {{ns}}.tombstone (kind, value, run_id)
    SELECT 'start-identity', i.identity, i.run_id
      FROM {{ns}}.start_identity i
      JOIN chosen c ON c.id = i.run_id
), spent_keys AS (
    INSERT INTO {{ns}}.tombstone (kind, value, run_id)
    SELECT 'command-key', s.command_key, s.run_id
      FROM {{ns}}.step s
      JOIN chosen c ON c.id = s.run_id
     WHERE s.command_key IS NOT NULL
), forgotten AS (
    DELETE FROM {{ns}}.start_identity i USING chosen c WHERE i.run_id = c.id
), erased AS (
    DELETE FROM {{ns}}.payload p USING chosen c WHERE p.run_id = c.id
), stamped AS (
    UPDATE {{ns}}.run r
       SET erased_at = {{ns}}.now()
      FROM chosen c
     WHERE r.id = c.id
)
SELECT id FROM chosen ORDER BY ended_at, id;
