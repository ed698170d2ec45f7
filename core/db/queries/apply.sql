-- What apply runs as the migration role, in its one transaction: the lock that serializes
-- applies, the schema, the component roles and their grants (CONTRACT §6.1, §6.2).
--
-- Role names are identifiers, which PostgreSQL takes only as text in the statement: they
-- come in through the {{word}} placeholders (see core/db/queries.py), quoted.

-- name: apply_lock
-- Wait for, then hold until the transaction ends, the advisory lock that stands for the
-- namespace, so two applies at once end as if one ran after the other.
-- $1 lock_key (bigint)
-- returns: status
SELECT pg_advisory_xact_lock($1);

-- name: schema_create
-- Create the namespace's schema when it does not exist; the connected role owns it.
-- returns: status
CREATE SCHEMA IF NOT EXISTS {{ns}};

-- name: role_create
-- Create the component role {{role}}: it cannot log in and inherits nothing.
-- returns: status
CREATE ROLE {{role}} NOLOGIN NOINHERIT;

-- name: role_nologin
-- Take the right to log in away from the component role {{role}}.
-- returns: status
ALTER ROLE {{role}} NOLOGIN;

-- name: grants_reset
-- Reset the namespace's privileges to exactly what each component role needs, so that
-- re-running apply also repairs grants someone widened by hand: revoke everything from
-- PUBLIC, the runtime role {{runtime}} and the component roles {{admission}},
-- {{dispatcher}}, {{recovery}} and {{audit}}, grant each component its tables, then make
-- the runtime role a member of each component role. One DO block, so that it is one
-- statement like every named query. core/db/roles.py reads the table grants back from
-- this text as GRANTS, one table and privilege list per GRANT ... ON.
-- returns: status
DO $grants$
BEGIN
    REVOKE ALL ON SCHEMA {{ns}}
      FROM PUBLIC, {{runtime}}, {{admission}}, {{dispatcher}}, {{recovery}}, {{audit}};
    REVOKE ALL ON ALL TABLES IN SCHEMA {{ns}}
      FROM PUBLIC, {{runtime}}, {{admission}}, {{dispatcher}}, {{recovery}}, {{audit}};
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA {{ns}}
      FROM PUBLIC, {{runtime}}, {{admission}}, {{dispatcher}}, {{recovery}}, {{audit}};
    REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {{ns}}
      FROM PUBLIC, {{runtime}}, {{admission}}, {{dispatcher}}, {{recovery}}, {{audit}};
    -- The argument types of transitions.sql: no USAGE for anyone but the owner, PUBLIC's
    -- default included, so no other role can make an object of one (which would stand in
    -- the way of a later release changing it). Passing a value of one to a function, as
    -- the components do, asks for no privilege on the type.
    REVOKE ALL ON TYPE {{ns}}.settle_args, {{ns}}.binding_args, {{ns}}.start_args
      FROM PUBLIC, {{runtime}}, {{admission}}, {{dispatcher}}, {{recovery}}, {{audit}};
    GRANT USAGE ON SCHEMA {{ns}} TO {{admission}}, {{dispatcher}}, {{recovery}}, {{audit}};
    -- Every component may read the clock; every one that writes runs, steps or payloads
    -- may evaluate the rules about them (the CHECKs of those tables call run_rules,
    -- step_rules and payload_rules, and step_rules calls sent_nothing, so an insert needs
    -- them too); the step transitions (transitions.sql) are the dispatcher's, and those of
    -- operator mode (with what they call) recovery's, each run with the caller's own table
    -- grants; the rest are for triggers only.
    GRANT EXECUTE ON FUNCTION {{ns}}.now(), {{ns}}.state_key_versions_in_use()
       TO {{admission}}, {{dispatcher}}, {{recovery}}, {{audit}};
    GRANT EXECUTE ON FUNCTION {{ns}}.sent_nothing, {{ns}}.ready_attention,
                              {{ns}}.step_wants_attention, {{ns}}.step_abandoned,
                              {{ns}}.run_rules, {{ns}}.step_rules, {{ns}}.payload_rules
       TO {{admission}}, {{dispatcher}}, {{recovery}};
    GRANT EXECUTE ON FUNCTION {{ns}}.step_leased, {{ns}}.run_close_cancelled,
                              {{ns}}.run_attention_recompute,
                              {{ns}}.step_settle, {{ns}}.step_prepare,
                              {{ns}}.step_make_uncertain, {{ns}}.step_uncertain_write,
                              {{ns}}.step_lease_end, {{ns}}.step_end_cancelled,
                              {{ns}}.step_retry,
                              {{ns}}.step_wait, {{ns}}.step_plan_check,
                              {{ns}}.step_record_read
       TO {{dispatcher}};
    GRANT EXECUTE ON FUNCTION {{ns}}.step_checked, {{ns}}.step_operator_settle,
                              {{ns}}.step_operator_end, {{ns}}.run_live_state,
                              {{ns}}.step_operator_not_sent, {{ns}}.step_retry_same,
                              {{ns}}.run_cancel,
                              {{ns}}.step_leased, {{ns}}.step_settle,
                              {{ns}}.run_close_cancelled, {{ns}}.run_attention_recompute
       TO {{recovery}};

    -- Read by every component at startup to verify the activation (§6.4).
    GRANT SELECT ON {{ns}}.schema_version, {{ns}}.deployment, {{ns}}.package,
                    {{ns}}.activation, {{ns}}.key_custody, {{ns}}.hold
       TO {{admission}}, {{dispatcher}}, {{recovery}}, {{audit}};

    -- Admission starts runs and wakes waiting ones; it may move a wait's next check forward,
    -- but not change what state a step is in. Of payload it reads only the non-secret columns:
    -- enough to insert a row and answer its id.
    GRANT SELECT, INSERT ON {{ns}}.run TO {{admission}};
    GRANT SELECT, INSERT ON {{ns}}.binding TO {{admission}};
    GRANT SELECT, INSERT, UPDATE (due_at, next_check_at, updated_at) ON {{ns}}.step
       TO {{admission}};
    GRANT INSERT, SELECT (id, run_id, step_id, purpose, key_version, created_at) ON {{ns}}.payload
       TO {{admission}};
    GRANT SELECT, INSERT ON {{ns}}.start_identity TO {{admission}};
    GRANT SELECT ON {{ns}}.tombstone TO {{admission}};

    -- The dispatcher claims and executes steps and moves runs along; it reads holds, never
    -- changes them.
    GRANT SELECT, UPDATE (state, outcome, attention, cancelling, failure_kind, failure_path,
                          failure_step, updated_at, ended_at) ON {{ns}}.run
       TO {{dispatcher}};
    GRANT SELECT ON {{ns}}.binding TO {{dispatcher}};
    GRANT SELECT, INSERT, UPDATE ON {{ns}}.step TO {{dispatcher}};
    GRANT SELECT, INSERT ON {{ns}}.payload TO {{dispatcher}};
    -- Its last refused token request per connection, for doctor (SELECT: the upsert's
    -- conflict and the delete's condition read the connection).
    GRANT SELECT, INSERT, UPDATE, DELETE ON {{ns}}.token_refusal TO {{dispatcher}};

    -- Recovery carries out operator actions: inspection, reconcile, retry-same, cancel, holds
    -- and retention.
    GRANT SELECT, UPDATE ON {{ns}}.hold TO {{recovery}};
    GRANT SELECT, UPDATE ON {{ns}}.run TO {{recovery}};
    GRANT SELECT ON {{ns}}.binding TO {{recovery}};
    GRANT SELECT, INSERT, UPDATE ON {{ns}}.step TO {{recovery}};
    GRANT SELECT, INSERT, DELETE ON {{ns}}.payload TO {{recovery}};
    GRANT SELECT, DELETE ON {{ns}}.start_identity TO {{recovery}};
    GRANT SELECT, INSERT ON {{ns}}.tombstone TO {{recovery}};
    GRANT SELECT, INSERT, UPDATE ON {{ns}}.recovery_record TO {{recovery}};
    GRANT SELECT, INSERT, UPDATE ON {{ns}}.restore_snapshot TO {{recovery}};
    GRANT SELECT, INSERT ON {{ns}}.operator_action TO {{recovery}};
    GRANT SELECT ON {{ns}}.token_refusal TO {{recovery}};

    -- The audit journal's key custody, per segment.
    GRANT SELECT, INSERT, UPDATE ON {{ns}}.audit_segment TO {{audit}};

    -- Membership without inheritance: the runtime role acts as a component only after SET
    -- ROLE, so a leaked runtime session that has not chosen a role can read nothing.
    GRANT {{admission}} TO {{runtime}} WITH INHERIT FALSE, SET TRUE;
    GRANT {{dispatcher}} TO {{runtime}} WITH INHERIT FALSE, SET TRUE;
    GRANT {{recovery}} TO {{runtime}} WITH INHERIT FALSE, SET TRUE;
    GRANT {{audit}} TO {{runtime}} WITH INHERIT FALSE, SET TRUE;
END
$grants$;
