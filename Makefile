# Gangline — every target installs what it needs itself.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: help venv lint typecheck imports check test test-unit schemas infra-up infra-down bench-core simulate-philly bench-sim up down run bench-e2e fuzz-api fuzz

help:
	@echo "make run        start Kafka, PostgreSQL, every service and a simulated GPU cluster, and show it working"
	@echo "make up / down  start / stop all of that in the background (CLUSTER=spec.yaml to choose the cluster)"
	@echo "make bench-e2e  request-to-grant throughput and latency through Kafka with 1,000 simulated nodes"
	@echo "make test       run the whole test suite against a real Kafka broker and PostgreSQL"
	@echo "make infra-up   start Kafka (KRaft) and PostgreSQL on 127.0.0.1; make infra-down stops them"
	@echo "make schemas    regenerate schemas/ from the event models"
	@echo "make check      ruff + mypy + the import-layering contracts"
	@echo "make bench-core benchmark the scheduling core"
	@echo "make simulate-philly  the Philly trace: Gangline vs baselines, report and plots in docs/sim/"
	@echo "make bench-sim        time the simulator on the full Philly trace under contention (figures printed, not asserted)"
	@echo "make fuzz       FUZZ_INPUTS records fuzzed into jobs.requests (services as processes) and the API fuzz beside it; one JSON line"
	@echo "make fuzz-api   schemathesis, every check, against a real API process (FUZZ_API_EXAMPLES per operation)"

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(BIN)/ruff check libs services tests
	$(BIN)/ruff format --check libs services tests

typecheck: venv
	$(BIN)/mypy

# The layering contracts in pyproject.toml ([tool.importlinter]).
imports: venv
	$(BIN)/lint-imports

check: lint typecheck imports

schemas: venv
	$(PY) -m gangline.events.schemagen schemas

# --- real infrastructure and tests (deploy/local/*.sh; ports: GANGLINE_KAFKA_PORT, GANGLINE_PG_PORT) ---
.PHONY: db-migrate

infra-up: venv
	deploy/local/kafka.sh up
	deploy/local/postgres.sh up

infra-down:
	deploy/local/kafka.sh down; kafka=$$?; deploy/local/postgres.sh down && exit $$kafka

db-migrate: venv
	$(PY) -m gangline.store.migrate

# ruff and mypy, then the whole suite against a real broker and database; stops what it started,
# fails when no test ran.
test: venv check
	deploy/local/run-tests.sh

# Only the tests that need neither Kafka nor PostgreSQL; starts nothing.
test-unit: venv
	$(BIN)/pytest -m "not kafka and not postgres"

# Benchmark of the pure scheduling core (one core; prints one JSON line per case).
bench-core: venv
	$(PY) -m gangline.bench.core
	$(PY) -m gangline.bench.queueing

# --- the whole system (deploy/local/up.sh, run.sh; services/<name>, simulated nodes) ---
up: venv
	deploy/local/up.sh up

down:
	deploy/local/up.sh down

run: venv
	deploy/local/run.sh

bench-e2e: venv
	$(PY) -m services.bench.e2e $(BENCH_ARGS)

# schemathesis against the API's OpenAPI (every phase and check) on a real API process, on the
# running Kafka and PostgreSQL (make infra-up); prints schemathesis' summary and report figures.
# The bounded slice of it runs in make test (tests/integration/api/test_fuzz.py).
# positive_data_acceptance is left out by default: it expects every schema-valid request to succeed,
# and three of the API's refusals cannot be said in JSON Schema (min_workers <= workers <= max_workers,
# the 256 KiB of command and env together, a page cursor the API did not hand out); FUZZ_API_EXCLUDE=
# runs it too.
FUZZ_API_EXAMPLES ?= 500
FUZZ_API_CHECKS ?= all
FUZZ_API_EXCLUDE ?= positive_data_acceptance
fuzz-api: venv
	PYTHONPATH=libs:. $(PY) tests/integration/api/fuzz_api.py --max-examples $(FUZZ_API_EXAMPLES) \
		--checks $(FUZZ_API_CHECKS) --exclude-checks "$(FUZZ_API_EXCLUDE)"

# The full fuzz (tests/e2e/fuzz_requests.py): FUZZ_INPUTS schema-derived (hypothesis-jsonschema) and mutated
# records into jobs.requests of the services run as processes on topics of their own, and schemathesis
# against a real API process for FUZZ_API_MAX_TIME seconds beside it (the checks of fuzz-api); on the
# running Kafka and PostgreSQL (make infra-up). Prints the figures, then one JSON line; fails when an input
# went unanswered, a service exited, a valid job sent afterwards was not granted or an API check failed.
# The bounded slice runs in make test (tests/e2e/test_fuzz_requests.py).
FUZZ_INPUTS ?= 92000
FUZZ_API_MAX_TIME ?= 720
fuzz: venv
	PYTHONPATH=libs:. $(PY) tests/e2e/fuzz_requests.py --inputs $(FUZZ_INPUTS) --api-examples 100000 \
		--api-max-time $(FUZZ_API_MAX_TIME) --api-exclude-checks "$(FUZZ_API_EXCLUDE)"

# --- trace-driven simulation (gangline.sim); traces live in ../shared/traces ---
TRACES ?= ../shared/traces

PHILLY := $(TRACES)/pollux-philly/philly.csv

# The full trace on the Philly-sized cluster (load ~15%: nothing waits), on the same cluster cut to a
# fifth (490 GPUs, load ~76%: it really queues) and to a quarter (616 GPUs, ~61%), then the
# 4x-arrivals window of the first 12k jobs.
simulate-philly: venv
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly.yaml \
		--queues deploy/queues/philly.yaml \
		--report docs/sim/philly-report.json --plots docs/sim/philly
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly-contended.yaml \
		--queues deploy/queues/philly-contended.yaml \
		--report docs/sim/philly-contended-report.json --plots docs/sim/philly-contended
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly-quarter.yaml \
		--queues deploy/queues/philly-quarter.yaml \
		--report docs/sim/philly-quarter-report.json --plots docs/sim/philly-quarter
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly.yaml \
		--queues deploy/queues/philly.yaml --time-scale 4 --limit 12000 --cycle-s 60 \
		--report docs/sim/philly-x4-12k-report.json --plots docs/sim/philly-x4-12k

# Simulator speed under contention: the full trace, all three policies; sim_wall_s printed per policy.
bench-sim: venv
	time $(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly-contended.yaml \
		--queues deploy/queues/philly-contended.yaml --no-progress --report /tmp/gangline-bench-sim.json
