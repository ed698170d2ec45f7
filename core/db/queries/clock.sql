-- The test clock in SQL (core/clock.py): the namespace's now() answers the
-- coordinator.fake_now setting while it is set, and the wall clock otherwise.

-- name: clock_fake_now_set
-- Set the setting $1 (text, coordinator.fake_now) to the instant $2 (text, RFC 3339)
-- for the current transaction only (is_local): outside a transaction it does not stick.
SELECT set_config($1, $2, true);
