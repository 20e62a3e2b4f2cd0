#!/usr/bin/env bash
# Apache Kafka 4.x (KRaft) on 127.0.0.1, run from the jars Maven Central serves: one broker+controller, or
# a cluster of GANGLINE_KAFKA_NODES of them (make infra-up KAFKA_NODES=3).
#
#   deploy/local/kafka.sh fetch    copy the pinned jars (deploy/kafka/pom.xml) into .cache/kafka/libs/
#   deploy/local/kafka.sh up       format a throwaway data dir, start the broker, wait until it answers
#                                  a metadata request, create the topics of schemas/topics.yaml
#   deploy/local/kafka.sh down     stop it (SIGTERM, then SIGKILL after a timeout), delete its data
#   deploy/local/kafka.sh stop     stop it the same way, keeping its data
#   deploy/local/kafka.sh start    start it again on the data it kept (no format: the SCRAM credentials,
#                                  topics, offsets and transactions of the last run are all still there);
#                                  on a cluster, starts the nodes that do not run (one killed, say)
#   deploy/local/kafka.sh restart  stop, then start: a broker restart that loses nothing
#   deploy/local/kafka.sh status   exit 0 when our broker on this port runs (every node of it), 1 otherwise
#   deploy/local/kafka.sh pids     the pid of each node that runs, one `node pid` a line
#   deploy/local/kafka.sh logs     the tail of its server.log
#
# Security: clients authenticate with SASL/SCRAM-SHA-512 on the one client listener; the principals and
# their passwords are bootstrapped at storage-format time (kafka-storage format --add-scram) from the
# credentials file; the StandardAuthorizer refuses whatever the ACLs of deploy/kafka/access.yaml (written
# at every `up`, as the admin super user) do not allow. GANGLINE_KAFKA_LISTENER_PROTOCOL=SASL_SSL puts the
# listener behind TLS (GANGLINE_KAFKA_TLS_KEYSTORE: one PEM file with the broker's key and certificate;
# GANGLINE_KAFKA_SSL_CAFILE: the CA that signed it, which this script's own clients trust).
#
# A cluster (GANGLINE_KAFKA_NODES=3 at `up`; the other commands read the size `up` recorded): node i
# (1..N) listens for clients on port+2(i-1) and for the controller quorum on port+2(i-1)+1 (9092..9097
# for three), its files under .cache/kafka/<port>/node-<i>/. Every node is a broker and a controller (KRaft
# combined mode): three JVMs rather than six on a small machine, and a quorum of three voters that
# outlives any one node, which is the failure a laptop cluster is for. (deploy/k8s runs Strimzi with
# separate controller and broker pools, as production should.) On three nodes the topics get three
# replicas and min.insync.replicas=2 (gangline.bus.admin.replication_for), the internal topics too.
#
# Environment: GANGLINE_KAFKA_PORT (9092), GANGLINE_KAFKA_CONTROLLER_PORT (port+1; one node only),
# GANGLINE_KAFKA_NODES (1),
# GANGLINE_KAFKA_HEAP (512m), GANGLINE_TOPIC_CATALOGUE (schemas/topics.yaml),
# GANGLINE_KAFKA_CREDENTIALS (deploy/kafka/credentials.dev.yaml: DEVELOPMENT ONLY),
# GANGLINE_KAFKA_ACCESS (deploy/kafka/access.yaml), GANGLINE_KAFKA_LISTENER_PROTOCOL (SASL_PLAINTEXT),
# GANGLINE_KAFKA_READY_TIMEOUT_S (90), GANGLINE_PYTHON (.venv/bin/python). Every path of an instance
# (data, logs, properties, pid) derives from the port: two brokers on two ports never share one.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PORT="${GANGLINE_KAFKA_PORT:-9092}"
HEAP="${GANGLINE_KAFKA_HEAP:-512m}"
CATALOGUE="${GANGLINE_TOPIC_CATALOGUE:-$ROOT/schemas/topics.yaml}"
READY_TIMEOUT_S="${GANGLINE_KAFKA_READY_TIMEOUT_S:-90}"
STOP_TIMEOUT_S=30
PY="${GANGLINE_PYTHON:-$ROOT/.venv/bin/python}"
# The tools this script runs are this checkout's (a venv shared by several checkouts may point elsewhere).
export PYTHONPATH="$ROOT/libs:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
CREDENTIALS="${GANGLINE_KAFKA_CREDENTIALS:-$ROOT/deploy/kafka/credentials.dev.yaml}"
ACCESS="${GANGLINE_KAFKA_ACCESS:-$ROOT/deploy/kafka/access.yaml}"
CLIENT_PROTOCOL="${GANGLINE_KAFKA_LISTENER_PROTOCOL:-SASL_PLAINTEXT}"
ADMIN_USER=admin

CACHE="$ROOT/.cache/kafka"
LIBS="$CACHE/libs"
STAMP="$LIBS/.pom.sha256"
POM="$ROOT/deploy/kafka/pom.xml"
INSTANCE="$CACHE/$PORT"
SIZEFILE="$INSTANCE/nodes"

# The cluster's size: what `up` is asked for, else what the last `up` on this port recorded.
cluster_size() {
    if [[ -n "${GANGLINE_KAFKA_NODES:-}" && "${1:-}" == up ]]; then
        echo "$GANGLINE_KAFKA_NODES"
    elif [[ -f "$SIZEFILE" ]]; then
        cat "$SIZEFILE"
    else
        echo "${GANGLINE_KAFKA_NODES:-1}"
    fi
}
NODES="$(cluster_size "${1:-}")"
[[ "$NODES" =~ ^[1-9]$ ]] || { echo "kafka.sh: GANGLINE_KAFKA_NODES must be 1..9 (got $NODES)" >&2; exit 2; }

# Select node $1 (1..NODES): its ports and paths. One node keeps the layout of a single broker
# (.cache/kafka/<port>/{data,logs,...}); a cluster's nodes live in .cache/kafka/<port>/node-<i>/.
node() {
    NODE_ID="$1"
    NODE_PORT=$((PORT + 2 * (NODE_ID - 1)))
    if ((NODES == 1)); then
        NODE_CONTROLLER_PORT="${GANGLINE_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
        NODE_DIR="$INSTANCE"
    else
        NODE_CONTROLLER_PORT=$((NODE_PORT + 1))
        NODE_DIR="$INSTANCE/node-$NODE_ID"
    fi
    PIDFILE="$NODE_DIR/kafka.pid"
    PROPS="$NODE_DIR/server.properties"
    LOGDIR="$NODE_DIR/logs"
}
node_ids() { seq 1 "$NODES"; }
node 1

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

# The pid of the selected node's broker, when it runs.
running_pid() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    # Guard against a recycled pid: it must be kafka.Kafka with this instance's properties.
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "kafka.Kafka $PROPS" || return 1
    echo "$pid"
}

# `name password` per line of the credentials file (a YAML map name: password).
credentials() {
    "$PY" - "$CREDENTIALS" <<'PYEOF'
import re, sys, yaml
creds = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
for name, password in creds.items():
    # The --add-scram syntax has no escapes: refuse what it cannot carry rather than mangle it.
    if not re.fullmatch(r"[A-Za-z0-9._-]+", str(name)) or not re.fullmatch(r"[A-Za-z0-9._~!@#%^&*+=:-]{8,}", str(password)):
        sys.exit(f"credentials: bad name or password for {name!r} (8+ characters, no spaces, commas or brackets)")
    print(name, password)
PYEOF
}

admin_password() {
    local name password found=""
    # Read every line: leaving early breaks the reader's pipe (a BrokenPipeError on stderr).
    while read -r name password; do
        [[ "$name" == "$ADMIN_USER" && -z "$found" ]] && found="$password"
    done < <(credentials)
    [[ -n "$found" ]] || die "no password for the super user '$ADMIN_USER' in $CREDENTIALS"
    echo "$found"
}

# Replication of the topics, and the controller quorum (every node votes), for a cluster of NODES.
# (Asked once per run, before any subshell renders properties: see need_replication.)
replication() { "$PY" -c 'import sys; from gangline.bus.admin import replication_for as r; print(*r(int(sys.argv[1])))' "$NODES"; }
need_replication() { [[ -n "${FACTOR:-}" ]] || read -r FACTOR MIN_ISR < <(replication); }
voters() {
    local i out=() keep_id="$NODE_ID"
    for i in $(node_ids); do node "$i"; out+=("$i@127.0.0.1:$NODE_CONTROLLER_PORT"); done
    node "$keep_id"
    local IFS=,; echo "${out[*]}"
}

# server.properties of the selected node for data dir $1, on stdout (it holds the admin password: 0600).
render_props() {
    local admin_pw
    admin_pw="$(admin_password)"
    [[ -n "${FACTOR:-}" ]] || die "need_replication first"
    sed -e "s|@PORT@|$NODE_PORT|g" -e "s|@CONTROLLER_PORT@|$NODE_CONTROLLER_PORT|g" -e "s|@DATA_DIR@|$1|g" \
        -e "s|@NODE_ID@|$NODE_ID|g" -e "s|@VOTERS@|$(voters)|g" \
        -e "s|@REPLICATION@|$FACTOR|g" -e "s|@MIN_ISR@|$MIN_ISR|g" \
        -e "s|@CLIENT_PROTOCOL@|$CLIENT_PROTOCOL|g" -e "s|@ADMIN_USER@|$ADMIN_USER|g" \
        -e "s|@ADMIN_PASSWORD@|$admin_pw|g" "$ROOT/deploy/kafka/server.properties.template"
    # A cluster's node that stops heartbeating (killed) is fenced after 6 s rather than 9, so its partitions
    # get new leaders well within node_health's 10 s of silence. Not on one node: there a starved (never
    # dead) broker fencing itself would only take every partition offline.
    if ((NODES > 1)); then
        printf '%s\n' "broker.heartbeat.interval.ms=1500" "broker.session.timeout.ms=6000"
    fi
    case "$CLIENT_PROTOCOL" in
        SASL_PLAINTEXT) ;;
        SASL_SSL)
            [[ -f "${GANGLINE_KAFKA_TLS_KEYSTORE:-}" && -f "${GANGLINE_KAFKA_SSL_CAFILE:-}" ]] \
                || die "SASL_SSL needs GANGLINE_KAFKA_TLS_KEYSTORE and GANGLINE_KAFKA_SSL_CAFILE (PEM files)"
            printf '%s\n' "ssl.keystore.type=PEM" "ssl.keystore.location=$GANGLINE_KAFKA_TLS_KEYSTORE" \
                "ssl.truststore.type=PEM" "ssl.truststore.location=$GANGLINE_KAFKA_SSL_CAFILE" \
                "ssl.endpoint.identification.algorithm=" ;;
        *) die "GANGLINE_KAFKA_LISTENER_PROTOCOL must be SASL_PLAINTEXT or SASL_SSL (got $CLIENT_PROTOCOL)" ;;
    esac
}

# This script's own clients (topics, ACLs) are the super user.
export_admin_client() {
    export GANGLINE_KAFKA_USERNAME="$ADMIN_USER" GANGLINE_KAFKA_SECURITY_PROTOCOL="$CLIENT_PROTOCOL"
    GANGLINE_KAFKA_PASSWORD="$(admin_password)"
    export GANGLINE_KAFKA_PASSWORD
    unset GANGLINE_KAFKA_PASSWORD_FILE
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Every node's client address, comma-separated (what clients of a cluster bootstrap from).
bootstrap() {
    local i out=() keep_id="$NODE_ID"
    for i in $(node_ids); do node "$i"; out+=("127.0.0.1:$NODE_PORT"); done
    node "$keep_id"
    local IFS=,; echo "${out[*]}"
}

# Create the catalogue's topics (replicated as the cluster's size says) and write the ACLs of the access
# file, after waiting up to $1 seconds for every node to have registered as a broker.
create_topics() {
    local wait_s="${1:-0}"
    if [[ -f "$CATALOGUE" ]]; then
        "$PY" -m gangline.bus.admin create-topics --bootstrap "$(bootstrap)" --catalogue "$CATALOGUE" \
            --wait-s "$wait_s" --brokers "$NODES" >&2
        "$PY" -m gangline.bus.acl apply --bootstrap "$(bootstrap)" --catalogue "$CATALOGUE" \
            --access "$ACCESS" >&2
    else
        log "no topic catalogue at $CATALOGUE: no topics created"
        "$PY" -m gangline.bus.admin wait --bootstrap "$(bootstrap)" --timeout-s "$wait_s" --brokers "$NODES" >&2
    fi
}

# Formatted, never started data dirs, made once per Kafka version (and cluster size) and copied for
# each start: saves a JVM run (kafka.tools.StorageTool) per node and `up`. Their random cluster id is
# reused, which is harmless since every start gets a fresh copy. One node: the data dir itself; a
# cluster: node-<i>/ for each node, all of one cluster id (the quorum is static: controller.quorum.voters).
formatted_template() {
    local key dir tmp
    key="$(cat "$STAMP" "$ROOT/deploy/kafka/server.properties.template" "$CREDENTIALS" | sha256sum | cut -c1-16)"
    dir="$CACHE/formatted-$key"
    ((NODES == 1)) || dir="$dir-nodes$NODES"
    if [[ ! -f "$dir/meta.properties" && ! -f "$dir/node-1/meta.properties" ]]; then
        tmp="$dir.tmp.$$"
        rm -rf "$tmp"
        mkdir -p "$tmp/data"
        # A Kafka cluster id is 16 random bytes, base64url without padding (never starting with '-').
        local cluster_id
        cluster_id="$(python3 -c 'import base64, os
while (u := base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")).startswith("-"): pass
print(u)')"
        local scram=() name password
        while read -r name password; do
            scram+=(--add-scram "SCRAM-SHA-512=[name=$name,password=$password]")
        done < <(credentials)
        local i target
        for i in $(node_ids); do
            node "$i"
            target="$tmp/data"
            ((NODES == 1)) || target="$tmp/data/node-$i"
            mkdir -p "$target"
            (umask 077; render_props "$target" >"$tmp/server-$i.properties")
            "${JVM[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$tmp/server-$i.properties" "${scram[@]}" \
                >"$tmp/format.log" 2>&1 || { cat "$tmp/format.log" >&2; rm -rf "$tmp"; die "formatting the storage failed"; }
        done
        node 1
        # Another port's `up` may have made it meanwhile: either copy is as good.
        mv -T "$tmp/data" "$dir" 2>/dev/null || true
        rm -rf "$tmp"
    fi
    echo "$dir"
}

jvm() {
    JVM=(java "-Xms${HEAP}" "-Xmx${HEAP}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20
        -Djava.awt.headless=true "-Dkafka.logs.dir=$LOGDIR"
        "-Dlog4j2.configurationFile=$ROOT/deploy/kafka/log4j2.properties" -cp "$LIBS/*")
}

ports_free() {  # the selected node's
    for p in "$NODE_PORT" "$NODE_CONTROLLER_PORT"; do
        port_open "$p" && die "127.0.0.1:$p is taken by another process; set GANGLINE_KAFKA_PORT"
    done
    return 0
}

# How many nodes of the cluster run (0..NODES).
running_nodes() {
    local i n=0
    for i in $(node_ids); do node "$i"; running_pid >/dev/null && n=$((n + 1)); done
    node 1
    echo "$n"
}

cmd_up() {
    local started running
    started="$(now)"
    fetch_locked
    ensure_venv
    export_admin_client
    running="$(running_nodes)"
    if ((running == NODES)); then
        log "already up on $(bootstrap) ($NODES node(s))"
        create_topics
        return
    fi
    ((running == 0)) || die "$running of the $NODES nodes on $PORT run: use start to start the others, or down"
    local i
    for i in $(node_ids); do node "$i"; ports_free; done
    need_replication
    jvm
    local template
    template="$(formatted_template)"
    rm -rf "$INSTANCE"
    mkdir -p "$INSTANCE"
    ((NODES == 1)) || echo "$NODES" >"$SIZEFILE"
    for i in $(node_ids); do
        node "$i"
        mkdir -p "$LOGDIR"
        if ((NODES == 1)); then cp -a "$template" "$NODE_DIR/data"; else cp -a "$template/node-$i" "$NODE_DIR/data"; fi
    done
    launch "$started"
}

# Start the broker on the data dir of an earlier `up` (kept by `stop`): the storage is not formatted
# again, so the credentials bootstrapped at format time, the topics and the log all stay as they were.
cmd_start() {
    local started
    started="$(now)"
    fetch_locked
    ensure_venv
    export_admin_client
    if (($(running_nodes) == NODES)); then
        log "already up on $(bootstrap) ($NODES node(s))"
        return
    fi
    local i
    for i in $(node_ids); do
        node "$i"
        running_pid >/dev/null && continue
        [[ -f "$NODE_DIR/data/meta.properties" ]] || die "no data dir at $NODE_DIR/data to start on: use up"
        ports_free
    done
    need_replication
    jvm
    launch "$started"
}

# Start every node that does not run (rendering its properties for its data dir), wait until each
# listens and the cluster serves with all its brokers, add the catalogue's topics and ACLs (idempotent);
# $1 is when the command started.
launch() {
    local i pids=()
    for i in $(node_ids); do
        node "$i"
        running_pid >/dev/null && continue
        mkdir -p "$LOGDIR"
        jvm  # its log dir is the node's
        (umask 077; render_props "$NODE_DIR/data" >"$PROPS")
        # setsid: the broker outlives this script and is not hit by signals sent to the caller's group.
        # 8>&- 9>&-: the broker must not inherit (and so hold forever) the lock files of this script.
        setsid "${JVM[@]}" kafka.Kafka "$PROPS" </dev/null >>"$LOGDIR/stdout.log" 2>&1 8>&- 9>&- &
        echo $! >"$PIDFILE"
        pids+=("$i")
    done

    local deadline=$((SECONDS + READY_TIMEOUT_S))
    for i in "${pids[@]}"; do
        node "$i"
        until port_open "$NODE_PORT"; do
            # kill -0, not running_pid: until setsid has exec'd java, the pid's command line is still a shell's.
            if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
                tail -n 30 "$LOGDIR/stdout.log" "$LOGDIR/server.log" >&2 2>/dev/null || true
                die "the broker exited during start-up (logs: $LOGDIR)"
            fi
            ((SECONDS < deadline)) || die "the broker did not listen on $NODE_PORT within ${READY_TIMEOUT_S}s"
            sleep 0.1
        done
    done
    node 1
    # Listening is not serving: wait for a real metadata request to be answered, then add the topics.
    create_topics "$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))"
    log "up on $(bootstrap) ($NODES node(s)): ready with topics in $(since "$1")s"
}

# Stop every node of ours on this port (SIGTERM to all, then SIGKILL after a timeout); their data stays.
stop_broker() {
    local i
    for i in $(node_ids); do node "$i"; stop_node & done
    wait
    node 1
}

stop_node() {
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
            while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
        fi
        log "stopped the broker on 127.0.0.1:$NODE_PORT (pid $pid)"
    else
        log "no broker of ours on 127.0.0.1:$NODE_PORT"
    fi
}

cmd_down() {
    stop_broker
    rm -rf "$INSTANCE"
}

cmd_stop() {
    stop_broker
    [[ -d "$NODE_DIR/data" ]] && log "data kept in $INSTANCE (start runs on it again; down deletes it)"
    return 0
}

cmd_restart() {
    stop_broker
    cmd_start
}

cmd_status() {
    local running
    running="$(running_nodes)"
    if ((running == NODES)); then
        echo "kafka up on $(bootstrap) ($NODES node(s), data $INSTANCE)"
    elif ((running > 0)); then
        echo "kafka partly up on $PORT: $running of $NODES nodes run (data $INSTANCE)"
        return 1
    else
        echo "kafka down on 127.0.0.1:$PORT"
        return 1
    fi
}

cmd_pids() {
    local i pid
    for i in $(node_ids); do node "$i"; pid="$(running_pid)" && echo "$i $pid"; done
    return 0
}

cmd_logs() {  # every node's
    local i
    for i in $(node_ids); do
        node "$i"
        [[ -f "$LOGDIR/server.log" ]] || die "no log at $LOGDIR/server.log"
        ((NODES == 1)) || echo "== node $i ($LOGDIR/server.log)"
        tail -n "${LINES:-200}" "$LOGDIR/server.log"
    done
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
    stop) with_lock cmd_stop ;;
    start) with_lock cmd_start ;;
    restart) with_lock cmd_restart ;;
    status) cmd_status ;;
    pids) cmd_pids ;;
    logs) cmd_logs ;;
    *) echo "usage: $0 {fetch|up|down|stop|start|restart|status|pids|logs}" >&2; exit 2 ;;
esac
