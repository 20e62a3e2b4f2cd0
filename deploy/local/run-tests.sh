#!/usr/bin/env bash
# `make test`: start Kafka and PostgreSQL, run the whole pytest suite against them, stop them again.
# Stops exactly what this run started (always, also on failure or Ctrl-C), so a broker that was
# already up for other work stays up. Arguments go to pytest. Exits with pytest's status: 5 when
# no test ran, which counts as a failure.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

started=()
stop_started() {
    local service
    for service in "${started[@]}"; do
        "deploy/local/$service" down || echo "run-tests.sh: could not stop $service" >&2
    done
}
trap stop_started EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for service in kafka.sh postgres.sh; do
    # Recorded before `up`, so that half a start is cleaned up too.
    "deploy/local/$service" status >/dev/null 2>&1 || started+=("$service")
    "deploy/local/$service" up || exit 1
done

.venv/bin/pytest "$@"
status=$?
if ((status == 5)); then
    echo "run-tests.sh: pytest ran no test" >&2
fi
exit "$status"
