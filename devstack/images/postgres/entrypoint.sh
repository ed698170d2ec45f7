#!/bin/sh
# What compose.yaml expects of the official postgres image, and no more:
# - started as root, it hands the data folder to `postgres` (999) and runs as that account;
# - on an empty data folder it runs initdb with POSTGRES_USER and POSTGRES_PASSWORD_FILE,
#   starts a server that listens on its Unix socket only, runs every
#   /docker-entrypoint-initdb.d/*.sh (executed when executable, sourced otherwise) and stops
#   that server again; a failing script stops the container, as in the official image;
# - then it replaces itself with the command (`postgres -c …`).
set -eu

if [ "$(id -u)" = 0 ]; then
    # install -d sets the owner and mode of an existing folder (a volume) too.
    install -d -o postgres -g postgres -m 0700 "$PGDATA"
    install -d -o postgres -g postgres -m 2775 /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    POSTGRES_USER=${POSTGRES_USER:-postgres}
    export POSTGRES_USER
    initdb --username="$POSTGRES_USER" --pwfile="${POSTGRES_PASSWORD_FILE:?set POSTGRES_PASSWORD_FILE}" \
        --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 \
        --pgdata="$PGDATA" >/dev/null
    # As the official image's configuration: every address, the socket in /var/run.
    printf '%s\n' "listen_addresses = '*'" "unix_socket_directories = '/var/run/postgresql'" \
        >> "$PGDATA/postgresql.conf"
    pg_ctl --pgdata="$PGDATA" --wait --silent --options="-c listen_addresses=''" start
    for script in /docker-entrypoint-initdb.d/*.sh; do
        [ -f "$script" ] || continue
        echo "entrypoint: running $script"
        if [ -x "$script" ]; then
            "$script"
        else
            . "$script"
        fi
    done
    pg_ctl --pgdata="$PGDATA" --wait --silent --mode=fast stop
    echo "entrypoint: initialisation complete"
fi

exec "$@"
