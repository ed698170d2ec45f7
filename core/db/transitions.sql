-- Registry Coordinator step transitions, for schema version 4, and the composite types
-- their callers pass wide arguments in.
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
-- Argument types. What a step's end carries (its payloads, the local steps passed, the way
-- on or the run's end) and what a start writes are one value each, of a composite type of
-- the namespace (settle_args, start_args with its binding_args), not a dozen or two
-- positional arguments: a caller builds one typed value (the NamedTuple of the same name
-- that scripts/gen_query_names.py makes from the `-- type:` header above each type) and a
-- function reads its fields by name. A type is created when it is missing and otherwise
-- left as it is, never dropped and made again: a type cannot be replaced while functions
-- take it, and keeping it keeps its oid, which every connection's prepared statements and
-- asyncpg's codec for it name. The drift check compares its attributes with this file like
-- a table's columns, so a later change of its fields is an ALTER TYPE written here. Only
-- the schema's owner may make objects of these types (grants_reset revokes USAGE from
-- PUBLIC; calling a function that takes one needs none).
--
-- Retired signatures. CREATE OR REPLACE with other arguments makes a second function
-- beside the first, which the drift check would refuse, so a function whose arguments
-- changed is dropped here under its earlier signature.
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
-- changed           (operator mode) the step is no longer the version the operator's action
--                   read, or a dispatcher holds it: nothing written; the operator looks again.
--
-- Operator mode. Recovery's run actions (reconcile, retry-same, cancel) act on steps no
-- dispatcher holds: an uncertain or not-sent call. Instead of a lease they name the row
-- version (xmin) of the step they read before deciding, and step_checked confirms it
-- under the same locks step_leased takes. Settling then goes through step_settle itself,
-- so a run goes on or ends exactly as it does when a dispatcher settles its step.

-- type: settle_args
-- How a step ends and where its run goes, with the payloads it keeps sealed: what
-- step_settle takes after run, step and owner (step_operator_settle after the step's row
-- version; step_record_read for a read that ends its wait).
-- field state (text): the step's end: completed, refused, failed or cancelled
-- field effect (text, null): the call's effect; null keeps the present one
-- field purposes (text[]): the payloads to keep, one item each in these four lists
-- field key_versions (integer[]): the state key version each is sealed under
-- field nonces (bytea[])
-- field ciphertexts (bytea[]): each with its GCM tag
-- field passed_ids (text[]): the local steps decided on the way, in order
-- field passed_types (text[])
-- field next_step (text, null): the run's next step; null when the run ends here
-- field next_type (text, null)
-- field run_state (text, null): the run's end (succeeded, failed) when it ends
-- field outcome (text, null): the run's outcome when it ends
-- field failure_kind (text, null): why the run failed
-- field failure_path (text, null): where, as a JSON pointer
DO $settle_args$
BEGIN
    IF to_regtype('{{ns}}.settle_args') IS NULL THEN
        CREATE TYPE {{ns}}.settle_args AS (
            state text, effect text,
            purposes text[], key_versions integer[], nonces bytea[], ciphertexts bytea[],
            passed_ids text[], passed_types text[], next_step text, next_type text,
            run_state text, outcome text, failure_kind text, failure_path text);
    END IF;
END
$settle_args$;

-- type: binding_args
-- One connection a run depends on, as admission_start records it in binding.
-- field connection (text): the connection's name
-- field connection_type (text)
-- field base_url (text)
-- field client_id (text)
-- field scopes (text[])
-- field audience (text): the token audience
-- field profile (text)
-- field producer (text, null): null outside Casework
DO $binding_args$
BEGIN
    IF to_regtype('{{ns}}.binding_args') IS NULL THEN
        CREATE TYPE {{ns}}.binding_args AS (
            connection text, connection_type text, base_url text, client_id text,
            scopes text[], audience text, profile text, producer text);
    END IF;
END
$binding_args$;

-- type: start_args
-- A start of an input that fits its workflow: the run admission_start would create.
-- field run_id (text)
-- field workflow_id (text)
-- field package_digest (text)
-- field principal_iss (text)
-- field principal_sub (text)
-- field client_id (text, null): null for event starts
-- field issuer (text): the issuer of every binding's client
-- field bindings (binding_args[]): one per connection the workflow uses
-- field key_version (integer): the state key version of the sealed input
-- field nonce (bytea)
-- field ciphertext (bytea): with its GCM tag
-- field identity (text): the start identity, 64 hex digits
-- field input_digest (text): the keyed digest of the input, 64 hex digits
-- field first_step (text): the id of the first step
-- field first_step_type (text)
-- field activation_serial (bigint): the activation serial the service started under
DO $start_args$
BEGIN
    IF to_regtype('{{ns}}.start_args') IS NULL THEN
        CREATE TYPE {{ns}}.start_args AS (
            run_id text, workflow_id text, package_digest text,
            principal_iss text, principal_sub text, client_id text,
            issuer text, bindings {{ns}}.binding_args[],
            key_version integer, nonce bytea, ciphertext bytea,
            identity text, input_digest text,
            first_step text, first_step_type text, activation_serial bigint);
    END IF;
END
$start_args$;

-- The signatures before the arguments of a step's end became one settle_args (issue 39).
DROP FUNCTION IF EXISTS {{ns}}.step_settle(
    text, text, text, text, text, text[], integer[], bytea[], bytea[], text[], text[],
    text, text, text, text, text, text);
DROP FUNCTION IF EXISTS {{ns}}.step_operator_settle(
    text, text, text, text, text, text[], integer[], bytea[], bytea[], text[], text[],
    text, text, text, text, text, text);
DROP FUNCTION IF EXISTS {{ns}}.step_record_read(
    text, text, text, boolean, boolean, boolean, text[], integer[], bytea[], bytea[],
    text[], text[], text, text, text, text);
-- The signature before a retry recorded what its attempt met (issue 41, retries in sight).
DROP FUNCTION IF EXISTS {{ns}}.step_retry(text, text, text, float8, text);
-- Before a call's settle could prepare the run's next call itself (issue 43), a function of
-- its own did that around step_settle.
DROP FUNCTION IF EXISTS {{ns}}.step_settle(text, text, text, {{ns}}.settle_args);
DROP FUNCTION IF EXISTS {{ns}}.step_settle_chain(
    text, text, text, {{ns}}.settle_args, float8, integer, bytea, bytea, text, integer);

-- Whether a cancel abandoned step number p_seq of a run: the run is cancelling (p_cancelling)
-- and the step comes before the onCancel path, which starts at step number p_cancel_seq (null:
-- there is no such path, and every step is abandoned). The one place this rule is written:
-- step_leased answers it under the step's lock, and the claim and an operator's look at a
-- run read it from here as a hint that the locked decision confirms. (A plain expression
-- over its arguments: SQL that reads no table, so it needs no pinned search_path.)
CREATE OR REPLACE FUNCTION {{ns}}.step_abandoned(
    p_cancelling boolean, p_cancel_seq integer, p_seq integer) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
        SELECT p_cancelling AND (p_cancel_seq IS NULL OR p_seq < p_cancel_seq)
    $$;

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
            abandoned := {{ns}}.step_abandoned(r.cancelling, r.cancel_seq, s.seq);
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
-- settled (null: no step is left out). Answers whether it ended the run. An uncertain step is not live: it waits for
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
                        WHERE s.run_id = p_run AND s.step_id IS DISTINCT FROM p_step
                          AND (s.state IN ('ready', 'prepared', 'waiting')
                               OR s.lease_owner IS NOT NULL));
            RETURN FOUND;
        END
    $$;

-- Recompute run p_run's attention from its steps (step_wants_attention in schema.sql) once
-- one that asked for it while ready (ready_attention: it sent nothing, or it has been
-- retrying too long) has prepared or ended: what that step asked for goes with it, what
-- another step asks for stays. An ended run is recomputed too: a step that ended without
-- being prepared leaves no attention behind.
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

-- The command of step p_step of run p_run may have been processed and nobody can know (the
-- answer went missing: p_cause, with the product's p_cause_status for status-5xx, or its
-- dispatcher lost the lease first: lease-expired). The caller has the step row locked and
-- has decided it is the one to say so (step_make_uncertain checked the lease;
-- step_lease_end is called for a lease that ended). The step becomes uncertain with an
-- unknown effect, unleased and never due, for an operator to settle; nothing is ever
-- resent. The run is held with attention, unless it has ended (run_state null: it stays as
-- it ended). When a cancel abandoned the step (abandoned) the step still waits for an
-- operator, and a run with no onCancel path and nothing else live ends cancelled, keeping
-- the attention (run_close_cancelled). The one place this move is written.
CREATE OR REPLACE FUNCTION {{ns}}.step_uncertain_write(
    p_run text, p_step text, p_cause text, p_cause_status integer,
    OUT abandoned boolean, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            r record;
            v_seq integer;
        BEGIN
            SELECT x.cancelling, x.cancel_seq, x.ended_at INTO r
              FROM {{ns}}.run x WHERE x.id = p_run
               FOR NO KEY UPDATE;
            UPDATE {{ns}}.step
               SET state = 'uncertain', effect = 'unknown', due_at = NULL,
                   cause = p_cause, cause_status = p_cause_status,
                   retry_since = NULL,  -- (an unknown effect ends a series of retries)
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE run_id = p_run AND step_id = p_step
            RETURNING seq INTO v_seq;
            abandoned := {{ns}}.step_abandoned(r.cancelling, r.cancel_seq, v_seq);
            IF r.ended_at IS NOT NULL THEN
                RETURN;
            END IF;
            UPDATE {{ns}}.run
               SET state = 'held', attention = true, updated_at = {{ns}}.now()
             WHERE id = p_run;
            run_state := 'held';
            IF abandoned AND {{ns}}.run_close_cancelled(p_run, p_step) THEN
                run_state := 'cancelled';
            END IF;
        END
    $$;

-- The command of step p_step of run p_run, leased to p_owner, may have been processed and
-- nobody can know (the answer went missing: p_cause, with the product's p_cause_status for
-- status-5xx): the step becomes uncertain and its run is held, as step_uncertain_write
-- says. Outcome run-ended when the run had ended (it stays as it ended), abandoned when a
-- cancel abandoned the step.
CREATE OR REPLACE FUNCTION {{ns}}.step_make_uncertain(
    p_run text, p_step text, p_owner text, p_cause text, p_cause_status integer,
    OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
            w record;
        BEGIN
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            SELECT * INTO w FROM {{ns}}.step_uncertain_write(p_run, p_step, p_cause,
                                                           p_cause_status);
            run_state := w.run_state;
            IF l.run_ended THEN
                outcome := 'run-ended';
            ELSIF w.abandoned THEN
                outcome := 'abandoned';
            ELSE
                outcome := 'written';
            END IF;
        END
    $$;

-- The lease on step p_step of run p_run ended without its holder settling the step: it
-- expired (the holder vanished), or the holder gave it up without knowing what became of
-- the step. The caller has the step row locked. A prepared step may have been sent, so it
-- becomes uncertain with cause lease-expired and its run is held (step_uncertain_write);
-- any other step just loses the lease, due again no sooner than p_delay seconds from now
-- (null: when it was due). Answers the step's state afterwards and the run's when this
-- changed it. No check of the restore-hold epoch: a lease from before a hold ends like any
-- other.
CREATE OR REPLACE FUNCTION {{ns}}.step_lease_end(
    p_run text, p_step text, p_delay float8, OUT state text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        BEGIN
            SELECT x.state INTO state
              FROM {{ns}}.step x WHERE x.run_id = p_run AND x.step_id = p_step;
            IF state = 'prepared' THEN
                SELECT w.run_state INTO run_state
                  FROM {{ns}}.step_uncertain_write(p_run, p_step, 'lease-expired', NULL) w;
                state := 'uncertain';
                RETURN;
            END IF;
            UPDATE {{ns}}.step x
               SET due_at = CASE
                                WHEN p_delay IS NULL OR x.due_at IS NULL THEN x.due_at
                                ELSE greatest(x.due_at,
                                              {{ns}}.now() + make_interval(secs => p_delay))
                            END,
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE x.run_id = p_run AND x.step_id = p_step;
        END
    $$;

-- Step p_step of run p_run, leased to p_owner, goes no further: a cancel abandoned it, or
-- (for a prepare) its run ended. Whatever it was about to do is not done: it ends cancelled
-- as step_settle ends it, and its run with it when a cancel left nothing else live. The
-- transitions that would have kept the step going (a prepare, a retry, a wait, a read) end
-- here instead.
CREATE OR REPLACE FUNCTION {{ns}}.step_end_cancelled(
    p_run text, p_step text, p_owner text, OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            v_end {{ns}}.settle_args;  -- nothing kept, nothing follows
        BEGIN
            v_end.state := 'cancelled';
            SELECT x.outcome, x.run_state INTO outcome, run_state
              FROM {{ns}}.step_settle(p_run, p_step, p_owner, v_end) x;
        END
    $$;

-- Step p_step of run p_run, leased to p_owner, was definitely not processed (the product
-- said so, or the connection was never made): it is ready again with the same command and
-- key, due in p_delay seconds. p_cause is null, or a cause of sending nothing
-- (sent_nothing in schema.sql: tls-refused) that only an operator mends: the step keeps it
-- and its run asks for attention until the step next prepares or ends.
--
-- The step records what this attempt met, p_retry_cause (with the product's p_retry_status
-- when it answered), now, and the series of retryable answers it belongs to: it began at
-- the step's retry_since, or now with this one. Once the series has lasted
-- p_attention_after seconds (deployment.attention.retryingAfterSeconds) a step without a
-- cause of its own takes the cause retrying, and its run asks for attention as for p_cause;
-- before that, retry_attention_at is when it will (the dispatcher's sweep finds it there).
-- Every written retry moves the run's updated_at. Instead:
--
-- abandoned   a cancel abandoned the step: it ends cancelled, as step_settle ends it, and is
--             never tried again.
-- written     with run_state 'failed' and no due_at: a retry so late would miss the step's
--             deadline, so the step fails and the run fails deadline-exceeded (step_settle).
CREATE OR REPLACE FUNCTION {{ns}}.step_retry(
    p_run text, p_step text, p_owner text, p_delay float8, p_cause text,
    p_retry_cause text, p_retry_status integer, p_attention_after float8,
    OUT outcome text, OUT run_state text, OUT due_at timestamptz)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
            s record;
            v_attention_at timestamptz;
            v_cause text := p_cause;
            v_end {{ns}}.settle_args;
        BEGIN
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            IF l.abandoned THEN
                SELECT * INTO outcome, run_state
                  FROM {{ns}}.step_end_cancelled(p_run, p_step, p_owner);
                RETURN;
            END IF;
            SELECT x.deadline_at, coalesce(x.retry_since, {{ns}}.now()) AS since INTO s
              FROM {{ns}}.step x WHERE x.run_id = p_run AND x.step_id = p_step;
            IF s.deadline_at - {{ns}}.now() <= make_interval(secs => p_delay) THEN
                v_end.state := 'failed';
                v_end.run_state := 'failed';
                v_end.failure_kind := 'deadline-exceeded';
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, v_end) x;
                RETURN;
            END IF;
            v_attention_at := s.since + make_interval(secs => p_attention_after);
            IF v_cause IS NULL AND v_attention_at <= {{ns}}.now() THEN
                v_cause := 'retrying';
            END IF;
            UPDATE {{ns}}.step x
               SET state = 'ready', cause = v_cause, cause_status = NULL,
                   due_at = {{ns}}.now() + make_interval(secs => p_delay),
                   retry_cause = p_retry_cause, retry_status = p_retry_status,
                   retry_last_at = {{ns}}.now(), retry_since = s.since,
                   retry_attention_at = CASE WHEN v_cause IS NULL THEN v_attention_at END,
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE x.run_id = p_run AND x.step_id = p_step
            RETURNING x.due_at INTO due_at;
            UPDATE {{ns}}.run u
               SET attention = u.attention OR coalesce({{ns}}.ready_attention(v_cause), false),
                   updated_at = {{ns}}.now()
             WHERE u.id = p_run AND u.ended_at IS NULL;
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
                SELECT * INTO outcome, run_state
                  FROM {{ns}}.step_end_cancelled(p_run, p_step, p_owner);
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
                SELECT * INTO outcome, run_state
                  FROM {{ns}}.step_end_cancelled(p_run, p_step, p_owner);
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
-- step_settle completes it, with the payloads and the way on p_settle gives (its state,
-- effect and failure aside: a read ends a wait by completing the step, with no effect and
-- no failure); ended answers that it did. Otherwise the check is
-- counted, the step is due at its next check or its timeout, whichever comes first, and
-- gives up its lease, and the run's attention is set to p_attention (null: left as it is):
-- true when the product refused to show the result or failed TLS verification, false once
-- a read is answered. Attention is never cleared from a run with a step that asks for it
-- (step_wants_attention in schema.sql), nor set on an ended run. When a cancel abandoned
-- the step (outcome abandoned) nothing is recorded: it ends cancelled, as step_settle ends
-- it.
CREATE OR REPLACE FUNCTION {{ns}}.step_record_read(
    p_run text, p_step text, p_owner text, p_ends boolean, p_may_time_out boolean,
    p_attention boolean, p_settle {{ns}}.settle_args,
    OUT outcome text, OUT run_state text, OUT ended boolean)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
            clear_or_set boolean := p_attention;
            v_end {{ns}}.settle_args := p_settle;
        BEGIN
            ended := false;
            SELECT * INTO l FROM {{ns}}.step_leased(p_run, p_step, p_owner);
            IF l.verdict <> 'ours' THEN
                outcome := l.verdict;
                RETURN;
            END IF;
            IF l.abandoned THEN
                SELECT * INTO outcome, run_state
                  FROM {{ns}}.step_end_cancelled(p_run, p_step, p_owner);
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
                v_end.state := 'completed';
                v_end.effect := NULL;
                v_end.failure_kind := NULL;
                v_end.failure_path := NULL;
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_settle(p_run, p_step, p_owner, v_end) x;
                RETURN;
            END IF;
            outcome := 'written';
        END
    $$;

-- Settle step p_step of run p_run, leased to p_owner, as p_settle (a settle_args) says: it
-- ends in state p_settle.state (completed, refused, failed or cancelled) with effect
-- p_settle.effect (null keeps the present one; the cause is cleared, since what is now
-- known replaces it, as the record of a series of retries), its payloads are stored (the
-- parallel arrays purposes, key_versions, nonces, ciphertexts; empty or null: none), and the
-- run moves on. A step that asked for attention (step_wants_attention: it waited with a
-- cause of sending nothing or retrying and its deadline passed or a cancel ended it, or an
-- operator settles it in operator mode) takes that attention with it: the run's attention
-- is recomputed without it. Then:
--
-- * the local steps the dispatcher already decided from the run's values (the parallel
--   arrays passed_ids, passed_types; empty or null: none) are recorded as reached and
--   completed, in order;
-- * then step next_step (of type next_type) becomes the run's next step, due now, and the
--   run is running; or, when next_step is null, the run ends in run_state (succeeded or
--   failed) with outcome outcome and failure failure_kind at JSON pointer failure_path,
--   naming p_step. A run on its onCancel path ends cancelled instead, keeping the outcome
--   and no failure.
--
-- A call's settle may go on to the run's next call itself (issue 43, chained calls): with
-- p_command_key given, when the settle is 'written', makes p_settle's next step and that
-- step is a call, and the execution hold is not set (read after the run and the step are
-- locked), the next step is made already leased to p_owner for p_lease_seconds in the
-- current hold epoch and prepared with the command the caller sealed (p_key_version,
-- p_nonce, p_ciphertext) under p_command_key, its deadline p_deadline_seconds away: the
-- state a claim and step_prepare would have left it in, in this transaction, with no
-- notification of due work. The caller sends that command next, as after any prepare.
-- Otherwise the next step is made ready and due, as without these arguments.
--
-- Answers the outcome (see the file header) and the run's state when this ended it or
-- moved it on. Every case besides 'written' writes exactly what its outcome says. With
-- chained true, also the next call's lease epoch, the namespace's clock and how many
-- seconds are left until its deadline.
CREATE OR REPLACE FUNCTION {{ns}}.step_settle(
    p_run text, p_step text, p_owner text, p_settle {{ns}}.settle_args,
    p_lease_seconds float8 DEFAULT NULL, p_key_version integer DEFAULT NULL,
    p_nonce bytea DEFAULT NULL, p_ciphertext bytea DEFAULT NULL,
    p_command_key text DEFAULT NULL, p_deadline_seconds integer DEFAULT NULL,
    OUT outcome text, OUT run_state text, OUT chained boolean, OUT lease_epoch bigint,
    OUT now timestamptz, OUT deadline_in float8)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            l record;
            h record;
            v_state text := p_settle.state;
            v_keep boolean := true;
            v_passed integer := coalesce(cardinality(p_settle.passed_ids), 0);
            v_payload bigint;
        BEGIN
            chained := false;
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
                   effect = coalesce(p_settle.effect, effect),
                   cause = NULL, cause_status = NULL,
                   retry_cause = NULL, retry_status = NULL, retry_last_at = NULL,
                   retry_since = NULL, retry_attention_at = NULL,
                   due_at = NULL,
                   ended_at = {{ns}}.now(),
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE run_id = p_run AND step_id = p_step;
            IF {{ns}}.step_wants_attention(l.state, l.cause) THEN
                PERFORM {{ns}}.run_attention_recompute(p_run);
            END IF;
            IF v_keep AND coalesce(cardinality(p_settle.purposes), 0) > 0 THEN
                INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce,
                                            ciphertext)
                SELECT p_run, p_step, x.purpose, x.key_version, x.nonce, x.ciphertext
                  FROM unnest(p_settle.purposes, p_settle.key_versions, p_settle.nonces,
                              p_settle.ciphertexts)
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
                VALUES (p_run, p_settle.passed_ids[1], l.seq + 1, p_settle.passed_types[1],
                        'ready', {{ns}}.now());
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
                  FROM unnest(p_settle.passed_ids, p_settle.passed_types)
                       WITH ORDINALITY AS x(step_id, step_type, n);
            END IF;
            IF p_settle.next_step IS NOT NULL AND p_command_key IS NOT NULL
               AND p_settle.next_type = 'call' THEN
                SELECT x.epoch, x.execution_hold INTO h FROM {{ns}}.hold x;
                chained := NOT h.execution_hold;
            END IF;
            IF chained THEN
                -- the payload first: the step names it
                INSERT INTO {{ns}}.payload (run_id, step_id, purpose, key_version, nonce,
                                            ciphertext)
                VALUES (p_run, p_settle.next_step, 'command', p_key_version, p_nonce,
                        p_ciphertext)
                RETURNING id INTO v_payload;
                INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at,
                                         command_payload_id, command_key, prepared_at,
                                         first_attempt_at, deadline_at, attempts,
                                         lease_owner, lease_expires_at, lease_epoch)
                VALUES (p_run, p_settle.next_step, l.seq + v_passed + 1, 'call', 'prepared',
                        {{ns}}.now(), v_payload, p_command_key, {{ns}}.now(), {{ns}}.now(),
                        {{ns}}.now() + make_interval(secs => p_deadline_seconds), 1,
                        p_owner, {{ns}}.now() + make_interval(secs => p_lease_seconds),
                        h.epoch);
                lease_epoch := h.epoch;
                now := {{ns}}.now();
                deadline_in := p_deadline_seconds;
            ELSIF p_settle.next_step IS NOT NULL THEN
                INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
                VALUES (p_run, p_settle.next_step, l.seq + v_passed + 1, p_settle.next_type,
                        'ready', {{ns}}.now());
            END IF;
            IF p_settle.next_step IS NOT NULL THEN
                UPDATE {{ns}}.run
                   SET state = 'running', updated_at = {{ns}}.now()
                 WHERE id = p_run;
                run_state := 'running';
            ELSE
                UPDATE {{ns}}.run
                   SET state = CASE WHEN cancelling THEN 'cancelled'
                                    ELSE p_settle.run_state END,
                       outcome = p_settle.outcome,
                       failure_kind = CASE WHEN cancelling THEN NULL
                                           ELSE p_settle.failure_kind END,
                       failure_path = CASE WHEN cancelling THEN NULL
                                           ELSE p_settle.failure_path END,
                       failure_step = CASE WHEN cancelling OR p_settle.failure_kind IS NULL
                                           THEN NULL ELSE p_step END,
                       ended_at = {{ns}}.now(),
                       updated_at = {{ns}}.now()
                 WHERE id = p_run
                RETURNING state INTO run_state;
            END IF;
        END
    $$;

-- Operator mode's step_leased: lock the run row, then step p_step's, and say whether the
-- step is still version p_version (its xmin as text, read by the operator's action before
-- it decided) and held by no dispatcher: verdict 'ours', or 'changed'. With 'ours' it also
-- answers how the run stands.
CREATE OR REPLACE FUNCTION {{ns}}.step_checked(
    p_run text, p_step text, p_version text,
    OUT verdict text, OUT abandoned boolean, OUT run_ended boolean, OUT state text,
    OUT cause text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            r record;
            s record;
        BEGIN
            verdict := 'changed';
            SELECT x.cancelling, x.cancel_seq, x.ended_at INTO r
              FROM {{ns}}.run x WHERE x.id = p_run
               FOR NO KEY UPDATE;
            IF NOT FOUND THEN
                RETURN;
            END IF;
            SELECT x.seq, x.state, x.cause, x.lease_owner, x.xmin::text AS version INTO s
              FROM {{ns}}.step x WHERE x.run_id = p_run AND x.step_id = p_step
               FOR UPDATE;
            IF NOT FOUND OR s.version IS DISTINCT FROM p_version
               OR s.lease_owner IS NOT NULL THEN
                RETURN;
            END IF;
            verdict := 'ours';
            abandoned := {{ns}}.step_abandoned(r.cancelling, r.cancel_seq, s.seq);
            run_ended := r.ended_at IS NOT NULL;
            state := s.state;
            cause := s.cause;
        END
    $$;

-- The state of run p_run while it goes on: held while one of its steps is uncertain (an
-- operator has to decide it first), running otherwise. The one place this rule is
-- written; an operator's settle and retry-same both ask it.
CREATE OR REPLACE FUNCTION {{ns}}.run_live_state(p_run text) RETURNS text
    LANGUAGE sql STABLE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT CASE
                   WHEN EXISTS (SELECT 1 FROM {{ns}}.step x
                                 WHERE x.run_id = p_run AND x.state = 'uncertain')
                   THEN 'held' ELSE 'running'
               END
    $$;

-- An operator settles step p_step of run p_run, read as version p_version: step_settle in
-- operator mode, with the same p_settle. The step's effect becomes exactly
-- p_settle.effect (null: none is known) and its cause is cleared, the operator holds the
-- step's lease for the rest of this call (so the same checks apply), and step_settle ends
-- the step and moves the run on or ends it; its outcome says which (abandoned or
-- run-ended: the step alone). A run that goes on while another of its steps is still
-- uncertain stays held. Outcome changed when the step is not the version read.
CREATE OR REPLACE FUNCTION {{ns}}.step_operator_settle(
    p_run text, p_step text, p_version text, p_settle {{ns}}.settle_args,
    OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            c record;
        BEGIN
            SELECT * INTO c FROM {{ns}}.step_checked(p_run, p_step, p_version);
            IF c.verdict <> 'ours' THEN
                outcome := c.verdict;
                RETURN;
            END IF;
            SELECT x.outcome, x.run_state INTO outcome, run_state
              FROM {{ns}}.step_operator_end(p_run, p_step, p_settle) x;
        END
    $$;

-- The writes of step_operator_settle once step_checked found the step as the operator read
-- it (and locked it): step_operator_not_sent calls it too, after its own check.
CREATE OR REPLACE FUNCTION {{ns}}.step_operator_end(
    p_run text, p_step text, p_settle {{ns}}.settle_args,
    OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            v_owner text := 'operator ' || txid_current();
        BEGIN
            UPDATE {{ns}}.step x
               SET effect = p_settle.effect, cause = NULL, cause_status = NULL,
                   lease_owner = v_owner,
                   lease_epoch = (SELECT h.epoch FROM {{ns}}.hold h),
                   lease_expires_at = {{ns}}.now()
             WHERE x.run_id = p_run AND x.step_id = p_step;
            -- (the effect just written stays: step_settle keeps it for a null, and writes
            -- the same one again otherwise)
            SELECT x.outcome, x.run_state INTO outcome, run_state
              FROM {{ns}}.step_settle(p_run, p_step, v_owner, p_settle) x;
            IF run_state = 'running' AND {{ns}}.run_live_state(p_run) = 'held' THEN
                UPDATE {{ns}}.run u
                   SET state = 'held', updated_at = {{ns}}.now()
                 WHERE u.id = p_run;
                run_state := 'held';
            END IF;
        END
    $$;

-- The product proved it never received the command of step p_step of run p_run (read as
-- version p_version): nothing was done. The step is not-sent, due never, for an operator
-- to retry the same command or cancel; the run stays as it is and keeps its attention
-- (outcome written). When the run no longer goes on from the step (a cancel abandoned it:
-- abandoned; the run ended: run-ended) there is nothing left to decide, and it ends
-- cancelled, with no effect, as step_operator_settle ends it. Outcome changed when the
-- step is not the version read.
CREATE OR REPLACE FUNCTION {{ns}}.step_operator_not_sent(
    p_run text, p_step text, p_version text, OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            c record;
            v_end {{ns}}.settle_args;  -- nothing kept, nothing follows, no effect
        BEGIN
            SELECT * INTO c FROM {{ns}}.step_checked(p_run, p_step, p_version);
            IF c.verdict <> 'ours' THEN
                outcome := c.verdict;
                RETURN;
            ELSIF c.abandoned OR c.run_ended THEN
                v_end.state := 'cancelled';
                SELECT x.outcome, x.run_state INTO outcome, run_state
                  FROM {{ns}}.step_operator_end(p_run, p_step, v_end) x;
                RETURN;
            END IF;
            UPDATE {{ns}}.step x
               SET state = 'not-sent', effect = NULL, due_at = NULL, cause = NULL,
                   cause_status = NULL, updated_at = {{ns}}.now()
             WHERE x.run_id = p_run AND x.step_id = p_step;
            PERFORM {{ns}}.run_attention_recompute(p_run);
            outcome := 'written';
        END
    $$;

-- An operator resends the command of step p_step of run p_run (read as version p_version,
-- uncertain or not-sent): the step is ready and due now with its stored command and key,
-- its effect and cause as they were, so a dispatcher sends exactly that command again; the
-- run is running (held while another of its steps is uncertain) and its attention follows
-- its steps. Answers the step's attempts so far. Nothing is written when the execution
-- hold is set (outcome held: the hold row is share-locked first, so a restore-hold waits
-- for this and then finds the ready step), the run has ended (run-ended), a cancel
-- abandoned the step (abandoned), or the step is not the version read (changed).
CREATE OR REPLACE FUNCTION {{ns}}.step_retry_same(
    p_run text, p_step text, p_version text, OUT outcome text, OUT attempts integer)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            c record;
        BEGIN
            IF (SELECT h.execution_hold FROM {{ns}}.hold h FOR SHARE) THEN
                outcome := 'held';
                RETURN;
            END IF;
            SELECT * INTO c FROM {{ns}}.step_checked(p_run, p_step, p_version);
            IF c.verdict <> 'ours' THEN
                outcome := c.verdict;
                RETURN;
            ELSIF c.run_ended THEN
                outcome := 'run-ended';
                RETURN;
            ELSIF c.abandoned THEN
                outcome := 'abandoned';
                RETURN;
            END IF;
            UPDATE {{ns}}.step x
               SET state = 'ready', due_at = {{ns}}.now(),
                   lease_owner = NULL, lease_expires_at = NULL, lease_epoch = NULL,
                   updated_at = {{ns}}.now()
             WHERE x.run_id = p_run AND x.step_id = p_step
            RETURNING x.attempts INTO attempts;
            UPDATE {{ns}}.run u
               SET state = {{ns}}.run_live_state(u.id), updated_at = {{ns}}.now()
             WHERE u.id = p_run;
            PERFORM {{ns}}.run_attention_recompute(p_run);
            outcome := 'written';
        END
    $$;

-- An operator cancels run p_run, whose workflow's onCancel step is p_on_cancel, of type
-- p_on_cancel_type (null: it has none). The steps that wait to be worked on and that no
-- dispatcher holds end cancelled: ready, waiting (the wait is abandoned) and not-sent; a
-- step that sent nothing, or was retrying, loses that cause (and its record of retries)
-- with its end. A leased step is settled by its dispatcher, which finds it abandoned; an
-- uncertain step stays uncertain, and its run keeps the attention. With an onCancel step
-- (unless the run already reached a step of that name: a path is never entered twice) that
-- step is due now, numbered after every step the run has, the run records that number as
-- its cancel_seq and is running along it. Without one, the run ends cancelled once nothing of it is live
-- (run_close_cancelled). A run already cancelling is only closed when nothing of it is
-- live any more. Answers run_state cancelled when the run ended, cancelling otherwise;
-- outcome run-ended (nothing written) when the run had ended already.
CREATE OR REPLACE FUNCTION {{ns}}.run_cancel(
    p_run text, p_on_cancel text, p_on_cancel_type text,
    OUT outcome text, OUT run_state text)
    LANGUAGE plpgsql SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            r record;
            v_cancel_seq integer;
        BEGIN
            SELECT x.cancelling, x.ended_at INTO r
              FROM {{ns}}.run x WHERE x.id = p_run
               FOR NO KEY UPDATE;
            IF NOT FOUND OR r.ended_at IS NOT NULL THEN
                outcome := 'run-ended';
                RETURN;
            END IF;
            IF NOT r.cancelling THEN
                UPDATE {{ns}}.step x
                   SET state = 'cancelled',
                       cause = CASE WHEN {{ns}}.ready_attention(x.cause) THEN NULL
                                    ELSE x.cause END,
                       retry_cause = NULL, retry_status = NULL, retry_last_at = NULL,
                       retry_since = NULL, retry_attention_at = NULL,
                       due_at = NULL, ended_at = {{ns}}.now(), updated_at = {{ns}}.now()
                 WHERE x.run_id = p_run
                   AND x.state IN ('ready', 'waiting', 'not-sent')
                   AND x.lease_owner IS NULL;
                IF p_on_cancel IS NOT NULL THEN
                    INSERT INTO {{ns}}.step (run_id, step_id, seq, step_type, state, due_at)
                    SELECT p_run, p_on_cancel,
                           (SELECT coalesce(max(x.seq), 0) + 1
                              FROM {{ns}}.step x WHERE x.run_id = p_run),
                           p_on_cancel_type, 'ready', {{ns}}.now()
                    ON CONFLICT (run_id, step_id) DO NOTHING
                    RETURNING seq INTO v_cancel_seq;
                END IF;
                UPDATE {{ns}}.run u
                   SET cancelling = true, cancel_seq = v_cancel_seq,
                       state = CASE WHEN v_cancel_seq IS NOT NULL THEN 'running'
                                    ELSE u.state END,
                       updated_at = {{ns}}.now()
                 WHERE u.id = p_run;
            END IF;
            PERFORM {{ns}}.run_attention_recompute(p_run);
            outcome := 'written';
            run_state := CASE WHEN {{ns}}.run_close_cancelled(p_run, NULL) THEN 'cancelled'
                              ELSE 'cancelling' END;
        END
    $$;

-- Commit the command of call step p_step of run p_run, leased to p_owner, as prepared,
-- before a byte of it is sent: the stored command p_payload of an earlier attempt, or else
-- the sealed command given (state key version p_key_version, nonce p_nonce, ciphertext
-- p_ciphertext with its GCM tag), stored here. It is sent under command key p_command_key,
-- and the step's deadline is set at the first attempt, p_deadline_seconds from now. The
-- attempt is counted. A step that sent nothing before for a cause an operator had to see
-- (sent_nothing: a refused token, a failed TLS verification), or that had been retrying
-- for too long (retrying), is on its way now: that cause is cleared and the run's
-- attention recomputed without it. The record of its last retry goes too (the series it
-- belongs to stays, until an answer that is not retryable ends it).
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
                SELECT x.outcome INTO outcome
                  FROM {{ns}}.step_end_cancelled(p_run, p_step, p_owner) x;
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
                   cause = CASE WHEN {{ns}}.ready_attention(l.cause) THEN NULL
                                ELSE s.cause END,
                   retry_cause = NULL, retry_status = NULL, retry_last_at = NULL,
                   retry_attention_at = NULL,
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
            IF {{ns}}.ready_attention(l.cause) THEN
                PERFORM {{ns}}.run_attention_recompute(p_run);
            END IF;
            outcome := 'written';
        END
    $$;
