-- The recovery component's reads: run owners, lists, inspection extras, doctor and metrics.
-- None of them reads a payload.

-- name: recovery_run_owner
-- Who started a run and from which workflow; no row when there is no such run.
-- $1 run_id (text)
-- returns: row
-- column workflow_id (text)
-- column principal_iss (text)
-- column principal_sub (text)
SELECT workflow_id, principal_iss, principal_sub FROM {{ns}}.run WHERE id = $1;

-- name: recovery_holds
-- The deployment's two restore holds.
-- returns: row
-- column execution_hold (boolean)
-- column admission_hold (boolean)
SELECT execution_hold, admission_hold FROM {{ns}}.hold;

-- name: recovery_operator_actions
-- The latest operator actions on a run, newest first.
-- $1 run_id (text)
-- $2 limit (integer): how many are shown
-- returns: rows
-- column kind (text)
-- column reason (text, null): none for retain
-- column at (timestamptz)
SELECT kind, reason, at
  FROM {{ns}}.operator_action
 WHERE run_id = $1
 ORDER BY id DESC
 LIMIT $2;

-- name: recovery_run_list
-- Runs newest first by (created_at, id), as run_read shapes them, with the step that
-- needs attention. The page's runs are chosen (ordered and limited) first, and only they are
-- joined with their package and looked up for that step, whatever the statistics say. The general list; recovery_run_list_attention serves attention=true.
-- $1 workflow_ids (text[]): the workflows the caller may see
-- $2 attention (boolean, null): null for either
-- $3 state (text, null): null for any
-- $4 principal_iss (text, null): null for every principal
-- $5 principal_sub (text, null): null for every principal
-- $6 updated_before (timestamptz, null): null for any
-- $7 after_at (timestamptz, null): the cursor's instant; null for the first page
-- $8 after_run_id (text, null): the cursor's run id; null for the first page
-- $9 limit (integer): how many
-- returns: rows
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
-- column attention_since (timestamptz, null)
-- column attention_step (text, null): the first step that needs attention
-- column attention_cause (text, null): that step's cause, when it has one
-- column attention_cause_status (integer, null): with status-5xx, the product's status
SELECT r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at,
       r.attention_since, a.step_id AS attention_step, a.cause AS attention_cause,
       a.cause_status AS attention_cause_status
  FROM (SELECT r.*
          FROM {{ns}}.run r
          WHERE r.workflow_id = ANY ($1::text[])
            AND ($2::boolean IS NULL OR r.attention = $2::boolean)
            AND ($3::text IS NULL OR r.state = $3::text)
            AND ($4::text IS NULL OR (r.principal_iss = $4::text AND r.principal_sub = $5::text))
            AND ($6::timestamptz IS NULL OR r.updated_at < $6::timestamptz)
            AND ($7::timestamptz IS NULL OR (r.created_at, r.id) < ($7::timestamptz, $8::text))
         ORDER BY r.created_at DESC, r.id DESC
         LIMIT $9) r
  JOIN {{ns}}.package p ON p.digest = r.package_digest
  LEFT JOIN LATERAL (
        SELECT s.step_id, s.cause, s.cause_status
          FROM {{ns}}.step s
         WHERE r.attention AND s.run_id = r.id
           AND {{ns}}.step_wants_attention(s.state, s.cause)
         ORDER BY s.seq
         LIMIT 1) a ON true
 ORDER BY r.created_at DESC, r.id DESC;

-- name: recovery_run_list_oldest
-- Runs oldest first by (created_at, id); otherwise recovery_run_list.
-- $1 workflow_ids (text[]): the workflows the caller may see
-- $2 attention (boolean, null): null for either
-- $3 state (text, null): null for any
-- $4 principal_iss (text, null): null for every principal
-- $5 principal_sub (text, null): null for every principal
-- $6 updated_before (timestamptz, null): null for any
-- $7 after_at (timestamptz, null): the cursor's instant; null for the first page
-- $8 after_run_id (text, null): the cursor's run id; null for the first page
-- $9 limit (integer): how many
-- returns: rows
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
-- column attention_since (timestamptz, null)
-- column attention_step (text, null): the first step that needs attention
-- column attention_cause (text, null): that step's cause, when it has one
-- column attention_cause_status (integer, null): with status-5xx, the product's status
SELECT r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at,
       r.attention_since, a.step_id AS attention_step, a.cause AS attention_cause,
       a.cause_status AS attention_cause_status
  FROM (SELECT r.*
          FROM {{ns}}.run r
          WHERE r.workflow_id = ANY ($1::text[])
            AND ($2::boolean IS NULL OR r.attention = $2::boolean)
            AND ($3::text IS NULL OR r.state = $3::text)
            AND ($4::text IS NULL OR (r.principal_iss = $4::text AND r.principal_sub = $5::text))
            AND ($6::timestamptz IS NULL OR r.updated_at < $6::timestamptz)
            AND ($7::timestamptz IS NULL OR (r.created_at, r.id) > ($7::timestamptz, $8::text))
         ORDER BY r.created_at, r.id
         LIMIT $9) r
  JOIN {{ns}}.package p ON p.digest = r.package_digest
  LEFT JOIN LATERAL (
        SELECT s.step_id, s.cause, s.cause_status
          FROM {{ns}}.step s
         WHERE r.attention AND s.run_id = r.id
           AND {{ns}}.step_wants_attention(s.state, s.cause)
         ORDER BY s.seq
         LIMIT 1) a ON true
 ORDER BY r.created_at, r.id;

-- name: recovery_run_list_attention
-- Runs that need attention, newest first by (created_at, id), walking run_attention: the
-- attention condition is a literal so that the partial index serves every plan, generic
-- ones included. The filter lines are recovery_run_count_attention's.
-- $1 workflow_ids (text[]): the workflows the caller may see
-- $2 state (text, null): null for any
-- $3 principal_iss (text, null): null for every principal
-- $4 principal_sub (text, null): null for every principal
-- $5 updated_before (timestamptz, null): null for any
-- $6 step (text, null): only runs whose step of this name needs attention
-- $7 cause (text, null): only runs with a step that needs attention for this cause
-- $8 after_at (timestamptz, null): the cursor's instant; null for the first page
-- $9 after_run_id (text, null): the cursor's run id; null for the first page
-- $10 limit (integer): how many
-- returns: rows
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
-- column attention_since (timestamptz, null)
-- column attention_step (text, null): the first step that needs attention
-- column attention_cause (text, null): that step's cause, when it has one
-- column attention_cause_status (integer, null): with status-5xx, the product's status
SELECT r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at,
       r.attention_since, a.step_id AS attention_step, a.cause AS attention_cause,
       a.cause_status AS attention_cause_status
  FROM (SELECT r.*
          FROM {{ns}}.run r
          WHERE r.attention
            AND r.workflow_id = ANY ($1::text[])
            AND ($2::text IS NULL OR r.state = $2::text)
            AND ($3::text IS NULL OR (r.principal_iss = $3::text AND r.principal_sub = $4::text))
            AND ($5::timestamptz IS NULL OR r.updated_at < $5::timestamptz)
            AND (($6::text IS NULL AND $7::text IS NULL) OR EXISTS (
                  SELECT 1
                    FROM {{ns}}.step s
                   WHERE s.run_id = r.id
                     AND {{ns}}.step_wants_attention(s.state, s.cause)
                     AND ($6::text IS NULL OR s.step_id = $6::text)
                     AND ($7::text IS NULL OR s.cause = $7::text)))
            AND ($8::timestamptz IS NULL OR (r.created_at, r.id) < ($8::timestamptz, $9::text))
         ORDER BY r.created_at DESC, r.id DESC
         LIMIT $10) r
  JOIN {{ns}}.package p ON p.digest = r.package_digest
  LEFT JOIN LATERAL (
        SELECT s.step_id, s.cause, s.cause_status
          FROM {{ns}}.step s
         WHERE r.attention AND s.run_id = r.id
           AND {{ns}}.step_wants_attention(s.state, s.cause)
         ORDER BY s.seq
         LIMIT 1) a ON true
 ORDER BY r.created_at DESC, r.id DESC;

-- name: recovery_run_list_attention_oldest
-- Runs that need attention, those waiting longest first: by (attention_since, id), walking
-- run_attention_oldest; otherwise recovery_run_list_attention.
-- $1 workflow_ids (text[]): the workflows the caller may see
-- $2 state (text, null): null for any
-- $3 principal_iss (text, null): null for every principal
-- $4 principal_sub (text, null): null for every principal
-- $5 updated_before (timestamptz, null): null for any
-- $6 step (text, null): only runs whose step of this name needs attention
-- $7 cause (text, null): only runs with a step that needs attention for this cause
-- $8 after_at (timestamptz, null): the cursor's instant; null for the first page
-- $9 after_run_id (text, null): the cursor's run id; null for the first page
-- $10 limit (integer): how many
-- returns: rows
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
-- column attention_since (timestamptz, null)
-- column attention_step (text, null): the first step that needs attention
-- column attention_cause (text, null): that step's cause, when it has one
-- column attention_cause_status (integer, null): with status-5xx, the product's status
SELECT r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at,
       r.attention_since, a.step_id AS attention_step, a.cause AS attention_cause,
       a.cause_status AS attention_cause_status
  FROM (SELECT r.*
          FROM {{ns}}.run r
          WHERE r.attention
            AND r.workflow_id = ANY ($1::text[])
            AND ($2::text IS NULL OR r.state = $2::text)
            AND ($3::text IS NULL OR (r.principal_iss = $3::text AND r.principal_sub = $4::text))
            AND ($5::timestamptz IS NULL OR r.updated_at < $5::timestamptz)
            AND (($6::text IS NULL AND $7::text IS NULL) OR EXISTS (
                  SELECT 1
                    FROM {{ns}}.step s
                   WHERE s.run_id = r.id
                     AND {{ns}}.step_wants_attention(s.state, s.cause)
                     AND ($6::text IS NULL OR s.step_id = $6::text)
                     AND ($7::text IS NULL OR s.cause = $7::text)))
            AND ($8::timestamptz IS NULL OR (r.attention_since, r.id) > ($8::timestamptz, $9::text))
         ORDER BY r.attention_since, r.id
         LIMIT $10) r
  JOIN {{ns}}.package p ON p.digest = r.package_digest
  LEFT JOIN LATERAL (
        SELECT s.step_id, s.cause, s.cause_status
          FROM {{ns}}.step s
         WHERE r.attention AND s.run_id = r.id
           AND {{ns}}.step_wants_attention(s.state, s.cause)
         ORDER BY s.seq
         LIMIT 1) a ON true
 ORDER BY r.attention_since, r.id;

-- name: recovery_run_count
-- How many runs recovery_run_list would show over all its pages, counted up to counted_up_to
-- and no further (recovery_run_estimates completes a count that reaches it). The order only
-- steers the plan: walking run_newest under the LIMIT, never reading the table whole. It is
-- planned for its values (session_plans_per_call), so a state or attention filter is
-- served by its partial index.
-- $1 workflow_ids (text[]): the workflows the caller may see
-- $2 attention (boolean, null): null for either
-- $3 state (text, null): null for any
-- $4 principal_iss (text, null): null for every principal
-- $5 principal_sub (text, null): null for every principal
-- $6 updated_before (timestamptz, null): null for any
-- $7 counted_up_to (integer)
-- returns: value (bigint)
SELECT count(*)
  FROM (SELECT 1
          FROM {{ns}}.run r
 WHERE r.workflow_id = ANY ($1::text[])
   AND ($2::boolean IS NULL OR r.attention = $2::boolean)
   AND ($3::text IS NULL OR r.state = $3::text)
   AND ($4::text IS NULL OR (r.principal_iss = $4::text AND r.principal_sub = $5::text))
   AND ($6::timestamptz IS NULL OR r.updated_at < $6::timestamptz)
         ORDER BY r.created_at DESC, r.id DESC
         LIMIT $7) x;

-- name: recovery_run_count_attention
-- How many runs recovery_run_list_attention would show, counted up to counted_up_to.
-- $1 workflow_ids (text[]): the workflows the caller may see
-- $2 state (text, null): null for any
-- $3 principal_iss (text, null): null for every principal
-- $4 principal_sub (text, null): null for every principal
-- $5 updated_before (timestamptz, null): null for any
-- $6 step (text, null): only runs whose step of this name needs attention
-- $7 cause (text, null): only runs with a step that needs attention for this cause
-- $8 counted_up_to (integer)
-- returns: value (bigint)
SELECT count(*)
  FROM (SELECT 1
          FROM {{ns}}.run r
 WHERE r.attention
   AND r.workflow_id = ANY ($1::text[])
   AND ($2::text IS NULL OR r.state = $2::text)
   AND ($3::text IS NULL OR (r.principal_iss = $3::text AND r.principal_sub = $4::text))
   AND ($5::timestamptz IS NULL OR r.updated_at < $5::timestamptz)
   AND (($6::text IS NULL AND $7::text IS NULL) OR EXISTS (
         SELECT 1
           FROM {{ns}}.step s
          WHERE s.run_id = r.id
            AND {{ns}}.step_wants_attention(s.state, s.cause)
            AND ($6::text IS NULL OR s.step_id = $6::text)
            AND ($7::text IS NULL OR s.cause = $7::text)))
         LIMIT $8) x;

-- name: recovery_run_list_by_id
-- The runs whose id lies in [id_from, id_below) and starts with id_prefix, by id, as
-- recovery_run_list shapes them: a search by run id prefix (or, with the whole id, the one
-- run a start identity names). The range walks the primary key; starts_with keeps the
-- answer exact under any collation the range might compare in.
-- $1 workflow_ids (text[]): the workflows the caller may see
-- $2 principal_iss (text, null): null for every principal
-- $3 principal_sub (text, null): null for every principal
-- $4 id_from (text)
-- $5 id_below (text)
-- $6 id_prefix (text)
-- $7 limit (integer): how many
-- returns: rows
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
-- column attention_since (timestamptz, null)
-- column attention_step (text, null): the first step that needs attention
-- column attention_cause (text, null): that step's cause, when it has one
-- column attention_cause_status (integer, null): with status-5xx, the product's status
SELECT r.id, r.workflow_id, p.version AS workflow_version, r.package_digest,
       r.principal_iss, r.principal_sub, r.state, r.outcome, r.attention, r.cancelling,
       r.failure_kind, r.failure_path, r.failure_step,
       r.created_at, r.updated_at, r.ended_at,
       r.attention_since, a.step_id AS attention_step, a.cause AS attention_cause,
       a.cause_status AS attention_cause_status
  FROM (SELECT r.*
          FROM {{ns}}.run r
          WHERE r.id >= $4::text AND r.id < $5::text AND starts_with(r.id, $6::text)
            AND r.workflow_id = ANY ($1::text[])
            AND ($2::text IS NULL OR (r.principal_iss = $2::text AND r.principal_sub = $3::text))
         ORDER BY r.id
         LIMIT $7) r
  JOIN {{ns}}.package p ON p.digest = r.package_digest
  LEFT JOIN LATERAL (
        SELECT s.step_id, s.cause, s.cause_status
          FROM {{ns}}.step s
         WHERE r.attention AND s.run_id = r.id
           AND {{ns}}.step_wants_attention(s.state, s.cause)
         ORDER BY s.seq
         LIMIT 1) a ON true
 ORDER BY r.id;

-- name: recovery_run_count_by_id
-- How many runs recovery_run_list_by_id would show without its limit, counted up to
-- counted_up_to and no further.
-- $1 workflow_ids (text[]): the workflows the caller may see
-- $2 principal_iss (text, null): null for every principal
-- $3 principal_sub (text, null): null for every principal
-- $4 id_from (text)
-- $5 id_below (text)
-- $6 id_prefix (text)
-- $7 counted_up_to (integer)
-- returns: value (bigint)
SELECT count(*)
  FROM (SELECT 1
          FROM {{ns}}.run r
         WHERE r.id >= $4::text AND r.id < $5::text AND starts_with(r.id, $6::text)
           AND r.workflow_id = ANY ($1::text[])
           AND ($2::text IS NULL OR (r.principal_iss = $2::text AND r.principal_sub = $3::text))
         ORDER BY r.id
         LIMIT $7) x;

-- name: recovery_run_estimates
-- PostgreSQL's own estimates, from the statistics ANALYZE (or autovacuum) last gathered:
-- the run table's rows, the rows of run_attention (the runs that need attention), and the
-- most common states with their frequencies. They complete the runs per state of doctor
-- and the metrics, and a list's total, past the exact counts. Rows are scaled to the
-- relation's size now, as the planner scales them: rows per page when the statistics were
-- taken, times the pages there are (a VACUUM of an empty-looking table is not the table a
-- million runs later).
-- returns: row
-- column rows (float8): the run table's rows
-- column attention_rows (float8): run_attention's rows
-- column states (text[], null): null before the first ANALYZE
-- column frequencies (float8[], null): null before the first ANALYZE
SELECT CASE WHEN c.relpages > 0 AND c.reltuples >= 0
            THEN c.reltuples::float8 / c.relpages
                 * (pg_catalog.pg_relation_size(c.oid)
                    / pg_catalog.current_setting('block_size')::float8)
            ELSE greatest(c.reltuples, 0)::float8
       END AS rows,
       (SELECT CASE WHEN i.relpages > 0 AND i.reltuples >= 0
                    THEN i.reltuples::float8 / i.relpages
                         * (pg_catalog.pg_relation_size(i.oid)
                            / pg_catalog.current_setting('block_size')::float8)
                    ELSE greatest(i.reltuples, 0)::float8
               END
          FROM pg_catalog.pg_class i
         WHERE i.oid = '{{ns}}.run_attention'::regclass) AS attention_rows,
       s.most_common_vals::text::text[] AS states,
       s.most_common_freqs::float8[] AS frequencies
  FROM pg_catalog.pg_class c
  LEFT JOIN pg_catalog.pg_stats s
         ON s.schemaname = (SELECT n.nspname FROM pg_catalog.pg_namespace n
                             WHERE n.oid = c.relnamespace)
        AND s.tablename = 'run' AND s.attname = 'state'
 WHERE c.oid = '{{ns}}.run'::regclass;

-- name: recovery_doctor
-- One row for the doctor report: schema version, databaseId, activation serial, holds, and
-- the counts of uncertain steps (the operator's backlog, through step_uncertain), of calls
-- waiting for their next automatic attempt after a retryable answer (through
-- step_retrying) and of due unclaimed steps (the dispatchers' backlog, through step_due).
-- The runs per state are recovery_run_state_counts.
-- returns: row
-- column schema_version (integer, null): the highest installed (max: null were none recorded)
-- column database_id (text)
-- column activation_serial (bigint)
-- column execution_hold (boolean)
-- column admission_hold (boolean)
-- column uncertain (bigint)
-- column retrying (bigint)
-- column due_jobs (bigint)
SELECT (SELECT max(version) FROM {{ns}}.schema_version) AS schema_version,
       d.database_id::text AS database_id,
       d.activation_serial,
       h.execution_hold,
       h.admission_hold,
       (SELECT count(*) FROM {{ns}}.step WHERE state = 'uncertain') AS uncertain,
       (SELECT count(*) FROM {{ns}}.step
         WHERE state = 'ready' AND retry_cause IS NOT NULL) AS retrying,
       (SELECT count(*) FROM {{ns}}.step
         WHERE due_at IS NOT NULL AND lease_owner IS NULL
           AND due_at <= {{ns}}.now()) AS due_jobs
  FROM {{ns}}.deployment d, {{ns}}.hold h;

-- name: recovery_token_refusals
-- The connections whose last token request the issuer refused, with its error code, by
-- connection name (the doctor's tokenRefusals).
-- returns: rows
-- column connection (text)
-- column error (text)
SELECT connection, error FROM {{ns}}.token_refusal ORDER BY connection;

-- name: recovery_run_state_counts
-- How many runs are in each state, each counted up to counted_up_to and no further: the
-- count walks run_live or run_ended under its state and stops there, so it costs the same
-- at a million runs. (Each state is a literal: a partial index is only used for a
-- condition that names its states.) A count that reaches $1 is completed from
-- recovery_run_estimates.
-- $1 counted_up_to (integer)
-- returns: row
-- column running (bigint)
-- column waiting (bigint)
-- column held (bigint)
-- column succeeded (bigint)
-- column failed (bigint)
-- column cancelled (bigint)
SELECT (SELECT count(*) FROM (SELECT 1 FROM {{ns}}.run WHERE state = 'running' LIMIT $1) x)
           AS running,
       (SELECT count(*) FROM (SELECT 1 FROM {{ns}}.run WHERE state = 'waiting' LIMIT $1) x)
           AS waiting,
       (SELECT count(*) FROM (SELECT 1 FROM {{ns}}.run WHERE state = 'held' LIMIT $1) x)
           AS held,
       (SELECT count(*) FROM (SELECT 1 FROM {{ns}}.run WHERE state = 'succeeded' LIMIT $1) x)
           AS succeeded,
       (SELECT count(*) FROM (SELECT 1 FROM {{ns}}.run WHERE state = 'failed' LIMIT $1) x)
           AS failed,
       (SELECT count(*) FROM (SELECT 1 FROM {{ns}}.run WHERE state = 'cancelled' LIMIT $1) x)
           AS cancelled;
