#!/usr/bin/env bash
# Start (or stop) the whole system in the background: Kafka, PostgreSQL, every service and a
# simulated GPU cluster. For people and scripts that bring their own producers.
#
#   deploy/local/up.sh up      start what is not running yet; print where things are
#   deploy/local/up.sh down    stop the services and the simulated cluster; stop Kafka and
#                              PostgreSQL only if `up` started them
#   deploy/local/up.sh status  which of our processes run
#
# Environment: CLUSTER (deploy/clusters/default.yaml), GANGLINE_TOPIC_PREFIX (""),
# GANGLINE_FAKE_NODES_ARGS (extra flags for `gangline fake-nodes`, e.g. "--time-scale 0.05"),
# GANGLINE_API_PORT (8080), GANGLINE_ANALYTICS_PORT (8091), GANGLINE_TRUST (on; off: readers do not check
# writers), plus every GANGLINE_* setting the services read.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${GANGLINE_PYTHON:-$ROOT/.venv/bin/python}"
RUN="$ROOT/.cache/gangline-up"
CLUSTER="${CLUSTER:-$ROOT/deploy/clusters/default.yaml}"
export GANGLINE_KAFKA_BOOTSTRAP="${GANGLINE_KAFKA_BOOTSTRAP:-127.0.0.1:${GANGLINE_KAFKA_PORT:-9092}}"
export GANGLINE_PG_DSN="${GANGLINE_PG_DSN:-postgresql://postgres@127.0.0.1:${GANGLINE_PG_PORT:-55432}/gangline}"
export GANGLINE_PORT="${GANGLINE_API_PORT:-8080}"
# Development tokens (loopback only): the `ops` admin token and one per team; replace for anything shared.
export GANGLINE_TOKENS_FILE="${GANGLINE_TOKENS_FILE:-$ROOT/deploy/docker/api-tokens.dev.yaml}"
# The example queues (an unlimited `default`, team-a and team-b sharing a cohort), read by admission,
# quota and the API alike.
export GANGLINE_QUEUES_FILE="${GANGLINE_QUEUES_FILE:-$ROOT/deploy/docker/queues.yaml}"
SERVICES=(admission quota placement preemption node_health ledger analytics api)

log() { printf 'up.sh: %s\n' "$*" >&2; }

# Each process is its own Kafka principal (deploy/kafka/access.yaml), with its password from the
# credentials file kafka.sh formatted the broker with (DEVELOPMENT ONLY unless you point it elsewhere).
CREDENTIALS="${GANGLINE_KAFKA_CREDENTIALS:-$ROOT/deploy/kafka/credentials.dev.yaml}"
principal_of() {
    case "$1" in fake-nodes) echo agent ;; *) echo "$1" ;; esac
}
become() {  # principal: this (sub)shell's Kafka clients authenticate as it
    export GANGLINE_KAFKA_USERNAME="$1"
    GANGLINE_KAFKA_PASSWORD="$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]])' \
        "$CREDENTIALS" "$1")"
    export GANGLINE_KAFKA_PASSWORD
}

# Trust at the edges of the log (libs/gangline/bus/trust.py): readers check who wrote each record on
# jobs.requests, jobs.events and nodes.*, and dead-letter what its writer may not say (deploy/kafka/access.yaml;
# tenants' queues from the API's token file). The services hold the master key (made once, kept in
# $RUN/trust.key: the log's signatures must verify at every restart) and sign as their principal; the
# simulated nodes get only the agent's derived key, like any edge writer. GANGLINE_TRUST=off turns it off.
TRUST_KEY="${GANGLINE_TRUST_KEY_FILE:-$RUN/trust.key}"
trust_on() { [[ "${GANGLINE_TRUST:-on}" != off ]]; }
trust_keys() {  # the master key when missing, and the derived keys of the edge writers
    trust_on || return 0
    if [[ ! -s "$TRUST_KEY" ]]; then
        (umask 077; "$PY" -c 'import secrets; print(secrets.token_hex(32))' >"$TRUST_KEY")
        log "made the trust master key $TRUST_KEY"
    fi
    local who
    for who in agent producer team-a team-b; do
        (umask 077; "$PY" -c "import sys; from gangline.bus.trust import main; sys.exit(main())" derive-key --master-file "$TRUST_KEY" --principal "$who" \
            >"$RUN/$who.key")
    done
}
trusted() {  # name: this (sub)shell checks writers and signs as its principal, or only signs (fake-nodes)
    trust_on || return 0
    if [[ "$1" == fake-nodes ]]; then
        unset GANGLINE_TRUST_ACCESS GANGLINE_TRUST_KEY_FILE GANGLINE_TRUST_TOKENS_FILE
        export GANGLINE_WRITER_KEY_FILE="$RUN/agent.key"
        return
    fi
    export GANGLINE_TRUST_ACCESS="${GANGLINE_TRUST_ACCESS:-$ROOT/deploy/kafka/access.yaml}"
    export GANGLINE_TRUST_KEY_FILE="$TRUST_KEY"
    export GANGLINE_TRUST_TOKENS_FILE="${GANGLINE_TRUST_TOKENS_FILE:-$GANGLINE_TOKENS_FILE}"
}

running() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

start() {  # name, command...: run it under a small supervisor that restarts it when it exits
    local name="$1"; shift
    if running "$name"; then log "$name already runs (pid $(cat "$RUN/$name.pid"))"; return; fi
    (
        cd "$ROOT"
        become "$(principal_of "$name")"
        trusted "$name"
        child=
        trap '[[ -n $child ]] && kill -TERM "$child" 2>/dev/null; [[ -n $child ]] && wait "$child"; exit 0' TERM INT
        while true; do
            "$@" &
            child=$!
            wait "$child" && rc=0 || rc=$?
            echo "up.sh: $name exited ($rc); restarting in 2 s"
            sleep 2
        done
    ) >>"$RUN/$name.log" 2>&1 </dev/null &
    echo $! >"$RUN/$name.pid"
    log "$name started (supervisor pid $!, log $RUN/$name.log)"
}

stop() {  # name: SIGTERM, then SIGKILL after 20 s
    local name="$1" pid
    [[ -f "$RUN/$name.pid" ]] || return 0
    pid="$(cat "$RUN/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            # The service first (the supervisor's child), then its supervisor: killing only the
            # supervisor would leave the service running as an orphan.
            log "$name did not stop; SIGKILL"
            pkill -KILL -P "$pid" 2>/dev/null || true
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "$name stopped"
    fi
    rm -f "$RUN/$name.pid"
}

up() {
    mkdir -p "$RUN"
    if "$ROOT/deploy/local/kafka.sh" status >/dev/null 2>&1 || \
        (exec 3<>"/dev/tcp/${GANGLINE_KAFKA_BOOTSTRAP%:*}/${GANGLINE_KAFKA_BOOTSTRAP##*:}") 2>/dev/null; then
        log "Kafka already answers at $GANGLINE_KAFKA_BOOTSTRAP; using it"
    else
        "$ROOT/deploy/local/kafka.sh" up && touch "$RUN/kafka.ours"
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/${GANGLINE_PG_PORT:-55432}") 2>/dev/null; then
        log "PostgreSQL already answers; using it"
    else
        "$ROOT/deploy/local/postgres.sh" up && touch "$RUN/postgres.ours"
    fi
    "$PY" -m gangline.store.migrate >/dev/null
    trust_keys
    (
        become admin
        "$PY" -m services.common.admin create-topics >&2
        "$PY" -m gangline.bus.acl apply --bootstrap "$GANGLINE_KAFKA_BOOTSTRAP" --catalogue "$ROOT/schemas/topics.yaml" \
            --access "$ROOT/deploy/kafka/access.yaml" --topic-prefix "${GANGLINE_TOPIC_PREFIX:-}" \
            --group-prefix "${GANGLINE_GROUP_PREFIX:-gangline}" >&2
    )
    # The nodes register first, so admission knows the cluster when the first request arrives.
    # shellcheck disable=SC2086
    start fake-nodes "$ROOT/.venv/bin/gangline" fake-nodes --spec "$CLUSTER" ${GANGLINE_FAKE_NODES_ARGS:-}
    sleep 2
    for s in "${SERVICES[@]}"; do
        [[ -d "$ROOT/services/$s" ]] && start "$s" "$PY" -m "services.$s"
    done
    log "up: Kafka $GANGLINE_KAFKA_BOOTSTRAP, topics prefix '${GANGLINE_TOPIC_PREFIX:-}', cluster $CLUSTER"
    log "API: http://127.0.0.1:$GANGLINE_PORT (OpenAPI at /docs); logs in $RUN/"
    log "Metrics: http://127.0.0.1:9471/metrics (admission) .. 9478 (fake nodes); the table in the README"
    log "analytics: http://127.0.0.1:${GANGLINE_ANALYTICS_PORT:-8091}/analytics/gpu-hours (JSON), /metrics (Prometheus)"
    trust_on && log "trust: on (master key $TRUST_KEY); a producer of its own signs with GANGLINE_KAFKA_USERNAME=producer GANGLINE_WRITER_KEY_FILE=$RUN/producer.key (team-a, team-b: $RUN/team-a.key, ...)"
    log "CLI: export GANGLINE_API_URL=http://127.0.0.1:$GANGLINE_PORT GANGLINE_TOKEN=dev-ops-admin-token; .venv/bin/gangline queues"
}

down() {
    for s in fake-nodes "${SERVICES[@]}"; do stop "$s"; done
    if [[ -f "$RUN/kafka.ours" ]]; then "$ROOT/deploy/local/kafka.sh" down; rm -f "$RUN/kafka.ours"; fi
    if [[ -f "$RUN/postgres.ours" ]]; then "$ROOT/deploy/local/postgres.sh" down; rm -f "$RUN/postgres.ours"; fi
}

status() {
    local rc=0
    for s in fake-nodes "${SERVICES[@]}"; do
        if running "$s"; then echo "$s: running (pid $(cat "$RUN/$s.pid"))"; else echo "$s: stopped"; rc=1; fi
    done
    return $rc
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
