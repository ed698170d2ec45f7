-- Reads of one run and its steps that admission and recovery share (core/runs.py turns
-- the rows into the status and inspection documents). None of them touches a payload.

-- name: run_read
-- One run, with the version of the package it was admitted under; no row when there is
-- no such run.
-- $1 run_id (text)
-- returns: row
-- column id (text)
-- column workflow_id (text)
-- column workflow_version (text)
-- column package_digest (text)
-- column principal_iss (text)
-- column principal_sub (text)
-- column state (text)
-- column outcome (text, null)
-- column attention (boolean)
-- column cancelling (boolean)
-- column failure_kind (text, null)
-- column failure_path (text, null)
-- column failure_step (text, null)
-- column created_at (timestamptz)
-- column updated_at (timestamptz)
-- column ended_at (timestamptz, null)
SELECT r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at
  FROM {{ns}}.run r
  JOIN {{ns}}.package p ON p.digest = r.package_digest
 WHERE r.id = $1;

-- name: run_steps
-- The steps a run has reached, in the order it reached them. Only the columns inspection
-- shows: never the command, its key or the lease.
-- $1 run_id (text)
-- returns: rows
-- column step_id (text)
-- column seq (integer)
-- column step_type (text)
-- column state (text)
-- column attempts (integer)
-- column effect (text, null)
-- column cause (text, null)
-- column cause_status (integer, null)
-- column due_at (timestamptz, null)
-- column next_check_at (timestamptz, null)
-- column timeout_at (timestamptz, null)
-- column checks (integer)
-- column retry_cause (text, null): a ready call's last retryable answer, while it waits
-- column retry_status (integer, null)
-- column retry_last_at (timestamptz, null)
-- column deadline_at (timestamptz, null)
-- column started_at (timestamptz)
-- column ended_at (timestamptz, null)
SELECT step_id, seq, step_type, state, attempts, effect, cause, cause_status, due_at,
       next_check_at, timeout_at, checks, retry_cause, retry_status, retry_last_at,
       deadline_at, started_at, ended_at
  FROM {{ns}}.step
 WHERE run_id = $1
 ORDER BY seq;
