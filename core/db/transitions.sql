-- Registry Coordinator step transitions, for schema version 4.
--
-- The writes a dispatcher makes most often are PostgreSQL functions, each taking one step
-- from where it is to where it goes next in one call, and answering what happened as an
-- outcome word rather than writing nothing when a case does not apply. A caller runs one
-- of them once and reacts to the outcome; no other statement repeats what they do.
--
-- `apply` installs this file after schema.sql, inside the same transaction, with every
-- `{{ns}}` replaced by the namespace as a quoted identifier. Every function is created
-- with CREATE OR REPLACE, so re-running apply with a later release brings an installed
-- namespace's functions up to date; the drift check then compares them with this file
-- like any table. They run with the caller's rights (SECURITY INVOKER): a component role
-- may call one only when its own grants allow every row it touches, and core/db/roles.py
-- grants EXECUTE to the dispatcher alone. Each pins search_path, so every name it reads
-- is the namespace's own or pg_catalog's.
--
-- Outcomes, shared by the functions below:
--
-- written           the transition happened as asked.
-- lease-lost        the step is not leased to the caller (another dispatcher took it after
--                   the lease expired, or recovery dropped the lease): nothing written.
-- restore-held      the caller's lease is from before the current restore-hold (the hold
--                   epoch moved on): nothing written; the operator's review decides.
-- already-settled   the step is past what the call is about (it has ended; for a prepare,
--                   it is no longer ready): nothing written.
-- abandoned         a cancel abandoned the step (the run is cancelling and the step comes
--                   before the onCancel path, or there is none): a call keeps its own
--                   outcome and every other step ends cancelled, nothing follows, and the
--                   run ends cancelled once nothing of it is live and it has no onCancel
--                   path.
-- held              the execution hold is set: a prepare gives the step back, ready and
--                   unleased; a settle records the step's end but makes its first local
--                   step due instead of running it.
-- run-ended         the run ended while the step was leased: the step's own end is
--                   recorded, nothing follows (a prepare ends the step cancelled, sending
--                   nothing).
-- erased            retention erased the ended run's values: the step's end is recorded,
--                   none of its payloads.

-- Lock the run row, then the step's (the order a cancel takes them in), and say whether the
-- step is the caller's to move: verdict 'ours' or one of the outcomes lease-lost,
-- restore-held and already-settled. With 'ours' it also answers how the run stands.
CREATE OR REPLACE FUNCTION {{ns}}.step_leased(
    p_run text, p_step text, p_owner text,
    OUT verdict text, OUT abandoned boolean, OUT run_ended boolean, OUT erased boolean,
    OUT execution_hold boolean, OUT seq integer, OUT step_type text, OUT state text,
    OUT cause text, OUT run_created_at timestamptz)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            r record;
            s record;
            h record;
        BEGIN
            SELECT x.cancelling, x.cancel_seq, x.ended_at, x.erased_at, x.created_at INTO r
              FROM {{ns}}.run x WHERE x.id = p_run
               FOR NO KEY UPDATE;
            IF NOT FOUND THEN
                verdict := 'lease-lost';
                RETURN;
            END IF;
            SELECT x.seq, x.step_type, x.state, x.cause, x.lease_owner, x.lease_epoch,
                   x.ended_at INTO s
              FROM {{ns}}.step x WHERE x.run_id = p_run AND x.step_id = p_step
               FOR UPDATE;
            IF NOT FOUND THEN
                verdict := 'lease-lost';
                RETURN;
            END IF;
            IF s.lease_owner IS DISTINCT FROM p_owner AND s.ended_at IS NOT NULL THEN
                verdict := 'already-settled';
                RETURN;
            ELSIF s.lease_owner IS DISTINCT FROM p_owner THEN
                verdict := 'lease-lost';
                RETURN;
            END IF;
            SELECT x.epoch, x.execution_hold INTO h FROM {{ns}}.hold x;
            IF s.lease_epoch IS DISTINCT FROM h.epoch THEN
                verdict := 'restore-held';
                RETURN;
            END IF;
            verdict := 'ours';
            abandoned := r.cancelling AND (r.cancel_seq IS NULL OR s.seq < r.cancel_seq);
            run_ended := r.ended_at IS NOT NULL;
            erased := r.erased_at IS NOT NULL;
            execution_hold := h.execution_hold;
            seq := s.seq;
            step_type := s.step_type;
            state := s.state;
            cause := s.cause;
            run_created_at := r.created_at;
        END
    $$;

-- A run being cancelled without an onCancel path ends cancelled once no step of it is live
-- (ready, prepared, waiting, or leased) besides step p_step, which the caller has just
-- settled. Answers whether it ended the run. An uncertain step is not live: it waits for
-- an operator, and the run keeps its attention.
CREATE OR REPLACE FUNCTION {{ns}}.run_close_cancelled(p_run text, p_step text)
    RETURNS boolean
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        BEGIN
            UPDATE {{ns}}.run r
               SET state = 'cancelled', outcome = NULL,
                   failure_kind = NULL, failure_path = NULL, failure_step = NULL,
                   ended_at = {{ns}}.now(), updated_at = {{ns}}.now()
             WHERE r.id = p_run AND r.cancelling AND r.cancel_seq IS NULL
               AND r.ended_at IS NULL
               AND NOT EXISTS (
                       SELECT 1 FROM {{ns}}.step s
                        WHERE s.run_id = p_run AND s.step_id <> p_step
                          AND (s.state IN ('ready', 'prepared', 'waiting')
                               OR s.lease_owner IS NOT NULL));
            RETURN FOUND;
        END
    $$;

-- Recompute run p_run's attention from its steps (step_wants_attention in schema.sql) once
-- one that asked for it because it sent nothing (sent_nothing) has prepared or ended: what
-- that step asked for goes with it, what another step asks for stays. An ended run is
-- recomputed too: a step that ended without being prepared leaves no attention behind.
-- (plpgsql like the others, whose bodies are checked when first run rather than when
-- created: apply over a namespace whose schema.sql lacks those rules then reaches the drift
-- check, which names what is missing, instead of failing on this file.)
CREATE OR REPLACE FUNCTION {{ns}}.run_attention_recompute(p_run text) RETURNS void
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        BEGIN
            UPDATE {{ns}}.run u
               SET attention = EXISTS (
                       SELECT 1 FROM {{ns}}.step x
                        WHERE x.run_id = u.id
                          AND {{ns}}.step_wants_attention(x.state, x.cause)),
                   updated_at = {{ns}}.now()
             WHERE u.id = p_run;
        END
    $$;

-- The command of step p_step of run p_run, leased to p_owner, may have been processed and
-- nobody can know (the answer went missing: p_cause, with the product's p_cause_status for
-- status-5xx): the step becomes uncertain with an unknown effect, unleased and never due, for
-- an operator to settle; nothing is ever resent. The run is held with attention, unless it
-- ended meanwhile (outcome run-ended: it stays as it ended). When a cancel abandoned the step
-- (outcome abandoned) the step still waits for an operator, and a run with no onCancel path
-- and nothing else live ends cancelled, keeping the attention (run_close_cancelled).
CREATE OR REPLACE FUNCTION {{ns}}.step_make_uncertain(
    p_run text, p_step text, p_owner text, p_cause text, p_cause_status integer,
    OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
        BEGIN
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            UPDATE {{ns}}.step
               SET state = 'uncertain', effect = 'unknown', due_at = NULL,
                   cause = p_cause, cause_status = p_cause_status,
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE run_id = p_run AND step_id = p_step;
            IF l.run_ended THEN
                outcome := 'run-ended';
                RETURN;
            END IF;
            UPDATE {{ns}}.run
               SET state = 'held', attention = true, updated_at = {{ns}}.now()
             WHERE id = p_run;
            run_state := 'held';
            IF l.abandoned THEN
                outcome := 'abandoned';
                IF {{ns}}.run_close_cancelled(p_run, p_step) THEN
                    run_state := 'cancelled';
                END IF;
                RETURN;
            END IF;
            outcome := 'written';
        END
    $$;

-- Step p_step of run p_run, leased to p_owner, was definitely not processed (the product
-- said so, or the connection was never made): it is ready again with the same command and
-- key, due in p_delay seconds. p_cause is null, or a cause of sending nothing
-- (sent_nothing in schema.sql: tls-refused) that only an operator mends: the step keeps it
-- and its run asks for attention until the step next prepares or ends. Instead:
--
-- abandoned   a cancel abandoned the step: it ends cancelled, as step_settle ends it, and is
--             never tried again.
-- written     with run_state 'failed' and no due_at: a retry so late would miss the step's
--             deadline, so the step fails and the run fails deadline-exceeded (step_settle).
CREATE OR REPLACE FUNCTION {{ns}}.step_retry(
    p_run text, p_step text, p_owner text, p_delay float8, p_cause text,
    OUT outcome text, OUT run_state text, OUT due_at timestamptz)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
            deadline timestamptz;
        BEGIN
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            IF l.abandoned THEN
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, 'cancelled', NULL,
                                          '{}', '{}', '{}', '{}', '{}', '{}', NULL, NULL,
                                          NULL, NULL, NULL, NULL) x;
                RETURN;
            END IF;
            SELECT x.deadline_at INTO deadline
              FROM {{ns}}.step x WHERE x.run_id = p_run AND x.step_id = p_step;
            IF deadline - {{ns}}.now() <= make_interval(secs => p_delay) THEN
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, 'failed', NULL,
                                          '{}', '{}', '{}', '{}', '{}', '{}', NULL, NULL,
                                          'failed', NULL, 'deadline-exceeded', NULL) x;
                RETURN;
            END IF;
            UPDATE {{ns}}.step x
               SET state = 'ready', cause = p_cause, cause_status = NULL,
                   due_at = {{ns}}.now() + make_interval(secs => p_delay),
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE x.run_id = p_run AND x.step_id = p_step
            RETURNING x.due_at INTO due_at;
            IF {{ns}}.sent_nothing(p_cause) THEN
                UPDATE {{ns}}.run u
                   SET attention = true, updated_at = {{ns}}.now()
                 WHERE u.id = p_run AND u.ended_at IS NULL AND NOT u.attention;
            END IF;
            outcome := 'written';
        END
    $$;

-- Step p_step of run p_run, leased to p_owner, waits: due at p_due_at (null when only an
-- outside event can wake it), timing out at p_timeout_at (a timeout already set is kept
-- when that is null), unleased; its run is waiting unless it has ended. When a cancel
-- abandoned the step (outcome abandoned) it waits for nothing: it ends cancelled, as
-- step_settle ends it.
CREATE OR REPLACE FUNCTION {{ns}}.step_wait(
    p_run text, p_step text, p_owner text, p_due_at timestamptz, p_timeout_at timestamptz,
    OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
        BEGIN
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            IF l.abandoned THEN
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, 'cancelled', NULL,
                                          '{}', '{}', '{}', '{}', '{}', '{}', NULL, NULL,
                                          NULL, NULL, NULL, NULL) x;
                RETURN;
            END IF;
            UPDATE {{ns}}.step x
               SET state = 'waiting', due_at = p_due_at,
                   timeout_at = coalesce(p_timeout_at, x.timeout_at),
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE x.run_id = p_run AND x.step_id = p_step;
            IF NOT l.run_ended THEN
                UPDATE {{ns}}.run u
                   SET state = 'waiting', updated_at = {{ns}}.now()
                 WHERE u.id = p_run;
                run_state := 'waiting';
            END IF;
            outcome := 'written';
        END
    $$;

-- Before the dispatcher reads a product's result for step p_step of run p_run, leased to
-- p_owner (the lease is kept for the read): the step is waiting, found by the keyed digest
-- p_match (a completion event carries the same), times out p_timeout_seconds from now
-- (null: no timeout; a timeout already set is kept), and its following check is p_delay
-- seconds from now. With p_entering (the step has just started waiting) the run is waiting
-- too, unless it has ended. When a cancel abandoned the step (outcome abandoned) nothing is
-- read: the step ends cancelled, as step_settle ends it.
CREATE OR REPLACE FUNCTION {{ns}}.step_plan_check(
    p_run text, p_step text, p_owner text, p_match bytea, p_timeout_seconds float8,
    p_delay float8, p_entering boolean,
    OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
        BEGIN
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            IF l.abandoned THEN
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, 'cancelled', NULL,
                                          '{}', '{}', '{}', '{}', '{}', '{}', NULL, NULL,
                                          NULL, NULL, NULL, NULL) x;
                RETURN;
            END IF;
            UPDATE {{ns}}.step x
               SET state = 'waiting',
                   wait_match = p_match,
                   timeout_at = coalesce(x.timeout_at,
                                         {{ns}}.now() + make_interval(secs => p_timeout_seconds)),
                   next_check_at = {{ns}}.now() + make_interval(secs => p_delay),
                   updated_at = {{ns}}.now()
             WHERE x.run_id = p_run AND x.step_id = p_step;
            IF p_entering AND NOT l.run_ended THEN
                UPDATE {{ns}}.run u
                   SET state = 'waiting', updated_at = {{ns}}.now()
                 WHERE u.id = p_run;
                run_state := 'waiting';
            END IF;
            outcome := 'written';
        END
    $$;

-- The dispatcher read the product's result for wait-for step p_step of run p_run, leased
-- to p_owner, and records what the read said. The read ends the wait when p_ends (a
-- decision) or, with p_may_time_out (the step has an onTimeout path), when the step's
-- timeout has come by the database's clock: the check is counted as the last one, the
-- run's attention is cleared (by the rule below), and the step completes as
-- step_settle completes it, with the payloads and the way on given (p_purposes ...
-- p_outcome, as step_settle takes them); ended answers that it did. Otherwise the check is
-- counted, the step is due at its next check or its timeout, whichever comes first, and
-- gives up its lease, and the run's attention is set to p_attention (null: left as it is):
-- true when the product refused to show the result or failed TLS verification, false once
-- a read is answered. Attention is never cleared from a run with a step that asks for it
-- (step_wants_attention in schema.sql), nor set on an ended run. When a cancel abandoned
-- the step (outcome abandoned) nothing is recorded: it ends cancelled, as step_settle ends
-- it.
CREATE OR REPLACE FUNCTION {{ns}}.step_record_read(
    p_run text, p_step text, p_owner text, p_ends boolean, p_may_time_out boolean,
    p_attention boolean,
    p_purposes text[], p_key_versions integer[], p_nonces bytea[], p_ciphertexts bytea[],
    p_passed_ids text[], p_passed_types text[], p_next text, p_next_type text,
    p_run_state text, p_outcome text,
    OUT outcome text, OUT run_state text, OUT ended boolean)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
            clear_or_set boolean := p_attention;
        BEGIN
            ended := false;
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            IF l.abandoned THEN
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, 'cancelled', NULL,
                                          '{}', '{}', '{}', '{}', '{}', '{}', NULL, NULL,
                                          NULL, NULL, NULL, NULL) x;
                RETURN;
            END IF;
            ended := p_ends OR (p_may_time_out AND EXISTS (
                         SELECT 1 FROM {{ns}}.step x
                          WHERE x.run_id = p_run AND x.step_id = p_step
                            AND x.timeout_at <= {{ns}}.now()));
            IF ended THEN
                UPDATE {{ns}}.step x
                   SET checks = x.checks + 1, next_check_at = NULL, updated_at = {{ns}}.now()
                 WHERE x.run_id = p_run AND x.step_id = p_step;
                clear_or_set := false;
            ELSE
                UPDATE {{ns}}.step x
                   SET checks = x.checks + 1,
                       due_at = least(x.next_check_at, x.timeout_at),
                       lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                       updated_at = {{ns}}.now()
                 WHERE x.run_id = p_run AND x.step_id = p_step;
            END IF;
            IF clear_or_set IS NOT NULL THEN
                UPDATE {{ns}}.run r
                   SET attention = clear_or_set, updated_at = {{ns}}.now()
                 WHERE r.id = p_run
                   AND r.ended_at IS NULL
                   AND r.attention IS DISTINCT FROM clear_or_set
                   AND (clear_or_set
                        OR NOT EXISTS (SELECT 1 FROM {{ns}}.step s
                                        WHERE s.run_id = r.id
                                          AND {{ns}}.step_wants_attention(s.state, s.cause)));
            END IF;
            IF ended THEN
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, 'completed', NULL,
                                          p_purposes, p_key_versions, p_nonces, p_ciphertexts,
                                          p_passed_ids, p_passed_types, p_next, p_next_type,
                                          p_run_state, p_outcome, NULL, NULL) x;
                RETURN;
            END IF;
            outcome := 'written';
        END
    $$;

-- Settle step p_step of run p_run, leased to p_owner: it ends in state p_state (completed,
-- refused, failed or cancelled) with effect p_effect (null keeps the present one; the
-- cause is cleared, since what is now known replaces it), its payloads are stored
-- (parallel arrays p_purposes, p_key_versions, p_nonces, p_ciphertexts; may be empty),
-- and the run moves on. A step that ends while it waits with a cause of sending nothing
-- (its deadline passed, or a cancel ended it) takes the attention it asked for with it:
-- the run's attention is recomputed without it. Then:
--
-- * the local steps the dispatcher already decided from the run's values (parallel arrays
--   p_passed_ids, p_passed_types; may be empty) are recorded as reached and completed, in
--   order;
-- * then step p_next (of type p_next_type) becomes the run's next step, due now, and the
--   run is running; or, when p_next is null, the run ends in p_run_state (succeeded or
--   failed) with outcome p_outcome and failure p_failure_kind at JSON pointer
--   p_failure_path, naming p_step. A run on its onCancel path ends cancelled instead,
--   keeping the outcome and no failure.
--
-- Answers the outcome (see the file header) and the run's state when this ended it or
-- moved it on. Every case besides 'written' writes exactly what its outcome says.
CREATE OR REPLACE FUNCTION {{ns}}.step_settle(
    p_run text, p_step text, p_owner text, p_state text, p_effect text,
    p_purposes text[], p_key_versions integer[], p_nonces bytea[], p_ciphertexts bytea[],
    p_passed_ids text[], p_passed_types text[], p_next text, p_next_type text,
    p_run_state text, p_outcome text, p_failure_kind text, p_failure_path text,
    OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
            v_state text := p_state;
            v_keep boolean := true;
            v_passed integer := coalesce(cardinality(p_passed_ids), 0);
        BEGIN
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            IF l.erased THEN
                outcome := 'erased';
                v_keep := false;
            ELSIF l.abandoned THEN
                outcome := 'abandoned';
                IF l.step_type <> 'call' THEN
                    -- what the step was about to decide or wait for is not done
                    v_state := 'cancelled';
                    v_keep := false;
                END IF;
            ELSIF l.run_ended THEN
                outcome := 'run-ended';
            ELSIF l.execution_hold AND v_passed > 0 THEN
                outcome := 'held';
            ELSE
                outcome := 'written';
            END IF;

            UPDATE {{ns}}.step
               SET state = v_state,
                   effect = coalesce(p_effect, effect),
                   cause = NULL, cause_status = NULL,
                   due_at = NULL,
                   ended_at = {{ns}}.now(),
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE run_id = p_run AND step_id = p_step;
            IF {{ns}}.sent_nothing(l.cause) THEN
                PERFORM {{ns}}.run_attention_recompute(p_run);
            END IF;
            IF v_keep AND coalesce(cardinality(p_purposes), 0) > 0 THEN
                INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce,
                                            ciphertext)
                SELECT p_run, p_step, x.purpose, x.key_version, x.nonce, x.ciphertext
                  FROM unnest(p_purposes, p_key_versions, p_nonces, p_ciphertexts)
                       WITH ORDINALITY AS x(purpose, key_version, nonce, ciphertext, n)
                 ORDER BY x.n;
            END IF;

            IF outcome = 'abandoned' THEN
                IF {{ns}}.run_close_cancelled(p_run, p_step) THEN
                    run_state := 'cancelled';
                END IF;
                RETURN;
            ELSIF outcome IN ('erased', 'run-ended') THEN
                RETURN;
            ELSIF outcome = 'held' THEN
                -- nothing is executed under the hold: the first local step waits for it
                INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
                VALUES (p_run, p_passed_ids[1], l.seq + 1, p_passed_types[1], 'ready',
                        {{ns}}.now());
                UPDATE {{ns}}.run
                   SET state = 'running', updated_at = {{ns}}.now()
                 WHERE id = p_run;
                run_state := 'running';
                RETURN;
            END IF;

            IF v_passed > 0 THEN
                INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, ended_at)
                SELECT p_run, x.step_id, l.seq + x.n::integer, x.step_type, 'completed',
                       {{ns}}.now()
                  FROM unnest(p_passed_ids, p_passed_types)
                       WITH ORDINALITY AS x(step_id, step_type, n);
            END IF;
            IF p_next IS NOT NULL THEN
                INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
                VALUES (p_run, p_next, l.seq + v_passed + 1, p_next_type, 'ready',
                        {{ns}}.now());
                UPDATE {{ns}}.run
                   SET state = 'running', updated_at = {{ns}}.now()
                 WHERE id = p_run;
                run_state := 'running';
            ELSE
                UPDATE {{ns}}.run
                   SET state = CASE WHEN cancelling THEN 'cancelled' ELSE p_run_state END,
                       outcome = p_outcome,
                       failure_kind = CASE WHEN cancelling THEN NULL ELSE p_failure_kind END,
                       failure_path = CASE WHEN cancelling THEN NULL ELSE p_failure_path END,
                       failure_step = CASE WHEN cancelling OR p_failure_kind IS NULL THEN NULL
                                           ELSE p_step END,
                       ended_at = {{ns}}.now(),
                       updated_at = {{ns}}.now()
                 WHERE id = p_run
                RETURNING state INTO run_state;
            END IF;
        END
    $$;

-- Commit the command of call step p_step of run p_run, leased to p_owner, as prepared,
-- before a byte of it is sent: the stored command p_payload of an earlier attempt, or else
-- the sealed command given (state key version p_key_version, nonce p_nonce, ciphertext
-- p_ciphertext with its GCM tag), stored here. It is sent under command key p_command_key,
-- and the step's deadline is set at the first attempt, p_deadline_seconds from now. The
-- attempt is counted. A step that sent nothing before for a cause an operator had to see
-- (sent_nothing: a refused token, a failed TLS verification) is on its way now: that cause
-- is cleared and the run's attention recomputed without it.
--
-- Answers the outcome and, when written, the attempt's number, whether it is the run's
-- first command, how long ago the run was admitted and how many seconds are left until
-- the step's deadline. Besides 'written': an abandoned step ends cancelled (and its run
-- with it when nothing else is live), the execution hold gives the step back ready, and a
-- step of an ended run ends cancelled — in each case nothing is stored and nothing may be
-- sent.
CREATE OR REPLACE FUNCTION {{ns}}.step_prepare(
    p_run text, p_step text, p_owner text, p_payload bigint,
    p_key_version integer, p_nonce bytea, p_ciphertext bytea,
    p_command_key text, p_deadline_seconds integer,
    OUT outcome text, OUT attempts integer, OUT first_of_run boolean,
    OUT since_admission float8, OUT deadline_in float8)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
            v_payload bigint := p_payload;
        BEGIN
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            ELSIF l.abandoned OR l.run_ended THEN
                -- a cancel committed first: the command is never sent
                SELECT s.outcome INTO outcome
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, 'cancelled', NULL,
                                          NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                          NULL, NULL, NULL, NULL) s;
                RETURN;
            ELSIF l.execution_hold THEN
                UPDATE {{ns}}.step
                   SET lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                       due_at = greatest(due_at, {{ns}}.now()),
                       updated_at = {{ns}}.now()
                 WHERE run_id = p_run AND step_id = p_step;
                outcome := 'held';
                RETURN;
            ELSIF l.state <> 'ready' THEN
                outcome := 'already-settled';
                RETURN;
            END IF;

            first_of_run := NOT EXISTS (
                SELECT 1 FROM {{ns}}.step
                 WHERE run_id = p_run AND prepared_at IS NOT NULL);
            since_admission := extract(epoch FROM {{ns}}.now() - l.run_created_at)::float8;
            IF v_payload IS NULL THEN
                INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce,
                                            ciphertext)
                VALUES (p_run, p_step, 'command', p_key_version, p_nonce, p_ciphertext)
                RETURNING id INTO v_payload;
            END IF;
            UPDATE {{ns}}.step s
               SET state = 'prepared',
                   command_payload_id = v_payload,
                   command_key = p_command_key,
                   cause = CASE WHEN {{ns}}.sent_nothing(l.cause) THEN NULL ELSE s.cause END,
                   prepared_at = coalesce(s.prepared_at, {{ns}}.now()),
                   first_attempt_at = coalesce(s.first_attempt_at, {{ns}}.now()),
                   deadline_at = coalesce(s.deadline_at,
                                          {{ns}}.now()
                                          + make_interval(secs => p_deadline_seconds)),
                   attempts = s.attempts + 1,
                   updated_at = {{ns}}.now()
             WHERE s.run_id = p_run AND s.step_id = p_step
            RETURNING s.attempts, extract(epoch FROM s.deadline_at - {{ns}}.now())::float8
                 INTO attempts, deadline_in;
            IF {{ns}}.sent_nothing(l.cause) THEN
                PERFORM {{ns}}.run_attention_recompute(p_run);
            END IF;
            outcome := 'written';
        END
    $$;
