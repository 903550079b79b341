#!/bin/sh
# First start: initdb of $PGDATA (local connections: peer; network: scram-sha-256), role eagle3 with the password
# read from $POSTGRES_PASSWORD_FILE, then init.sql (the two databases). Every start: postgres on all interfaces of
# the container (the stack publishes nothing of it; only containers of its network reach it).
set -eu
PGBIN=/usr/lib/postgresql/15/bin
pw_file="${POSTGRES_PASSWORD_FILE:-}"
if [ -z "$pw_file" ] || [ ! -s "$pw_file" ]; then
  echo "eagle3-postgres: POSTGRES_PASSWORD_FILE expected a non-empty file with role eagle3's password, got '$pw_file'" >&2
  exit 2
fi
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  as_postgres "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  as_postgres "$PGBIN/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  as_postgres psql -v ON_ERROR_STOP=1 -q -U postgres -v pw="$(cat "$pw_file")" <<'SQL'
CREATE ROLE eagle3 LOGIN PASSWORD :'pw';
SQL
  as_postgres psql -v ON_ERROR_STOP=1 -q -U postgres -f /usr/local/share/eagle3/init.sql
  as_postgres "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "eagle3-postgres: initialised $PGDATA (role eagle3, databases prefect and mlflow)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups "$PGBIN/postgres" -D "$PGDATA" -c listen_addresses='*'
