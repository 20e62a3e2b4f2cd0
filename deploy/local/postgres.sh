#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on 127.0.0.1, from Debian's packages, for development and tests.
#
#   deploy/local/postgres.sh up      install postgresql if needed, initdb (as the postgres user), start it,
#                                    create the database `gangline`, apply the migrations
#   deploy/local/postgres.sh down    stop it and delete the cluster
#   deploy/local/postgres.sh status  exit 0 when our cluster on this port runs, 1 otherwise
#   deploy/local/postgres.sh psql    a psql shell on it (extra arguments go to psql)
#
# Environment: GANGLINE_PG_PORT (55432), GANGLINE_PG_DIR (/tmp/gangline-pg-<port>),
# GANGLINE_PYTHON (.venv/bin/python). Auth is `trust`, for loopback and the unix socket only.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PORT="${GANGLINE_PG_PORT:-55432}"
DIR="${GANGLINE_PG_DIR:-/tmp/gangline-pg-$PORT}"
DATA="$DIR/data"
DB=gangline
PY="${GANGLINE_PYTHON:-$ROOT/.venv/bin/python}"
DSN="postgresql://postgres@127.0.0.1:$PORT/$DB"

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# The bin dir of the newest installed PostgreSQL major version, if any.
pg_bin() {
    local initdb
    initdb="$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1)"
    [[ -n "$initdb" ]] && dirname "$initdb"
}

install_postgres() {
    pg_bin >/dev/null && return
    log "PostgreSQL missing: installing Debian's postgresql with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    pg_bin >/dev/null || die "apt-get installed postgresql but no initdb was found"
}

as_postgres() { runuser -u postgres -- "$@"; }

running() {
    [[ -f "$DATA/postmaster.pid" ]] || return 1
    as_postgres "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_venv() {
    [[ -x "$PY" ]] || make -C "$ROOT" --no-print-directory venv >&2
}

migrate() {
    ensure_venv
    GANGLINE_PG_DSN="$DSN" "$PY" -m gangline.store.migrate --dsn "$DSN" >&2
}

cmd_up() {
    local started
    started="$(now)"
    install_postgres
    BIN="$(pg_bin)"
    if running; then
        log "already up on 127.0.0.1:$PORT (data $DATA)"
        migrate
        return
    fi
    port_open "$PORT" && die "127.0.0.1:$PORT is taken by another process; set GANGLINE_PG_PORT"

    rm -rf "$DIR"
    mkdir -p "$DIR"
    chown postgres: "$DIR"
    chmod 700 "$DIR"
    # trust: this cluster only listens on loopback and a socket inside its own 0700 folder.
    as_postgres "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-locale --no-sync \
        >"$DIR/initdb.log" 2>&1 || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
    cat >>"$DATA/postgresql.conf" <<CONF

# gangline: a throwaway cluster for development and tests (deploy/local/postgres.sh)
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
    # 9>&-: the server must not inherit (and so hold forever) the lock file of this script.
    as_postgres "$BIN/pg_ctl" -D "$DATA" -l "$DIR/postgres.log" -w -t 60 start >/dev/null 9>&- \
        || { tail -n 30 "$DIR/postgres.log" >&2; die "PostgreSQL did not start"; }
    as_postgres "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
    local ready_s
    ready_s="$(since "$started")"
    migrate
    log "up on 127.0.0.1:$PORT ($DSN): ready in ${ready_s}s, migrated in $(since "$started")s"
}

cmd_down() {
    BIN="$(pg_bin)" || { log "PostgreSQL is not installed"; rm -rf "$DIR"; return; }
    if running; then
        as_postgres "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null \
            || as_postgres "$BIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null
        log "stopped PostgreSQL on 127.0.0.1:$PORT"
    else
        log "no PostgreSQL of ours on 127.0.0.1:$PORT"
    fi
    rm -rf "$DIR"
}

cmd_status() {
    BIN="$(pg_bin)" || { echo "postgres not installed"; return 1; }
    if running; then
        echo "postgres up on 127.0.0.1:$PORT ($DSN, data $DATA)"
    else
        echo "postgres down on 127.0.0.1:$PORT"
        return 1
    fi
}

cmd_psql() {
    BIN="$(pg_bin)" || die "PostgreSQL is not installed"
    exec "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres "$DB" "$@"
}

with_lock() {
    # One up/down at a time per port (two pytest sessions may start the cluster together).
    exec 9>"/tmp/gangline-pg-$PORT.lock"
    flock 9
    "$@"
}

case "${1:-}" in
    up) with_lock cmd_up ;;
    down) with_lock cmd_down ;;
    status) cmd_status ;;
    psql) shift; cmd_psql "$@" ;;
    *) echo "usage: $0 {up|down|status|psql}" >&2; exit 2 ;;
esac
