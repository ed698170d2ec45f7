#!/bin/sh
# Creates what Registry Coordinator needs in the PostgreSQL of compose.yaml: the database
# `coordinator` and its two login roles (CONTRACT §6; the runbook's chapter 2 explains each
# attribute). The image runs this once, as the account `postgres`, the first time the data
# volume is empty, before the server accepts any network connection.
#
# - coordinator_migrator: what `coordinatorctl apply` logs in as. It owns the database (apply
#   creates the schema in it, and a scratch copy to compare with on every later apply) and
#   may create roles (the four component roles), nothing more: no superuser, no BYPASSRLS,
#   no other database.
# - coordinator_runtime: what the services log in as. No attribute at all, NOINHERIT, and
#   only CONNECT on this one database; apply later lets it SET ROLE to each component role.
#
# The passwords come from the files prepare copied from deploy/compose/postgres. psql reads
# them itself (the backquoted `cat`), so they appear on no command line. The server receives
# each password once, in the CREATE ROLE statement, and keeps only its SCRAM verifier.
#
# It works whether the image runs it (executable) or sources it: it sets no shell option and
# stops the initialisation with `exit 1` on any failure.

coordinator_private=/etc/postgresql/private
for coordinator_file in migration-password runtime-password; do
    if [ ! -s "$coordinator_private/$coordinator_file" ]; then
        echo "initdb: $coordinator_private/$coordinator_file is missing or empty" >&2
        exit 1
    fi
done

psql --no-psqlrc --no-password --set=ON_ERROR_STOP=1 \
    --username="$POSTGRES_USER" --dbname=postgres <<'SQL' || exit 1
\set migration_password `cat /etc/postgresql/private/migration-password`
\set runtime_password `cat /etc/postgresql/private/runtime-password`

CREATE ROLE coordinator_migrator LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB CREATEROLE
    NOREPLICATION PASSWORD :'migration_password';

-- NOINHERIT: a component role granted later acts only after SET ROLE.
CREATE ROLE coordinator_runtime LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE
    NOREPLICATION NOINHERIT PASSWORD :'runtime_password';

CREATE DATABASE coordinator OWNER coordinator_migrator;
REVOKE ALL ON DATABASE coordinator FROM PUBLIC;
GRANT CONNECT ON DATABASE coordinator TO coordinator_runtime;

-- The stock databases are for maintenance only.
REVOKE ALL ON DATABASE postgres FROM PUBLIC;
REVOKE ALL ON DATABASE template1 FROM PUBLIC;
SQL

# Last: the mark compose.yaml's health check looks for. A first start that failed above
# leaves a data folder the image will not initialise again; without this file the server
# never reports healthy, and apply never runs against a database without its roles.
touch "$PGDATA/registry-coordinator-initialised" || exit 1
