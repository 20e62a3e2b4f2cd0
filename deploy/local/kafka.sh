#!/usr/bin/env bash
# Apache Kafka 4.x (KRaft, one broker+controller) on 127.0.0.1, run from the jars Maven Central serves.
#
#   deploy/local/kafka.sh fetch    copy the pinned jars (deploy/kafka/pom.xml) into .cache/kafka/libs/
#   deploy/local/kafka.sh up       format a throwaway data dir, start the broker, wait until it answers
#                                  a metadata request, create the topics of schemas/topics.yaml
#   deploy/local/kafka.sh down     stop it (SIGTERM, then SIGKILL after a timeout), delete its data
#   deploy/local/kafka.sh status   exit 0 when our broker on this port runs, 1 otherwise
#   deploy/local/kafka.sh logs     the tail of its server.log
#
# Environment: GANGLINE_KAFKA_PORT (9092), GANGLINE_KAFKA_CONTROLLER_PORT (port+1),
# GANGLINE_KAFKA_HEAP (512m), GANGLINE_TOPIC_CATALOGUE (schemas/topics.yaml),
# GANGLINE_KAFKA_READY_TIMEOUT_S (90), GANGLINE_PYTHON (.venv/bin/python).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PORT="${GANGLINE_KAFKA_PORT:-9092}"
CONTROLLER_PORT="${GANGLINE_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
HEAP="${GANGLINE_KAFKA_HEAP:-512m}"
CATALOGUE="${GANGLINE_TOPIC_CATALOGUE:-$ROOT/schemas/topics.yaml}"
READY_TIMEOUT_S="${GANGLINE_KAFKA_READY_TIMEOUT_S:-90}"
STOP_TIMEOUT_S=30
PY="${GANGLINE_PYTHON:-$ROOT/.venv/bin/python}"

CACHE="$ROOT/.cache/kafka"
LIBS="$CACHE/libs"
STAMP="$LIBS/.pom.sha256"
POM="$ROOT/deploy/kafka/pom.xml"
INSTANCE="$CACHE/$PORT"
PIDFILE="$INSTANCE/kafka.pid"
PROPS="$INSTANCE/server.properties"
LOGDIR="$INSTANCE/logs"

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

install_java_tools() {
    command -v java >/dev/null && command -v mvn >/dev/null && return
    log "java/mvn missing: installing them with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven >/dev/null
}

ensure_venv() {
    [[ -x "$PY" ]] || make -C "$ROOT" --no-print-directory venv >&2
}

cmd_fetch() {
    local want
    want="$(sha256sum "$POM" | cut -d' ' -f1)"
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
        return
    fi
    install_java_tools
    local started tmp
    started="$(now)"
    tmp="$CACHE/libs.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$CACHE"
    log "fetching the Kafka jars of deploy/kafka/pom.xml"
    mvn -q -B -Dstyle.color=never -f "$POM" \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" >"$CACHE/fetch.log" 2>&1 \
        || { cat "$CACHE/fetch.log" >&2; rm -rf "$tmp"; die "mvn could not fetch the Kafka jars"; }
    echo "$want" >"$tmp/.pom.sha256"
    rm -rf "$LIBS"
    mv "$tmp" "$LIBS"
    log "fetched $(find "$LIBS" -name '*.jar' | wc -l) jars in $(since "$started")s"
}

# The pid of our broker for this port, when it runs.
running_pid() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    # Guard against a recycled pid: it must be kafka.Kafka with this instance's properties.
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "kafka.Kafka $PROPS" || return 1
    echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Create the catalogue's topics, after waiting up to $1 seconds for the broker to answer requests.
create_topics() {
    local wait_s="${1:-0}"
    if [[ -f "$CATALOGUE" ]]; then
        "$PY" -m gangline.bus.admin create-topics --bootstrap "127.0.0.1:$PORT" --catalogue "$CATALOGUE" \
            --wait-s "$wait_s" >&2
    else
        log "no topic catalogue at $CATALOGUE: no topics created"
        "$PY" -m gangline.bus.admin wait --bootstrap "127.0.0.1:$PORT" --timeout-s "$wait_s" >&2
    fi
}

# A formatted, never started data dir, made once per Kafka version and copied for each start: saves
# a JVM run (kafka.tools.StorageTool) per `up`. Its random cluster id is reused, which is harmless
# since every start gets a fresh copy.
formatted_template() {
    local key dir tmp
    key="$(cat "$STAMP" "$ROOT/deploy/kafka/server.properties.template" | sha256sum | cut -c1-16)"
    dir="$CACHE/formatted-$key"
    if [[ ! -f "$dir/meta.properties" ]]; then
        tmp="$dir.tmp.$$"
        rm -rf "$tmp"
        mkdir -p "$tmp/data"
        sed -e "s|@PORT@|$PORT|g" -e "s|@CONTROLLER_PORT@|$CONTROLLER_PORT|g" \
            -e "s|@DATA_DIR@|$tmp/data|g" "$ROOT/deploy/kafka/server.properties.template" >"$tmp/server.properties"
        # A Kafka cluster id is 16 random bytes, base64url without padding (never starting with '-').
        local cluster_id
        cluster_id="$(python3 -c 'import base64, os
while (u := base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")).startswith("-"): pass
print(u)')"
        "${JVM[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$tmp/server.properties" \
            >"$tmp/format.log" 2>&1 || { cat "$tmp/format.log" >&2; die "formatting the storage failed"; }
        # Another port's `up` may have made it meanwhile: either copy is as good.
        mv -T "$tmp/data" "$dir" 2>/dev/null || true
        rm -rf "$tmp"
    fi
    echo "$dir"
}

cmd_up() {
    local started pid
    started="$(now)"
    fetch_locked
    ensure_venv
    if pid="$(running_pid)"; then
        log "already up on 127.0.0.1:$PORT (pid $pid)"
        create_topics
        return
    fi
    for p in "$PORT" "$CONTROLLER_PORT"; do
        port_open "$p" && die "127.0.0.1:$p is taken by another process; set GANGLINE_KAFKA_PORT"
    done

    JVM=(java "-Xms${HEAP}" "-Xmx${HEAP}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20
        -Djava.awt.headless=true "-Dkafka.logs.dir=$LOGDIR"
        "-Dlog4j2.configurationFile=$ROOT/deploy/kafka/log4j2.properties" -cp "$LIBS/*")
    local template
    template="$(formatted_template)"
    rm -rf "$INSTANCE"
    mkdir -p "$LOGDIR"
    cp -a "$template" "$INSTANCE/data"
    sed -e "s|@PORT@|$PORT|g" -e "s|@CONTROLLER_PORT@|$CONTROLLER_PORT|g" \
        -e "s|@DATA_DIR@|$INSTANCE/data|g" "$ROOT/deploy/kafka/server.properties.template" >"$PROPS"

    # setsid: the broker outlives this script and is not hit by signals sent to the caller's group.
    # 8>&- 9>&-: the broker must not inherit (and so hold forever) the lock files of this script.
    setsid "${JVM[@]}" kafka.Kafka "$PROPS" </dev/null >"$LOGDIR/stdout.log" 2>&1 8>&- 9>&- &
    echo $! >"$PIDFILE"

    local deadline=$((SECONDS + READY_TIMEOUT_S))
    until port_open "$PORT"; do
        if ! running_pid >/dev/null; then
            tail -n 30 "$LOGDIR/stdout.log" "$LOGDIR/server.log" >&2 2>/dev/null || true
            die "the broker exited during start-up (logs: $LOGDIR)"
        fi
        ((SECONDS < deadline)) || die "the broker did not listen on $PORT within ${READY_TIMEOUT_S}s"
        sleep 0.1
    done
    # Listening is not serving: wait for a real metadata request to be answered, then add the topics.
    create_topics "$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))"
    log "up on 127.0.0.1:$PORT (pid $(cat "$PIDFILE")): ready with topics in $(since "$started")s"
}

cmd_down() {
    local pid
    if pid="$(running_pid)"; then
        kill -TERM "$pid" 2>/dev/null || true
        local deadline=$((SECONDS + STOP_TIMEOUT_S))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "the broker ignored SIGTERM for ${STOP_TIMEOUT_S}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped the broker on 127.0.0.1:$PORT (pid $pid)"
    else
        log "no broker of ours on 127.0.0.1:$PORT"
    fi
    rm -rf "$INSTANCE"
}

cmd_status() {
    local pid
    if pid="$(running_pid)"; then
        echo "kafka up on 127.0.0.1:$PORT (pid $pid, data $INSTANCE)"
    else
        echo "kafka down on 127.0.0.1:$PORT"
        return 1
    fi
}

cmd_logs() {
    [[ -f "$LOGDIR/server.log" ]] || die "no log at $LOGDIR/server.log"
    tail -n "${LINES:-200}" "$LOGDIR/server.log"
}

fetch_locked() {
    mkdir -p "$CACHE"
    exec 8>"$CACHE/.lock-fetch"
    flock 8
    cmd_fetch
    exec 8>&-
}

with_lock() {
    mkdir -p "$CACHE"
    # One fetch/up/down at a time per port (two pytest sessions may start the broker together).
    exec 9>"$CACHE/.lock-$PORT"
    flock 9
    "$@"
}

case "${1:-}" in
    fetch) fetch_locked ;;
    up) with_lock cmd_up ;;
    down) with_lock cmd_down ;;
    status) cmd_status ;;
    logs) cmd_logs ;;
    *) echo "usage: $0 {fetch|up|down|status|logs}" >&2; exit 2 ;;
esac
