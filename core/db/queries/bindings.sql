-- Live bindings (CONTRACT §9.7): the connection settings that runs which have not ended
-- recorded at admission, compared with the runtime file at startup and before acting on a
-- run. Every component role that uses them may read run and binding.

-- name: bindings_live
-- Each distinct recorded binding of runs that have not ended, per connection, with how
-- many runs share it.
-- returns: rows
-- column connection (text)
-- column connection_type (text)
-- column base_url (text)
-- column client_id (text)
-- column issuer (text)
-- column scopes (text[])
-- column profile (text)
-- column producer (text, null): Casework only
-- column runs (bigint): how many runs that have not ended share it
SELECT b.connection, b.connection_type, b.base_url, b.client_id, b.issuer, b.scopes,
       b.profile, b.producer, count(*) AS runs
  FROM {{ns}}.run r
  JOIN {{ns}}.binding b ON b.run_id = r.id
 WHERE r.state IN ('running', 'waiting', 'held')
 GROUP BY b.connection, b.connection_type, b.base_url, b.client_id, b.issuer, b.scopes,
          b.profile, b.producer
 ORDER BY b.connection;

-- name: bindings_of_run
-- The recorded bindings of a run, and whether the run has ended.
-- $1 run_id (text)
-- returns: rows
-- column connection (text)
-- column connection_type (text)
-- column base_url (text)
-- column client_id (text)
-- column issuer (text)
-- column scopes (text[])
-- column profile (text)
-- column producer (text, null): Casework only
-- column ended (boolean): the run has ended
SELECT b.connection, b.connection_type, b.base_url, b.client_id, b.issuer, b.scopes,
       b.profile, b.producer, r.ended_at IS NOT NULL AS ended
  FROM {{ns}}.binding b
  JOIN {{ns}}.run r ON r.id = b.run_id
 WHERE b.run_id = $1
 ORDER BY b.connection;
