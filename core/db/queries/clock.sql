-- The test clock in SQL (core/clock.py): the namespace's now() answers the
-- coordinator.fake_now setting while it is set, and the wall clock otherwise.

-- name: clock_fake_now_set
-- Set a setting for the current transaction only (is_local): outside a transaction it
-- does not stick.
-- $1 setting (text): coordinator.fake_now
-- $2 instant (text): RFC 3339
-- returns: status
SELECT set_config($1, $2, true);
