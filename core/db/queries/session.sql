-- The connection's own session: which PostgreSQL serves it, who logged in, whom it acts as,
-- and the component role it acts as. None of these touches the namespace.

-- name: server_version_num
-- The server's version as a number (170010 for 17.10).
-- returns: value (integer)
SELECT current_setting('server_version_num')::integer;

-- name: session_user_name
-- The role the connection logged in as (SET ROLE does not change it).
-- returns: value (text)
SELECT session_user::text;

-- name: current_user_name
-- The role the connection acts as now.
-- returns: value (text)
SELECT current_user::text;

-- name: role_set
-- Act as role for the rest of the session, as SET ROLE does (the same check that the
-- login role may act as it, the same errors), with the name as a parameter. A connection
-- pool's reset on release keeps it.
-- $1 role (text)
-- returns: status
SELECT set_config('role', $1, false);

-- name: session_plans_per_call
-- Plan each statement of the rest of the transaction for its parameters' values
-- (plan_cache_mode force_custom_plan), never with a generic plan: for a statement whose
-- filters are optional (an operator's list), the values decide which index serves it.
-- returns: status
SELECT set_config('plan_cache_mode', 'force_custom_plan', true);
