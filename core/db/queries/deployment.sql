-- The deployment's identity, its active packages and its key custody records: what apply
-- writes and what plan, deployment-status and every component's startup read.

-- name: schema_version_read
-- The layout version recorded in the namespace (null when the table is empty).
-- returns: value (integer, null)
SELECT max(version) AS version FROM {{ns}}.schema_version;

-- name: deployment_read
-- The deployment row: databaseId, the role that installed the schema, the activation
-- serial. No row before the first apply finished.
-- returns: row
-- column database_id (text)
-- column migration_role (text)
-- column activation_serial (bigint)
SELECT database_id::text AS database_id, migration_role::text AS migration_role,
       activation_serial
  FROM {{ns}}.deployment;

-- name: deployment_insert
-- Record the identity at the first apply.
-- $1 database_id (text): the databaseId, a UUID
-- $2 migration_role (text): the migration role's name
-- returns: status
INSERT INTO {{ns}}.deployment (database_id, migration_role) VALUES ($1::uuid, $2);

-- name: activation_serial_raise
-- Raise the activation serial by one and answer the new value (null when the namespace
-- records no deployment).
-- returns: value (bigint, null)
UPDATE {{ns}}.deployment
   SET activation_serial = activation_serial + 1, activated_at = {{ns}}.now()
RETURNING activation_serial;

-- name: activation_list
-- The active package of every workflow, ordered by workflow id, with its bytes.
-- returns: rows
-- column workflow_id (text)
-- column digest (text)
-- column version (text)
-- column manifest (bytea)
-- column source (bytea)
-- column activated_serial (bigint)
SELECT a.workflow_id, a.digest, p.version, p.manifest, p.source, a.activated_serial
  FROM {{ns}}.activation a
  JOIN {{ns}}.package p ON p.digest = a.digest
 ORDER BY a.workflow_id;

-- name: package_read
-- One stored package; no row when that digest is not stored.
-- $1 digest (text)
-- returns: row
-- column workflow_id (text)
-- column version (text)
-- column manifest (bytea)
-- column source (bytea)
SELECT workflow_id, version, manifest, source FROM {{ns}}.package WHERE digest = $1;

-- name: package_insert
-- Keep a package's bytes (a digest already kept is left as it is).
-- $1 digest (text)
-- $2 workflow_id (text)
-- $3 version (text)
-- $4 manifest (bytea): the manifest bytes
-- $5 source (bytea): the workflow source bytes
-- returns: status
INSERT INTO {{ns}}.package (digest, workflow_id, version, manifest, source)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (digest) DO NOTHING;

-- name: activation_set
-- Make a package the active one of its workflow as of an activation serial.
-- $1 workflow_id (text)
-- $2 digest (text)
-- $3 serial (bigint)
-- returns: status
INSERT INTO {{ns}}.activation (workflow_id, digest, activated_serial)
VALUES ($1, $2, $3)
ON CONFLICT (workflow_id) DO UPDATE
   SET digest = EXCLUDED.digest,
       activated_serial = EXCLUDED.activated_serial,
       activated_at = {{ns}}.now();

-- name: activation_remove
-- Remove a workflow from the activation; its package bytes stay for its runs.
-- $1 workflow_id (text)
-- returns: status
DELETE FROM {{ns}}.activation WHERE workflow_id = $1;

-- name: live_run_count
-- How many runs of a workflow have not ended (the live states: run_live's rows).
-- $1 workflow_id (text)
-- returns: value (bigint)
SELECT count(*) AS live FROM {{ns}}.run
 WHERE workflow_id = $1 AND state IN ('running', 'waiting', 'held');

-- name: custody_list
-- Every recorded key fingerprint: kind ('state' or 'admission'), version (0 for the
-- admission key), fingerprint.
-- returns: rows
-- column key_kind (text)
-- column key_version (integer)
-- column fingerprint (text)
SELECT key_kind, key_version, fingerprint
  FROM {{ns}}.key_custody
 ORDER BY key_kind, key_version;

-- name: custody_record
-- Record a fingerprint seen for the first time. A recorded one stays.
-- $1 key_kind (text): 'state' or 'admission'
-- $2 key_version (integer): 0 for the admission key
-- $3 fingerprint (text): 64 hex digits
-- returns: status
INSERT INTO {{ns}}.key_custody (key_kind, key_version, fingerprint)
VALUES ($1, $2, $3)
ON CONFLICT (key_kind, key_version) DO NOTHING;

-- name: state_key_versions_in_use
-- The state key versions stored payloads were written with, ascending.
-- returns: rows
-- column version (integer)
SELECT version FROM {{ns}}.state_key_versions_in_use() AS used(version) ORDER BY version;
