-- Registry Coordinator state schema, version 4.
--
-- This file is the whole layout of one deployment's namespace. `apply` creates the schema
-- (owned by the migration role) and runs this file inside one transaction with every
-- `{{ns}}` replaced by the namespace as a quoted identifier; the namespace was first matched
-- against ^coordinator_[a-z0-9_]+$, so the substitution cannot smuggle SQL. The same file is
-- what the drift check compares an installed namespace with, so every object of version 4 is
-- declared here and nowhere else. Grants are not part of it: core/db/roles.py gives each
-- component role its privileges after the objects exist.
--
-- Time. Every default and every query that asks "what time is it" calls {{ns}}.now(), never
-- the built-in now(). It answers the setting `coordinator.fake_now` when a session set one,
-- and the wall clock otherwise, so tests of leases, timers and retention move time instead
-- of sleeping. Production never sets it. The wall clock is read as statement_timestamp():
-- the instant the statement arrived, the same for every row it touches. Being STABLE (as
-- clock_timestamp() is not), it lets the planner inline the function into each query and
-- compare it with an index, instead of running it as a function call per row.
--
-- Tables, in the order they are created:
--
-- schema_version    One row: the layout version of this namespace (4). `apply` refuses an
--                   earlier one with deployment.schema-too-old and the service refuses any
--                   version but 4.
-- deployment        One row: the deployment's durable identity (databaseId), the migration
--                   role that installed it, and the activation serial that every apply
--                   raising a change to the active packages increments. Services remember
--                   the serial they started with.
-- package           Every package ever activated, by digest, with its manifest and workflow
--                   source bytes. Runs point here, so a run keeps its definition after its
--                   workflow was upgraded or removed and after the package folder is gone.
-- activation        The active package of each workflow id (at most one per id).
-- key_custody       The custody fingerprint of each state key version and of the admission
--                   key, recorded by apply the first time it sees each key; startup and
--                   deployment-status compare the configured keys with these rows.
-- audit_segment     One row per audit journal segment: the audit key fingerprint the segment
--                   was written with and where it starts. Owned by auditd.
-- run               One start of a workflow: principal, client, package digest, state,
--                   outcome, attention, failure, cancelling flag and timings. Rows are
--                   never deleted; retention erases payloads and stamps erased_at.
-- payload           Every encrypted value a run produces (input or event body, prepared
--                   command, product response, mapped output, wait result): AES-256-GCM
--                   ciphertext, its 96-bit nonce and the state key version. Retention
--                   deletes these rows; nothing else holds a plaintext copy.
-- binding           Per run and connection the settings the run depends on: endpoint,
--                   client identity, issuer, scopes, audience, profile and producer.
--                   Startup compares live runs' bindings with the runtime file.
-- step              One row per step a run has reached: type, state, attempts, the prepared
--                   command (payload reference and command key), its effect and why it is
--                   unknown, what its last retried attempt met, the lease of the dispatcher
--                   working on it, when it is due, and a wait's timing. Dispatch reads the
--                   partial index of due, unclaimed work only.
-- start_identity    The keyed start identity (HMAC with the admission key) of every run whose
--                   payloads still exist, with a keyed digest of its input to tell a
--                   repeated start from a conflicting one.
-- tombstone         Spent start identities and command keys of erased runs: a later start
--                   with such an identity is refused, and no command key is ever reused.
-- hold              One row: the execution hold and the admission hold, and the hold epoch
--                   that each restore-hold raises; a lease taken in an older epoch cannot
--                   advance its step.
-- recovery_record   One row per restore-hold: the operator's references and attestations
--                   and when each later step of the restore procedure happened.
-- restore_snapshot  The steps a restore-hold found possibly sent after the backup, and how
--                   each was settled; release-restore-hold waits for all of them.
-- operator_action   The log of operator actions (kind, reason, time), per run where the
--                   action concerns one.
-- token_refusal     The dispatcher's last refused token request per connection (the
--                   issuer's short error code and when), for doctor; a granted token
--                   deletes the connection's row.
--
-- Rules. Three small functions name what several statements must agree on, so that each is
-- written once: sent_nothing(cause), the causes a step carries although nothing of it was
-- sent; ready_attention(cause), the causes a ready call asks for attention with until it
-- next prepares or ends (those, and retrying); and step_wants_attention(state, cause),
-- whether a step makes its run ask for attention. All are plain IMMUTABLE expressions the
-- planner inlines into each query, so they cost what writing them out would and leave every
-- plan as readable as before. The rules each row of the hot tables keeps are another
-- matter: they are one CHECK per table calling a plpgsql function (run_rules, payload_rules,
-- step_rules; step_rules says why), which names the rule a row breaks.
--
-- Retries in sight. A call that keeps getting answers that say "not processed, try later"
-- (no connection made, a failed TLS verification, no token, 429, 503) is ready again after
-- each, and records what its last attempt met (retry_cause, retry_status, retry_last_at)
-- until it next prepares or ends: inspection shows it, doctor counts it. retry_since is
-- when the first retryable answer of the unbroken series came (kept from attempt to
-- attempt; cleared when the step ends or its effect becomes unknown), and
-- retry_attention_at the instant the series has lasted
-- deployment.attention.retryingAfterSeconds, when the run is to ask for attention. The step
-- then takes the cause retrying: from the retry that finds that instant passed, or from the
-- dispatcher's once-a-second sweep through step_retrying. Like the sent_nothing causes, it
-- is cleared, and the run's attention recomputed, when the command is next prepared or the
-- step ends.
--
-- Notifications. Three channels named after the namespace carry no payload: `<ns>_due`
-- whenever a step becomes due and unclaimed (idle dispatchers wake on it instead of polling),
-- `<ns>_hold` whenever the holds change, and `<ns>_activation` whenever the activation serial
-- changes.
--
-- Hot tables (run, step, hold, deployment) leave room in each page (fillfactor) so their
-- frequent updates stay heap-only. Indexes on live work are partial, so ended runs do not
-- weigh on the queries that dispatch, hold and list live work.

CREATE FUNCTION {{ns}}.now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT coalesce(
            nullif(current_setting('coordinator.fake_now', true), '')::timestamptz,
            statement_timestamp())
    $$;

-- The causes of a step that sent nothing and cannot until someone mends what stood in the
-- way: the issuer refused the connection's token (or granted narrower scopes), token-refused,
-- or a product or the issuer failed TLS verification, tls-refused. Such a step waits, ready,
-- to try again until its deadline, and its run asks for attention meanwhile (CONTRACT §8.4).
-- The step table's rules (step_rules) read this list too: a cause added here is one an
-- unknown effect need not explain.
CREATE FUNCTION {{ns}}.sent_nothing(cause text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
        SELECT cause IN ('token-refused', 'tls-refused')
    $$;

-- The causes a ready call asks for attention with until it next prepares or ends: those of
-- sending nothing, and retrying (it has kept getting retryable answers for longer than
-- deployment.attention.retryingAfterSeconds).
CREATE FUNCTION {{ns}}.ready_attention(cause text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
        SELECT {{ns}}.sent_nothing(cause) OR cause = 'retrying'
    $$;

-- Whether a step in state with cause makes its run ask for attention: its effect is unknown
-- (uncertain), the product proved the command never arrived and an operator retries or
-- cancels (not-sent), or it waits, ready, on what only an operator can mend (sent_nothing)
-- or after retrying for too long (both ready_attention).
-- Every statement that recomputes run.attention from the run's steps asks this.
CREATE FUNCTION {{ns}}.step_wants_attention(state text, cause text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
        SELECT state IN ('uncertain', 'not-sent')
               OR (state = 'ready' AND {{ns}}.ready_attention(cause))
    $$;

CREATE TABLE {{ns}}.schema_version (
    version      integer PRIMARY KEY CHECK (version > 0),
    installed_at timestamptz NOT NULL DEFAULT {{ns}}.now()
);

CREATE TABLE {{ns}}.deployment (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    database_id       uuid NOT NULL,
    migration_role    name NOT NULL,
    activation_serial bigint NOT NULL DEFAULT 0 CHECK (activation_serial >= 0),
    activated_at      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT {{ns}}.now()
) WITH (fillfactor = 50);

CREATE TABLE {{ns}}.package (
    digest      text PRIMARY KEY CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    workflow_id text NOT NULL CHECK (workflow_id ~ '^[a-z][a-z0-9-]{0,62}$'),
    version     text NOT NULL,
    manifest    bytea NOT NULL,
    source      bytea NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT {{ns}}.now(),
    UNIQUE (digest, workflow_id)
);

CREATE TABLE {{ns}}.activation (
    workflow_id      text PRIMARY KEY,
    digest           text NOT NULL,
    activated_serial bigint NOT NULL CHECK (activated_serial > 0),
    activated_at     timestamptz NOT NULL DEFAULT {{ns}}.now(),
    FOREIGN KEY (digest, workflow_id) REFERENCES {{ns}}.package (digest, workflow_id)
);

CREATE TABLE {{ns}}.key_custody (
    key_kind    text NOT NULL CHECK (key_kind IN ('state', 'admission')),
    -- the state key version; 0 for the admission key, which has no versions
    key_version integer NOT NULL,
    fingerprint text NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    recorded_at timestamptz NOT NULL DEFAULT {{ns}}.now(),
    PRIMARY KEY (key_kind, key_version),
    CHECK ((key_kind = 'state' AND key_version > 0)
           OR (key_kind = 'admission' AND key_version = 0))
);

CREATE TABLE {{ns}}.audit_segment (
    segment     integer PRIMARY KEY CHECK (segment > 0),
    fingerprint text NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    first_seq   bigint NOT NULL CHECK (first_seq > 0),
    started_at  timestamptz NOT NULL DEFAULT {{ns}}.now()
);

CREATE TABLE {{ns}}.run (
    id             text PRIMARY KEY,
    workflow_id    text NOT NULL,
    package_digest text NOT NULL,
    principal_iss  text NOT NULL,
    principal_sub  text NOT NULL,
    -- the verified client_id of the starting token; null for runs started by signed events
    client_id      text,
    -- running, waiting or held; succeeded, failed or cancelled once it ended
    state          text NOT NULL DEFAULT 'running',
    outcome        text,
    attention      boolean NOT NULL DEFAULT false,
    -- when attention last began (the oldest-first attention list's order); null without
    -- attention. Kept by the run_attention_since triggers (and tied to attention by run_rules):
    -- no statement writes it.
    attention_since timestamptz,
    cancelling     boolean NOT NULL DEFAULT false,
    -- a cancel with onCancel: the seq of the onCancel step. Steps before it are abandoned
    -- (their answers still settle them, but never lead on); null without such a path
    cancel_seq     integer,
    failure_kind   text,
    -- a JSON pointer into the command or the output mapping, never a value
    failure_path   text,
    failure_step   text,
    created_at     timestamptz NOT NULL DEFAULT {{ns}}.now(),
    updated_at     timestamptz NOT NULL DEFAULT {{ns}}.now(),
    ended_at       timestamptz,
    erased_at      timestamptz,
    FOREIGN KEY (package_digest, workflow_id) REFERENCES {{ns}}.package (digest, workflow_id)
) WITH (fillfactor = 80);

-- The rules every run row keeps, one CHECK calling this function for the reason step_rules
-- (below) gives.
CREATE FUNCTION {{ns}}.run_rules(r {{ns}}.run) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            broken text;
        BEGIN
            broken := CASE
                WHEN NOT (r.id ~ '^[A-Za-z0-9_-]{1,64}$') THEN 'id is 1 to 64 id characters'
                WHEN NOT (r.state IN ('running', 'waiting', 'held', 'succeeded', 'failed',
                                      'cancelled')) THEN 'state is a run state'
                WHEN NOT (r.cancel_seq > 0) THEN 'cancel_seq > 0'
                WHEN NOT (r.failure_kind IN ('invalid-command', 'mapping-invalid', 'refused',
                                             'deadline-exceeded'))
                    THEN 'failure_kind is a failure kind'
                WHEN NOT ((r.state IN ('succeeded', 'failed', 'cancelled'))
                          = (r.ended_at IS NOT NULL))
                    THEN 'a run has ended_at exactly when it ended'
                WHEN NOT (r.state <> 'succeeded' OR r.outcome IS NOT NULL)
                    THEN 'a run that succeeded has an outcome'
                WHEN NOT (r.failure_kind IS NULL OR r.state = 'failed')
                    THEN 'only a failed run has a failure'
                WHEN NOT (r.erased_at IS NULL OR r.ended_at IS NOT NULL)
                    THEN 'only an ended run is erased'
                WHEN NOT (r.cancel_seq IS NULL OR r.cancelling)
                    THEN 'cancel_seq belongs to a cancelling run'
                WHEN NOT ((r.attention_since IS NOT NULL) = r.attention)
                    THEN 'attention_since is set exactly with attention'
            END;
            IF broken IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'check_violation', TABLE = 'run',
                    MESSAGE = 'a run row breaks the rule: ' || broken;
            END IF;
            RETURN true;
        END
    $$;

ALTER TABLE {{ns}}.run ADD CONSTRAINT run_rules CHECK ({{ns}}.run_rules(run));

-- list: newest first, with (created_at, id) as the cursor
CREATE INDEX run_newest ON {{ns}}.run (created_at DESC, id DESC);
-- a non-operator's list: only its principal's runs
CREATE INDEX run_principal
    ON {{ns}}.run (principal_iss, principal_sub, created_at DESC, id DESC);
-- live runs by state and workflow: --remove-workflow, live bindings, doctor's and the
-- metrics' bounded counts. Its predicate
-- names the live states rather than "ended_at IS NULL" (the same rows, by run_rules above)
-- so that only a statement asking for live runs by state can use it: a look-up of one run
-- by id that also says "ended_at IS NULL" must never be planned through it, which statistics
-- taken while no run was live (the index looked empty) once made the planner do, reading
-- every live run per look-up.
CREATE INDEX run_live ON {{ns}}.run (state, workflow_id)
    WHERE state IN ('running', 'waiting', 'held');
-- ended runs by state: the bounded counts of doctor and the metrics (run_live has the live)
CREATE INDEX run_ended ON {{ns}}.run (state)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
-- list --attention true
CREATE INDEX run_attention ON {{ns}}.run (created_at DESC, id DESC) WHERE attention;
-- list --attention true --order oldest: the runs waiting longest for an operator first
CREATE INDEX run_attention_oldest ON {{ns}}.run (attention_since, id) WHERE attention;
-- list --state held: held runs by creation (run_live would hand over every held run to sort)
CREATE INDEX run_held ON {{ns}}.run (created_at DESC, id DESC) WHERE state = 'held';
-- retention: ended runs whose payloads still exist
CREATE INDEX run_erasable ON {{ns}}.run (ended_at) WHERE ended_at IS NOT NULL AND erased_at IS NULL;

CREATE TABLE {{ns}}.payload (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      text NOT NULL REFERENCES {{ns}}.run (id),
    -- null for the run's own input or event body, else the step the value belongs to
    step_id     text,
    -- input, event, command, response, output or wait-result
    purpose     text NOT NULL,
    key_version integer NOT NULL,
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT {{ns}}.now(),
    UNIQUE NULLS NOT DISTINCT (run_id, step_id, purpose)
);

-- The rules every payload row keeps, one CHECK calling this function for the reason
-- step_rules (below) gives. It takes the columns it reads rather than the row, which
-- would copy the ciphertext.
CREATE FUNCTION {{ns}}.payload_rules(
    step_id text, purpose text, key_version integer, nonce bytea) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            broken text;
        BEGIN
            broken := CASE
                WHEN NOT (purpose IN ('input', 'event', 'command', 'response', 'output',
                                      'wait-result')) THEN 'purpose is a purpose'
                WHEN NOT (key_version > 0) THEN 'key_version > 0'
                WHEN NOT (octet_length(nonce) = 12) THEN 'a nonce has 12 bytes'
                WHEN NOT ((step_id IS NULL) = (purpose IN ('input', 'event')))
                    THEN 'only an input or an event belongs to no step'
            END;
            IF broken IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'check_violation', TABLE = 'payload',
                    MESSAGE = 'a payload row breaks the rule: ' || broken;
            END IF;
            RETURN true;
        END
    $$;

ALTER TABLE {{ns}}.payload ADD CONSTRAINT payload_rules
    CHECK ({{ns}}.payload_rules(step_id, purpose, key_version, nonce));

-- the state key versions still referenced (custody checks walk this index, not the table)
CREATE INDEX payload_key_version ON {{ns}}.payload (key_version);

CREATE TABLE {{ns}}.binding (
    run_id          text NOT NULL REFERENCES {{ns}}.run (id),
    connection      text NOT NULL,
    connection_type text NOT NULL CHECK (connection_type IN (
                        'casework-review-producer', 'messaging', 'scheduling', 'breg-action')),
    base_url        text NOT NULL,
    client_id       text NOT NULL,
    issuer          text NOT NULL,
    scopes          text[] NOT NULL,
    audience        text NOT NULL,
    profile         text NOT NULL,
    -- Casework only: the key under the project's trustedProducers
    producer        text,
    PRIMARY KEY (run_id, connection)
);

CREATE TABLE {{ns}}.step (
    run_id             text NOT NULL REFERENCES {{ns}}.run (id),
    step_id            text NOT NULL,
    -- the order in which the run reached its steps
    seq                integer NOT NULL,
    -- call, choose, wait-until, wait-for or finish
    step_type          text NOT NULL,
    -- ready: to be worked on when due; prepared: the command is committed and may have been
    -- sent; waiting: a timer or a product result; uncertain: the effect is unknown and the
    -- run is held; not-sent: a receipt check proved the command never arrived; the rest end
    -- the step.
    state              text NOT NULL DEFAULT 'ready',
    attempts           integer NOT NULL DEFAULT 0,
    -- accepted or unknown; null while no command was sent
    effect             text,
    -- why the effect is unknown, for an operator: how the answer went missing (no answer
    -- after the request was written, the connection lost, a 5xx, an answer that could not
    -- be read, broke HTTP/1.1 framing or was too large), the dispatcher holding the
    -- prepared command stopped (lease-expired), or a restore-hold snapshotted the step
    -- (restore-snapshot). token-refused and tls-refused are the causes of a step that sent
    -- nothing (sent_nothing above): the issuer refused the connection's token, or a product
    -- or the issuer failed TLS verification, and the step is ready to try again; they are
    -- cleared when the step next prepares or ends, as retrying is (a ready call that has
    -- kept getting retryable answers for too long: "Retries in sight" above). The others
    -- are kept while an operator settles the step and the effect stays unknown, and
    -- cleared when it becomes known or the dispatcher records a fresh outcome. Names no
    -- URL, header, body or value.
    cause              text,
    -- status-5xx only: the status the product answered
    cause_status       integer,
    command_payload_id bigint REFERENCES {{ns}}.payload (id) ON DELETE SET NULL,
    -- the idempotency key every attempt of this call sends
    command_key        text,
    prepared_at        timestamptz,
    first_attempt_at   timestamptz,
    deadline_at        timestamptz,
    -- when this step is next to be worked on; null while nothing is to be done
    due_at             timestamptz,
    lease_owner        text,
    lease_expires_at   timestamptz,
    -- the hold epoch the lease was taken in
    lease_epoch        bigint,
    -- wait-for: keyed digest of the awaited result's identity, to match completion events
    wait_match         bytea,
    next_check_at      timestamptz,
    timeout_at         timestamptz,
    checks             integer NOT NULL DEFAULT 0,
    -- a ready call waiting for its next automatic attempt ("Retries in sight" above): what
    -- its last attempt met, the product's status when one answered, and when
    retry_cause        text,
    retry_status       integer,
    retry_last_at      timestamptz,
    -- the first retryable answer of the unbroken series, and when the series makes the run
    -- ask for attention (null once the step has the cause retrying, or while it has another
    -- that asks for it)
    retry_since        timestamptz,
    retry_attention_at timestamptz,
    started_at         timestamptz NOT NULL DEFAULT {{ns}}.now(),
    updated_at         timestamptz NOT NULL DEFAULT {{ns}}.now(),
    ended_at           timestamptz,
    PRIMARY KEY (run_id, step_id),
    UNIQUE (run_id, seq)
) WITH (fillfactor = 70);

-- dispatch: due work nobody holds; ended runs have no due steps, so they never enter it
CREATE INDEX step_due ON {{ns}}.step (due_at) WHERE due_at IS NOT NULL AND lease_owner IS NULL;
-- dispatch: leases to be found expired
CREATE INDEX step_leased ON {{ns}}.step (lease_expires_at) WHERE lease_owner IS NOT NULL;
-- doctor, restore-hold and retention: uncertain steps
CREATE INDEX step_uncertain ON {{ns}}.step (run_id) WHERE state = 'uncertain';
-- list --step / --cause, and the step each listed run needs attention for: the steps that
-- need attention, by run. A list walks its runs in order and asks this index about each
-- one (run first: with the step first, a plan made from statistics that saw no such step
-- walked the whole index for every run of a page)
CREATE INDEX step_attention ON {{ns}}.step (run_id, step_id, cause)
    WHERE {{ns}}.step_wants_attention(state, cause);
-- doctor's retrying (every call waiting for its next automatic attempt), and the
-- dispatcher's sweep for a series of retries that has come to ask for attention
-- (retry_attention_at passed)
-- (state is named, though the CHECKs above imply it, so that a plan made without statistics
-- sees a small part of the table here, as it does for step_uncertain)
CREATE INDEX step_retrying ON {{ns}}.step (retry_attention_at)
    WHERE state = 'ready' AND retry_cause IS NOT NULL;
-- completion events: the waiting step awaiting this result
CREATE INDEX step_wait_match ON {{ns}}.step (wait_match)
    WHERE state = 'waiting' AND wait_match IS NOT NULL;
-- a command key belongs to one step, ever
CREATE UNIQUE INDEX step_command_key ON {{ns}}.step (command_key) WHERE command_key IS NOT NULL;

-- The rules every step row keeps. They are one CHECK calling this function rather than
-- a CHECK per rule: PostgreSQL rebuilds a table's CHECK expressions from their stored
-- text for every statement that writes the table, which for these twenty rules cost four
-- times the update itself (about 84 µs a statement, measured for issue 43), while a
-- plpgsql function is compiled once per connection. A broken rule raises check_violation
-- naming the rule, never a value. (NOT of a null is null, so a rule that reads a null
-- holds, as a CHECK's would.)
CREATE FUNCTION {{ns}}.step_rules(s {{ns}}.step) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        DECLARE
            broken text;
        BEGIN
            broken := CASE
                WHEN NOT (s.seq > 0) THEN 'seq > 0'
                WHEN NOT (s.step_type IN ('call', 'choose', 'wait-until', 'wait-for',
                                          'finish')) THEN 'step_type is a step type'
                WHEN NOT (s.state IN ('ready', 'prepared', 'waiting', 'uncertain', 'not-sent',
                                      'completed', 'refused', 'failed', 'cancelled'))
                    THEN 'state is a step state'
                WHEN NOT (s.attempts >= 0) THEN 'attempts >= 0'
                WHEN NOT (s.checks >= 0) THEN 'checks >= 0'
                WHEN NOT (s.effect IN ('accepted', 'unknown')) THEN 'effect is an effect'
                WHEN NOT (s.cause IN ('timeout-after-send', 'connection-lost', 'status-5xx',
                                      'unreadable-answer', 'framing-violation',
                                      'answer-too-large', 'lease-expired', 'restore-snapshot',
                                      'token-refused', 'tls-refused', 'retrying'))
                    THEN 'cause is a cause'
                WHEN NOT (length(s.command_key) BETWEEN 1 AND 255)
                    THEN 'command_key has 1 to 255 characters'
                WHEN NOT (s.retry_cause IN ('never-connected', 'tls-refused', 'token-refused',
                                            'status-429', 'status-503'))
                    THEN 'retry_cause is a retry cause'
                -- a lease has its owner, its expiry and its epoch together
                WHEN NOT ((s.lease_owner IS NULL) = (s.lease_expires_at IS NULL)
                          AND (s.lease_owner IS NULL) = (s.lease_epoch IS NULL))
                    THEN 'a lease has an owner, an expiry and an epoch'
                WHEN NOT (s.due_at IS NULL OR s.state IN ('ready', 'prepared', 'waiting'))
                    THEN 'only a live step is due'
                WHEN NOT (s.step_type = 'call'
                          OR (s.effect IS NULL AND s.command_key IS NULL
                              AND s.command_payload_id IS NULL))
                    THEN 'only a call has a command'
                WHEN NOT (s.state NOT IN ('completed', 'refused', 'failed', 'cancelled')
                          OR s.ended_at IS NOT NULL)
                    THEN 'an ended step has ended_at'
                -- a cause explains an unknown effect, except one of a step that sent
                -- nothing, and retrying (which tells how long a ready call has been tried)
                WHEN NOT (s.cause IS NULL OR {{ns}}.sent_nothing(s.cause)
                          OR s.effect = 'unknown' OR s.cause = 'retrying')
                    THEN 'a cause explains an unknown effect'
                WHEN NOT (s.cause_status IS NULL OR s.cause = 'status-5xx')
                    THEN 'cause_status belongs to status-5xx'
                -- a retry's record belongs to a ready call, the series to one ready or
                -- being sent
                WHEN NOT (s.retry_cause IS NULL
                          OR (s.state = 'ready' AND s.retry_last_at IS NOT NULL
                              AND s.retry_since IS NOT NULL))
                    THEN 'a retry record belongs to a ready call'
                WHEN NOT (s.retry_cause IS NOT NULL
                          OR (s.retry_status IS NULL AND s.retry_last_at IS NULL
                              AND s.retry_attention_at IS NULL))
                    THEN 'a retry record has its cause'
                WHEN NOT (s.retry_since IS NULL OR s.state IN ('ready', 'prepared'))
                    THEN 'a retry series belongs to a ready or prepared call'
                WHEN NOT (s.cause IS DISTINCT FROM 'retrying' OR s.retry_cause IS NOT NULL)
                    THEN 'retrying has a retry record'
            END;
            IF broken IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'check_violation', TABLE = 'step',
                    MESSAGE = 'a step row breaks the rule: ' || broken;
            END IF;
            RETURN true;
        END
    $$;

ALTER TABLE {{ns}}.step ADD CONSTRAINT step_rules CHECK ({{ns}}.step_rules(step));

CREATE TABLE {{ns}}.start_identity (
    identity     text PRIMARY KEY CHECK (identity ~ '^[0-9a-f]{64}$'),
    run_id       text NOT NULL UNIQUE REFERENCES {{ns}}.run (id),
    input_digest text NOT NULL CHECK (input_digest ~ '^[0-9a-f]{64}$'),
    created_at   timestamptz NOT NULL DEFAULT {{ns}}.now()
);

CREATE TABLE {{ns}}.tombstone (
    kind      text NOT NULL CHECK (kind IN ('start-identity', 'command-key')),
    value     text NOT NULL,
    run_id    text NOT NULL REFERENCES {{ns}}.run (id),
    erased_at timestamptz NOT NULL DEFAULT {{ns}}.now(),
    PRIMARY KEY (kind, value)
);

CREATE TABLE {{ns}}.hold (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    execution_hold boolean NOT NULL DEFAULT false,
    admission_hold boolean NOT NULL DEFAULT false,
    epoch          bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    updated_at     timestamptz NOT NULL DEFAULT {{ns}}.now()
) WITH (fillfactor = 50);

CREATE TABLE {{ns}}.recovery_record (
    epoch                         bigint PRIMARY KEY CHECK (epoch > 0),
    restore_reason                text NOT NULL,
    held_at                       timestamptz NOT NULL DEFAULT {{ns}}.now(),
    execution_recovery_reference  text,
    execution_history_complete    boolean,
    execution_deployment_fenced   boolean,
    execution_recovered_at        timestamptz,
    restore_release_reason        text,
    restore_released_at           timestamptz,
    admission_recovery_reference  text,
    admission_history_complete    boolean,
    admission_deployment_fenced   boolean,
    admission_released_at         timestamptz
);

CREATE TABLE {{ns}}.restore_snapshot (
    epoch       bigint NOT NULL REFERENCES {{ns}}.recovery_record (epoch),
    run_id      text NOT NULL,
    step_id     text NOT NULL,
    -- how the operator settled the step; null while unresolved
    resolution  text CHECK (resolution IN ('reconciled', 'retry', 'cancel')),
    resolved_at timestamptz,
    PRIMARY KEY (epoch, run_id, step_id),
    FOREIGN KEY (run_id, step_id) REFERENCES {{ns}}.step (run_id, step_id),
    CHECK ((resolution IS NULL) = (resolved_at IS NULL))
);

-- release-restore-hold: the snapshotted steps still unresolved
CREATE INDEX restore_snapshot_unresolved ON {{ns}}.restore_snapshot (epoch)
    WHERE resolution IS NULL;

CREATE TABLE {{ns}}.operator_action (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- null for deployment-wide actions
    run_id text REFERENCES {{ns}}.run (id),
    kind   text NOT NULL CHECK (kind IN ('reconcile', 'retry-same', 'cancel', 'retain',
                                         'restore-hold', 'complete-execution-recovery',
                                         'release-restore-hold', 'release-admission-hold')),
    -- an investigation reference; retain has none
    reason text CHECK (reason ~ '^[A-Za-z0-9._:/-]{1,128}$'),
    at     timestamptz NOT NULL DEFAULT {{ns}}.now()
);

-- inspection: the last operator actions on one run
CREATE INDEX operator_action_run ON {{ns}}.operator_action (run_id, id DESC)
    WHERE run_id IS NOT NULL;

CREATE TABLE {{ns}}.token_refusal (
    connection text PRIMARY KEY,
    -- the issuer's OAuth error code (invalid_client, invalid_scope, …), never its message
    error      text NOT NULL CHECK (error ~ '^[a-z_-]{1,64}$'),
    refused_at timestamptz NOT NULL
);

-- Custody checks must see which state key versions payloads use without a component role
-- being able to read the ciphertext itself: this runs with its owner's rights and returns
-- nothing but version numbers. It walks payload_key_version one distinct value at a time.
CREATE FUNCTION {{ns}}.state_key_versions_in_use() RETURNS SETOF integer
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
        WITH RECURSIVE used(version) AS (
            (SELECT key_version FROM {{ns}}.payload ORDER BY key_version LIMIT 1)
            UNION ALL
            SELECT (SELECT p.key_version FROM {{ns}}.payload p
                     WHERE p.key_version > used.version
                     ORDER BY p.key_version LIMIT 1)
              FROM used
             WHERE used.version IS NOT NULL
        )
        SELECT version FROM used WHERE version IS NOT NULL
    $$;

-- One function serves the three channels: the channel is the table's schema plus a suffix
-- given as the trigger argument, so the file needs no channel name of its own.
CREATE FUNCTION {{ns}}.notify_channel() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
        BEGIN
            PERFORM pg_notify(TG_TABLE_SCHEMA || '_' || TG_ARGV[0], '');
            RETURN NULL;
        END
    $$;

-- run.attention_since follows run.attention, whichever statement changes it: set when
-- attention begins, kept while it lasts, cleared when it ends. The triggers' WHEN clauses
-- call it only when attention starts true or changes, so the inserts and the recomputes that
-- leave attention as it was (nearly every write of a run) run no function at all.
CREATE FUNCTION {{ns}}.run_attention_since() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
        BEGIN
            IF NOT NEW.attention THEN
                NEW.attention_since := NULL;
            ELSIF TG_OP = 'INSERT' OR NOT OLD.attention THEN
                NEW.attention_since := {{ns}}.now();
            ELSE
                NEW.attention_since := OLD.attention_since;
            END IF;
            RETURN NEW;
        END
    $$;

CREATE TRIGGER run_attention_since_insert
    BEFORE INSERT ON {{ns}}.run
    FOR EACH ROW WHEN (NEW.attention)
    EXECUTE FUNCTION {{ns}}.run_attention_since();

CREATE TRIGGER run_attention_since_update
    BEFORE UPDATE OF attention ON {{ns}}.run
    FOR EACH ROW WHEN (OLD.attention IS DISTINCT FROM NEW.attention)
    EXECUTE FUNCTION {{ns}}.run_attention_since();

CREATE TRIGGER step_due_notify
    AFTER INSERT OR UPDATE OF due_at, lease_owner ON {{ns}}.step
    FOR EACH ROW WHEN (NEW.due_at IS NOT NULL AND NEW.lease_owner IS NULL)
    EXECUTE FUNCTION {{ns}}.notify_channel('due');

CREATE TRIGGER hold_notify
    AFTER UPDATE ON {{ns}}.hold
    FOR EACH ROW WHEN (OLD.execution_hold IS DISTINCT FROM NEW.execution_hold
                       OR OLD.admission_hold IS DISTINCT FROM NEW.admission_hold)
    EXECUTE FUNCTION {{ns}}.notify_channel('hold');

CREATE TRIGGER activation_notify
    AFTER UPDATE OF activation_serial ON {{ns}}.deployment
    FOR EACH ROW WHEN (OLD.activation_serial IS DISTINCT FROM NEW.activation_serial)
    EXECUTE FUNCTION {{ns}}.notify_channel('activation');

INSERT INTO {{ns}}.hold DEFAULT VALUES;
INSERT INTO {{ns}}.schema_version (version) VALUES (4);
