#!/usr/bin/env bash
# `make run`: start Kafka, PostgreSQL, every service and a simulated cluster, feed it a
# time-compressed slice of the Philly trace plus a few gangs, a preemption and a node failure,
# show a live table (queues, GPUs by state, the last events: services/agent/demo_view.py), and
# keep running until Ctrl-C, which stops everything cleanly.
#
# Environment: CLUSTER (deploy/clusters/default.yaml), TIME_SCALE (0.01: a simulated hour takes
# 36 s), FAIL_NODE (h100-0) and FAIL_AFTER_S (45): the node that goes silent, and when;
# DEMO_JOBS (120): how many Philly jobs to send.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${GANGLINE_PYTHON:-$ROOT/.venv/bin/python}"
export GANGLINE_FAKE_NODES_ARGS="--time-scale ${TIME_SCALE:-0.01} --heartbeat-s 1 --fail ${FAIL_NODE:-h100-0}@${FAIL_AFTER_S:-45}"
export GANGLINE_SILENCE_S="${GANGLINE_SILENCE_S:-5}"

stopped=0
cleanup() { [[ $stopped == 1 ]] && return; stopped=1; echo; echo "stopping everything..."; "$ROOT/deploy/local/up.sh" down; }
trap cleanup EXIT
trap 'exit 130' INT TERM

"$ROOT/deploy/local/up.sh" up
# The demo prints where to look (API, metrics, analytics) above its table.
# The demo feeds jobs and watches every topic: the project's own tooling, so the broker's super user.
export GANGLINE_KAFKA_USERNAME=admin
GANGLINE_KAFKA_PASSWORD="$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["admin"])' \
    "${GANGLINE_KAFKA_CREDENTIALS:-$ROOT/deploy/kafka/credentials.dev.yaml}")"
export GANGLINE_KAFKA_PASSWORD
# It signs what it writes with the super user's key, derived from the master key up.sh made (readers check writers).
if [[ "${GANGLINE_TRUST:-on}" != off ]]; then
    export GANGLINE_TRUST_KEY_FILE="${GANGLINE_TRUST_KEY_FILE:-$ROOT/.cache/gangline-up/trust.key}"
fi
"$PY" -m services.agent.demo --jobs "${DEMO_JOBS:-120}"
echo "The system keeps running (API at http://127.0.0.1:${GANGLINE_API_PORT:-8080}, dashboard at http://127.0.0.1:${GANGLINE_API_PORT:-8080}/dashboard/); Ctrl-C stops everything."
while true; do sleep 1; done
