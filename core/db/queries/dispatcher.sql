-- The dispatcher's queries: claiming due steps under a lease, finding abandoned leases,
-- preparing commands, and settling each step's outcome together with the next step.
--
-- Every statement that changes a step the dispatcher works on names the lease owner, and
-- those that record an outcome also name the hold epoch the lease was taken in: a lease
-- taken before a restore-hold can no longer move its step (CONTRACT §10.5). All time comes
-- from {{ns}}.now(), so tests move a fake clock instead of waiting.
--
-- A cancel (recovery's) marks the run cancelling and, when the workflow has an onCancel
-- path, records the seq of the step that path starts at in run.cancel_seq. Every step
-- before that seq (all of them, without such a path) is abandoned: the dispatcher still
-- records what its product answered, but it never makes another step due after it and
-- never sends its command again. step_leased (transitions.sql) answers whether the locked
-- step is abandoned, for every transition function, so that rule is written once.
--
-- A step's cause says why its effect is unknown, or (token-refused, tls-refused: the
-- sent_nothing causes of schema.sql) why a call sent nothing yet. The statement that makes
-- a step uncertain names it; every statement that records a fresh outcome of a call clears
-- it or puts its own in place, and preparing a command or ending the step clears a
-- sent_nothing cause. Attention follows the run's steps as step_wants_attention (schema.sql)
-- says: a step uncertain or not-sent, or a ready call that sent nothing for a cause only
-- an operator can mend, or that has kept getting retryable answers for too long (retrying:
-- schema.sql, "Retries in sight").

-- name: dispatcher_claim
-- Lease up to limit due, unclaimed steps of runs that have not ended to owner for
-- lease_seconds, oldest due first, skipping rows another dispatcher is claiming. Claims
-- nothing while the execution hold is set. The lease records the current hold epoch,
-- answered as lease_epoch so that a settle refused later can tell a restore-hold from an
-- ordinary lost lease. past_deadline tells a call step retried after its deadline; now is
-- the namespace's clock at the claim, for the decisions an executor makes about time.
--
-- Each row also carries everything executing the step reads, from the same snapshot, so a
-- claimed step costs no read of its own: its run's package and creation instant, whether a
-- cancel abandoned the step (step_abandoned in transitions.sql); the sealed values its expressions can read (input, call outputs, wait results) as
-- parallel arrays in id order; every binding of the run as a JSON array of binding rows;
-- and the step's stored command payload, with the run it belongs to. These do not change
-- under a leased step (a cancel is decided again under the step's lock).
-- $1 owner (text): the dispatcher taking the leases
-- $2 limit (integer): at most this many steps
-- $3 lease_seconds (float8): how long each lease lasts
-- returns: rows
-- column run_id (text)
-- column step_id (text)
-- column seq (integer)
-- column step_type (text)
-- column state (text)
-- column attempts (integer)
-- column command_payload_id (bigint, null)
-- column command_key (text, null)
-- column lease_epoch (bigint, null)
-- column past_deadline (boolean)
-- column now (timestamptz)
-- column package_digest (text)
-- column created_at (timestamptz)
-- column abandoned (boolean)
-- column ended (boolean)
-- column scope_step_ids (text[], null, null items): a null item for the run's input
-- column scope_purposes (text[], null)
-- column scope_key_versions (integer[], null)
-- column scope_nonces (bytea[], null)
-- column scope_ciphertexts (bytea[], null)
-- column bindings (text, null)
-- column command_run_id (text, null)
-- column command_purpose (text, null)
-- column command_key_version (integer, null)
-- column command_nonce (bytea, null)
-- column command_ciphertext (bytea, null)
WITH h AS (
    SELECT epoch FROM {{ns}}.hold WHERE NOT execution_hold
), due AS (
    -- The live-run check is a lookup by primary key for each step the walk meets, never a
    -- join: a join's plan can start from run when its statistics are stale (a burst of new
    -- runs not analysed yet looks like no live run at all) and then read step_due once per
    -- run. This way the walk is always step_due order, and stops at the limit.
    SELECT s.run_id, s.step_id
      FROM {{ns}}.step s
     WHERE s.due_at IS NOT NULL
       AND s.lease_owner IS NULL
       AND s.due_at <= {{ns}}.now()
       AND (SELECT r.ended_at IS NULL FROM {{ns}}.run r WHERE r.id = s.run_id)
       AND EXISTS (SELECT 1 FROM h)
     ORDER BY s.due_at
     LIMIT $2
       FOR UPDATE OF s SKIP LOCKED
), claimed AS (
    UPDATE {{ns}}.step s
       SET lease_owner = $1,
           lease_expires_at = {{ns}}.now() + make_interval(secs => $3::float8),
           lease_epoch = (SELECT epoch FROM h),
           updated_at = {{ns}}.now()
      FROM due
     WHERE s.run_id = due.run_id AND s.step_id = due.step_id
    RETURNING s.run_id, s.step_id, s.seq, s.step_type, s.state, s.attempts,
              s.command_payload_id, s.command_key, s.lease_epoch, s.due_at,
              coalesce(s.deadline_at <= {{ns}}.now(), false) AS past_deadline
)
SELECT cl.run_id, cl.step_id, cl.seq, cl.step_type, cl.state, cl.attempts,
       cl.command_payload_id, cl.command_key, cl.lease_epoch, cl.past_deadline,
       {{ns}}.now() AS now,
       r.package_digest, r.created_at,
       {{ns}}.step_abandoned(r.cancelling, r.cancel_seq, cl.seq) AS abandoned,
       r.ended_at IS NOT NULL AS ended,
       p.step_ids AS scope_step_ids, p.purposes AS scope_purposes,
       p.key_versions AS scope_key_versions, p.nonces AS scope_nonces,
       p.ciphertexts AS scope_ciphertexts,
       (SELECT jsonb_agg(jsonb_build_object(
                   'connection', b.connection, 'connection_type', b.connection_type,
                   'base_url', b.base_url, 'client_id', b.client_id, 'issuer', b.issuer,
                   'scopes', b.scopes, 'audience', b.audience, 'profile', b.profile,
                   'producer', b.producer))
          FROM {{ns}}.binding b
         WHERE b.run_id = cl.run_id)::text AS bindings,
       c.run_id AS command_run_id, c.purpose AS command_purpose,
       c.key_version AS command_key_version, c.nonce AS command_nonce,
       c.ciphertext AS command_ciphertext
  FROM claimed cl
  JOIN {{ns}}.run r ON r.id = cl.run_id
  LEFT JOIN LATERAL (
      SELECT array_agg(x.step_id ORDER BY x.id) AS step_ids,
             array_agg(x.purpose ORDER BY x.id) AS purposes,
             array_agg(x.key_version ORDER BY x.id) AS key_versions,
             array_agg(x.nonce ORDER BY x.id) AS nonces,
             array_agg(x.ciphertext ORDER BY x.id) AS ciphertexts
        FROM {{ns}}.payload x
       WHERE x.run_id = cl.run_id AND x.purpose IN ('input', 'output', 'wait-result')
  ) p ON true
  LEFT JOIN {{ns}}.payload c ON c.id = cl.command_payload_id
 ORDER BY cl.due_at;

-- name: dispatcher_expire_leases
-- Find up to limit leases that expired and end each (step_lease_end in transitions.sql): a
-- step whose command was prepared (and so may have been sent by the holder that vanished)
-- becomes uncertain with cause lease-expired and holds its run for an operator, or ends a
-- cancelled run as a settle would have; any other step simply loses the lease and is due
-- when it was. The expired leases are found through the index step_leased and locked (the
-- subquery's FOR UPDATE) before the function meets them.
-- Answers how many leases were released and how many steps became uncertain.
-- $1 limit (integer): at most this many leases
-- returns: row
-- column released (bigint)
-- column uncertain (bigint)
SELECT count(*) AS released, count(*) FILTER (WHERE x.state = 'uncertain') AS uncertain
  FROM (SELECT s.run_id, s.step_id
          FROM {{ns}}.step s
         WHERE s.lease_owner IS NOT NULL AND s.lease_expires_at < {{ns}}.now()
         ORDER BY s.lease_expires_at
         LIMIT $1
           FOR UPDATE SKIP LOCKED) e
 CROSS JOIN LATERAL {{ns}}.step_lease_end(e.run_id, e.step_id, NULL) x;

-- name: dispatcher_flag_retrying
-- Find up to limit calls whose series of retryable answers has lasted long enough to ask
-- for attention (retry_attention_at passed: schema.sql, "Retries in sight") and are ready,
-- unleased and without a cause, and give each the cause retrying and its run attention.
-- Runs through step_retrying from its oldest instant and stops at the limit, so a look that
-- finds nothing reads one index page. The run row is locked before the step's, as every
-- transition locks them, and a run or step that another transaction holds is skipped (never
-- waited for: the next look finds it again). Answers how many steps were flagged.
-- $1 limit (integer): at most this many steps
-- returns: value (bigint)
WITH due AS MATERIALIZED (
    SELECT s.run_id, s.step_id
      FROM {{ns}}.step s
     WHERE s.state = 'ready' AND s.retry_cause IS NOT NULL
       AND s.retry_attention_at <= {{ns}}.now()
     ORDER BY s.retry_attention_at
     LIMIT $1
), runs AS MATERIALIZED (
    -- (the runs by id, never a join that a plan could start from the run table)
    SELECT r.id
      FROM {{ns}}.run r
     WHERE r.id = ANY (ARRAY(SELECT d.run_id FROM due d))
       AND r.ended_at IS NULL
       FOR NO KEY UPDATE SKIP LOCKED
), steps AS MATERIALIZED (
    SELECT s.run_id, s.step_id
      FROM {{ns}}.step s
     WHERE s.run_id = ANY (ARRAY(SELECT r.id FROM runs r))
       AND (s.run_id, s.step_id) IN (SELECT d.run_id, d.step_id FROM due d)
       AND s.state = 'ready' AND s.lease_owner IS NULL AND s.cause IS NULL
       AND s.retry_cause IS NOT NULL
       AND s.retry_attention_at <= {{ns}}.now()
       FOR NO KEY UPDATE SKIP LOCKED
), flagged AS (
    UPDATE {{ns}}.step s
       SET cause = 'retrying', retry_attention_at = NULL, updated_at = {{ns}}.now()
      FROM steps f
     WHERE s.run_id = f.run_id AND s.step_id = f.step_id
    RETURNING s.run_id
), noticed AS (
    UPDATE {{ns}}.run u
       SET attention = true, updated_at = {{ns}}.now()
     WHERE u.id IN (SELECT run_id FROM flagged)
)
SELECT count(*) FROM flagged;

-- name: dispatcher_next_wake
-- When the dispatcher next has something to do: seconds until the earliest due, unclaimed
-- step of a live run and until the earliest lease expiry (each null when there is none;
-- negative when already past), and whether the execution hold is set. The earliest due
-- step is read in step_due order and the walk stops at the first of a live run, so an idle
-- look costs the same with thousands of runs waiting as with none (min() over the join
-- would read every waiting step).
-- returns: row
-- column due_in (float8, null)
-- column lease_in (float8, null)
-- column execution_hold (boolean, null)
SELECT extract(epoch FROM (
           SELECT s.due_at
             FROM {{ns}}.step s
            WHERE s.due_at IS NOT NULL AND s.lease_owner IS NULL
              -- a lookup per step met, never a join (see dispatcher_claim)
              AND (SELECT r.ended_at IS NULL FROM {{ns}}.run r WHERE r.id = s.run_id)
            ORDER BY s.due_at
            LIMIT 1
       ) - {{ns}}.now())::float8 AS due_in,
       extract(epoch FROM (
           SELECT min(lease_expires_at) FROM {{ns}}.step WHERE lease_owner IS NOT NULL
       ) - {{ns}}.now())::float8 AS lease_in,
       (SELECT execution_hold FROM {{ns}}.hold) AS execution_hold;

-- name: dispatcher_lease_renew
-- Extend the owner's lease on a step by seconds from now. No row when the lease is no
-- longer this owner's.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 seconds (float8)
-- returns: value (timestamptz, null)
UPDATE {{ns}}.step
   SET lease_expires_at = {{ns}}.now() + make_interval(secs => $4::float8)
 WHERE run_id = $1 AND step_id = $2 AND lease_owner = $3
RETURNING lease_expires_at;

-- name: dispatcher_hold_epoch
-- The current hold epoch: compared with a lost lease's epoch, it tells whether a
-- restore-hold (which raises it) took the lease away.
-- returns: value (bigint, null)
SELECT epoch FROM {{ns}}.hold;

-- name: dispatcher_step_unprepare
-- The owner gives back a step whose prepared command it knows it never sent: the step is
-- ready again (command and key kept), due no sooner than delay seconds from now, and its
-- lease ends.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 delay (float8)
-- returns: row
-- column state (text)
UPDATE {{ns}}.step
   SET state = CASE WHEN state = 'prepared' THEN 'ready' ELSE state END,
       due_at = CASE
                    WHEN due_at IS NULL THEN NULL
                    ELSE greatest(due_at, {{ns}}.now() + make_interval(secs => $4::float8))
                END,
       lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
       updated_at = {{ns}}.now()
 WHERE run_id = $1 AND step_id = $2 AND lease_owner = $3
RETURNING state;

-- name: dispatcher_step_sent_nothing
-- The owner sent nothing for a call step, for a cause an operator must see (one of
-- sent_nothing in schema.sql): the issuer refused its access token (or granted narrower
-- scopes than the connection's), token-refused, or the issuer failed TLS verification,
-- tls-refused. The step records the cause and is ready again, due delay seconds from now
-- but no later than its deadline, and its lease ends; the run keeps its state and gets
-- attention (an ended run is left alone) until the step next prepares or ends, which
-- clears both (transitions.sql). A step that was never prepared has no deadline yet: the
-- first such attempt counts as the first and sets it, deadline_seconds from now, so the
-- claim after it answers past_deadline and the run fails deadline-exceeded as a retried
-- call would. Like a retry, it records what the attempt met (retry_cause: the same cause),
-- now, and the series of retryable answers it belongs to or begins (schema.sql, "Retries
-- in sight"), and moves the run's updated_at. The run row is locked first, as a cancel
-- locks it. Answers when the step is due again; no row, and nothing written, when the lease
-- is no longer this owner's.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 cause (text): token-refused or tls-refused
-- $5 delay (float8)
-- $6 deadline_seconds (integer): the workflow's deadlineSeconds
-- returns: row
-- column due_at (timestamptz)
WITH r AS (
    SELECT id FROM {{ns}}.run WHERE id = $1 FOR NO KEY UPDATE
), withheld AS (
    UPDATE {{ns}}.step s
       SET state = 'ready',
           cause = $4::text, cause_status = NULL,
           retry_cause = $4::text, retry_status = NULL, retry_last_at = {{ns}}.now(),
           retry_since = coalesce(s.retry_since, {{ns}}.now()), retry_attention_at = NULL,
           first_attempt_at = coalesce(s.first_attempt_at, {{ns}}.now()),
           deadline_at = coalesce(s.deadline_at,
                                  {{ns}}.now() + make_interval(secs => $6::integer)),
           due_at = least({{ns}}.now() + make_interval(secs => $5::float8),
                          coalesce(s.deadline_at,
                                   {{ns}}.now() + make_interval(secs => $6::integer))),
           lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
           updated_at = {{ns}}.now()
      FROM r
     WHERE s.run_id = r.id AND s.step_id = $2 AND s.lease_owner = $3
       -- (never a prepared step: its command may have left, and only a claim may say so)
       AND s.step_type = 'call' AND s.state = 'ready'
       AND {{ns}}.sent_nothing($4::text)
    RETURNING s.due_at
), noticed AS (
    UPDATE {{ns}}.run u
       SET attention = true, updated_at = {{ns}}.now()
      FROM withheld
     WHERE u.id = $1 AND u.ended_at IS NULL
)
SELECT due_at FROM withheld;

-- name: dispatcher_token_refusal_record
-- The issuer refused a connection's access token: remember its OAuth error code, now, for
-- doctor, replacing the connection's earlier refusal.
-- $1 connection (text)
-- $2 error (text): the OAuth error code, e.g. invalid_client; never its description
-- returns: status
INSERT INTO {{ns}}.token_refusal (connection, error, refused_at)
VALUES ($1, $2, {{ns}}.now())
ON CONFLICT (connection) DO UPDATE
   SET error = excluded.error, refused_at = excluded.refused_at;

-- name: dispatcher_token_refusal_clear
-- The issuer granted a connection a token: forget its refusal, if one is recorded.
-- $1 connection (text)
-- returns: status
DELETE FROM {{ns}}.token_refusal WHERE connection = $1;

-- name: dispatcher_step_release
-- The owner gives up its lease on a step without knowing the outcome, due again no sooner
-- than delay seconds from now. A prepared step may have been sent, so it becomes
-- uncertain (cause lease-expired: its dispatcher stopped before it knew) and holds its run
-- instead, or ends a cancelled run as a settle would have (step_lease_end in
-- transitions.sql). Answers the step's state afterwards; no row when the lease is no
-- longer this owner's.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 delay (float8)
-- returns: value (text, null)
SELECT x.state
  FROM (SELECT s.run_id, s.step_id
          FROM {{ns}}.step s
         WHERE s.run_id = $1 AND s.step_id = $2 AND s.lease_owner = $3
           FOR UPDATE) e
 CROSS JOIN LATERAL {{ns}}.step_lease_end(e.run_id, e.step_id, $4::float8) x;

-- name: dispatcher_step_uncertain
-- The command of a call step leased to owner may have been processed: the step waits for
-- an operator (cause says how the answer went missing, cause_status is the product's
-- status for status-5xx) and its run is held, or ends cancelled when a cancel abandoned the
-- step and nothing else of it is live. One call of step_make_uncertain in transitions.sql,
-- which says what each outcome wrote; always one row, with the run's state afterwards when
-- the step was written (null otherwise, or when the run had ended).
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 cause (text): see step.cause in schema.sql
-- $5 cause_status (integer, null): the product's status for status-5xx, null otherwise
-- returns: row
-- column outcome (text)
-- column run_state (text, null)
SELECT outcome, run_state FROM {{ns}}.step_make_uncertain($1, $2, $3, $4, $5);

-- name: dispatcher_step_retry
-- A call step leased to owner was definitely not processed: ready again, due in delay
-- seconds, with the same command and key; cause is null, or tls-refused when nothing left
-- because the product failed TLS verification (the step keeps it and the run asks for
-- attention). The step records what the attempt met (retry_cause, retry_status) and, once
-- its series of retryable answers has lasted attention_after seconds, asks for attention
-- with the cause retrying. One call of step_retry in transitions.sql, which says what each
-- outcome wrote (an abandoned step ends cancelled; one whose deadline a retry would miss
-- fails the run); always one row, due_at set only when the step is ready again.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 delay (float8)
-- $5 cause (text, null): a sent_nothing cause (schema.sql), or null
-- $6 retry_cause (text): what the attempt met (step.retry_cause in schema.sql)
-- $7 retry_status (integer, null): the product's status when it answered
-- $8 attention_after (float8): deployment.attention.retryingAfterSeconds
-- returns: row
-- column outcome (text)
-- column run_state (text, null)
-- column due_at (timestamptz, null)
SELECT outcome, run_state, due_at
  FROM {{ns}}.step_retry($1, $2, $3, $4, $5, $6, $7, $8);

-- name: dispatcher_step_wait
-- A step leased to owner waits: due at due_at, timing out at timeout_at (a timeout
-- already set is kept when that is null); its run is waiting. One call of step_wait in
-- transitions.sql, which says what each outcome wrote (an abandoned step ends cancelled);
-- always one row.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 due_at (timestamptz, null): null when only an outside event can wake it
-- $5 timeout_at (timestamptz, null)
-- returns: row
-- column outcome (text)
-- column run_state (text, null)
SELECT outcome, run_state FROM {{ns}}.step_wait($1, $2, $3, $4, $5);

-- name: dispatcher_step_prepare
-- Commit the command of a call step leased to owner as prepared before it is sent: the
-- stored command payload_id of an earlier attempt, or the sealed command (key_version,
-- nonce, ciphertext), under command_key with deadline_seconds. One call of
-- step_prepare in transitions.sql, which says what each outcome wrote; always one row.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 payload_id (bigint, null): the stored command, or null to store the sealed one
-- $5 key_version (integer, null)
-- $6 nonce (bytea, null)
-- $7 ciphertext (bytea, null)
-- $8 command_key (text)
-- $9 deadline_seconds (integer): the workflow's deadlineSeconds
-- returns: row
-- column outcome (text)
-- column attempts (integer, null)
-- column first_of_run (boolean, null)
-- column since_admission (float8, null)
-- column deadline_in (float8, null)
SELECT outcome, attempts, first_of_run, since_admission, deadline_in
  FROM {{ns}}.step_prepare($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: dispatcher_step_settle_chain
-- Settle a step leased to owner as dispatcher_step_settle does and, when that moved the run
-- on to its next call, lease that call to owner for lease_seconds and prepare it with the
-- sealed command (key_version, nonce, ciphertext) under command_key with deadline_seconds,
-- so that the dispatcher sends it without a claim or a prepare. One call of step_settle
-- in transitions.sql, which says when it prepares; always one row.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 settle (settle_args): how the step ends and where its run goes
-- $5 lease_seconds (float8): how long the next call's lease lasts
-- $6 key_version (integer)
-- $7 nonce (bytea)
-- $8 ciphertext (bytea)
-- $9 command_key (text)
-- $10 deadline_seconds (integer): the next call's deadlineSeconds
-- returns: row
-- column outcome (text)
-- column run_state (text, null)
-- column chained (boolean)
-- column lease_epoch (bigint, null)
-- column now (timestamptz, null)
-- column deadline_in (float8, null)
SELECT outcome, run_state, chained, lease_epoch, now, deadline_in
  FROM {{ns}}.step_settle($1, $2, $3, $4::{{ns}}.settle_args, $5, $6, $7, $8, $9, $10);

-- name: dispatcher_step_settle
-- Settle a step leased to owner as settle says: it ends in its state with its effect (null
-- keeps the present one), keeping the payloads given; the local steps passed are
-- recorded, then the next step is due, or (with none) the run ends in run_state with
-- outcome and failure. One call of step_settle in transitions.sql, which says what each
-- outcome wrote; always one row.
-- $1 run_id (text)
-- $2 step_id (text)
-- $3 owner (text)
-- $4 settle (settle_args): how the step ends and where its run goes
-- returns: row
-- column outcome (text)
-- column run_state (text, null)
SELECT outcome, run_state
  FROM {{ns}}.step_settle($1, $2, $3, $4::{{ns}}.settle_args);
