#!/usr/bin/env bash
# Starts a local PostgreSQL server for the tests, as root, idempotently, and prints its URL on stdout
# (everything else goes to stderr). Installs the server when missing, creates and starts the cluster,
# and creates the role and database "lumotree" (password "lumotree") on 127.0.0.1.
#   LUMOTREE_TEST_PG_URL=$(bash scripts/start-postgres.sh)
set -euo pipefail
DB=${LUMOTREE_PG_DB:-lumotree}
ROLE=${LUMOTREE_PG_USER:-lumotree}
PASSWORD=${LUMOTREE_PG_PASSWORD:-lumotree}

if ! command -v pg_lsclusters >/dev/null 2>&1; then
  echo "start-postgres: installing postgresql" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql >&2
fi

# The newest installed major version; its first cluster (Debian creates "main" on install).
version=$(ls /usr/lib/postgresql | sort -n | tail -1)
cluster=$(pg_lsclusters -h | awk -v v="$version" '$1 == v {print $2; exit}')
if [ -z "$cluster" ]; then
  cluster=main
  pg_createcluster "$version" "$cluster" >&2
fi
port=$(pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1 == v && $2 == c {print $3}')
status=$(pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1 == v && $2 == c {print $4}')
if [ "$status" != "online" ]; then
  pg_ctlcluster "$version" "$cluster" start >&2
fi
for _ in $(seq 1 30); do
  su postgres -c "pg_isready -q -h 127.0.0.1 -p $port" && break
  sleep 1
done

psql_admin() { su postgres -c "psql -p $port -v ON_ERROR_STOP=1 -qtA $*"; }
if [ "$(psql_admin "-c \"SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'\"")" != "1" ]; then
  psql_admin "-c \"CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'\"" >&2
fi
if [ "$(psql_admin "-c \"SELECT 1 FROM pg_database WHERE datname = '$DB'\"")" != "1" ]; then
  psql_admin "-c \"CREATE DATABASE $DB OWNER $ROLE\"" >&2
fi
echo "postgresql://$ROLE:$PASSWORD@127.0.0.1:$port/$DB"
