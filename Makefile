# Gangline — every target installs what it needs itself.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: k8s k8s-tools k8s-validate
.PHONY: help venv browser screenshots lint typecheck imports check test test-unit schemas infra-up infra-down bench-core simulate-philly simulate-alibaba simulate-policy bench-sim bench-sim-core bench-sim-services up down run bench-e2e fuzz-api chaos test-analytics-restart fuzz bench-vs-slurm bench-restart chaos-brokers test-brokers

help:
	@echo "make run        start Kafka, PostgreSQL, every service and a simulated GPU cluster, and show it working"
	@echo "make up / down  start / stop all of that in the background (CLUSTER=spec.yaml to choose the cluster)"
	@echo "make bench-e2e  request-to-grant throughput and latency through Kafka with 1,000 simulated nodes"
	@echo "make bench-vs-slurm  Gangline against a single-host Slurm 22.05 on the same 16x8-GPU fake cluster, real processes (VS_SLURM_ARGS=--quick)"
	@echo "make bench-restart  placement's restart over a generated history, before and after a snapshot (BENCH_ARGS=\"--jobs 1000000\")"
	@echo "make chaos      kill -9 every decision service under load, restart the broker, fail two nodes; check the log and replay it (own broker, CHAOS_ARGS)"
	@echo "make chaos-brokers  the same on three Kafka nodes of its own, one of them killed -9: nothing acknowledged is lost"
	@echo "make test       run the whole test suite against a real Kafka broker and PostgreSQL"
	@echo "make infra-up   start Kafka (KRaft) and PostgreSQL on 127.0.0.1 (KAFKA_NODES=3: a replicated broker); make infra-down stops them"
	@echo "make schemas    regenerate schemas/ from the event models"
	@echo "make k8s        regenerate deploy/k8s/kafka.yaml (Strimzi) and validate deploy/k8s offline with kubeconform"
	@echo "make check      ruff + mypy + the import-layering contracts"
	@echo "make bench-core benchmark the scheduling core"
	@echo "make simulate-philly  the Philly trace: Gangline vs baselines, report and plots in docs/sim/"
	@echo "make bench-sim        time the simulator on the full Philly trace under contention (figures printed, not asserted)"
	@echo "make bench-sim-core   time the core's gated simulator on 8,000 contended Philly jobs (3 runs, medians, grant digest)"
	@echo "make bench-sim-services  time the services' own decisions on 3,000 contended Philly jobs (3 runs, medians)"
	@echo "make simulate-alibaba the Alibaba 2023 GPU-sharing packing experiment, report in docs/sim/"
	@echo "make simulate-policy  the default profile on held-out work (Philly's second half, a synthetic trace), issue 15's goals"
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

# KAFKA_NODES=3: three KRaft nodes (each broker and controller) on GANGLINE_KAFKA_PORT, +2, +4 (9092, 9094,
# 9096; their controllers one port above each), the topics with three replicas and min.insync.replicas=2.
# Unset: one node, or the size the running cluster was started with.
KAFKA_NODES ?=
infra-up: venv
	$(if $(KAFKA_NODES),GANGLINE_KAFKA_NODES=$(KAFKA_NODES)) deploy/local/kafka.sh up
	deploy/local/postgres.sh up

infra-down:
	deploy/local/kafka.sh down; kafka=$$?; deploy/local/postgres.sh down && exit $$kafka

db-migrate: venv
	$(PY) -m gangline.store.migrate

# --- Kubernetes (deploy/k8s): validated offline, in make test too (tests/unit/deploy/test_k8s.py) ---
# kubeconform, pinned, built from the Go module proxy into .cache/bin once; the Kubernetes and CRD schemas
# it checks against are in the repository (deploy/k8s/schemas/SOURCE), so nothing else is downloaded.
GO ?= $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)
KUBECONFORM_VERSION := v0.7.0
KUBECONFORM := .cache/bin/kubeconform
$(KUBECONFORM):
	mkdir -p .cache/bin
	GOBIN=$(abspath .cache/bin) GOFLAGS=-mod=mod $(GO) install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)

k8s-tools: $(KUBECONFORM)

k8s-validate: $(KUBECONFORM)
	deploy/k8s/validate.sh

# The Strimzi resources from schemas/topics.yaml and deploy/kafka/access.yaml, then the validation.
k8s: venv $(KUBECONFORM)
	PYTHONPATH=libs:. $(PY) -m gangline.bus.strimzi --out deploy/k8s/kafka.yaml
	deploy/k8s/validate.sh

# ruff and mypy, then the whole suite against a real broker and database; stops what it started,
# fails when no test ran.
test: venv check browser $(KUBECONFORM)
	deploy/local/run-tests.sh

# The dashboard's browser tests (tests/e2e/test_dashboard.py) drive Debian's chromium through Playwright's
# executable_path: installed with apt when missing, never a browser download (`playwright install`).
# Where apt cannot install it (not root), those tests skip and say why; the rest of make test runs.
browser:
	@command -v chromium >/dev/null || { echo "chromium missing: installing Debian's chromium with apt-get"; \
	  export DEBIAN_FRONTEND=noninteractive; { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "could not install chromium: the dashboard's browser tests will be skipped"; }

# The replicated broker's short test (three KRaft nodes of its own, one killed -9 under load), kept out of
# make test for its length; make chaos-brokers is the full run.
test-brokers: venv
	GANGLINE_TEST_BROKERS=1 deploy/local/run-tests.sh tests/e2e/test_replicated_broker.py

# Refresh the dashboard screenshots the README shows (docs/dashboard/): the browser tests, saving there.
screenshots: venv browser
	GANGLINE_SCREENSHOTS=$(CURDIR)/docs/dashboard deploy/local/run-tests.sh tests/e2e/test_dashboard.py

# Only the tests that need neither Kafka nor PostgreSQL; starts nothing.
test-unit: venv $(KUBECONFORM)
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

# Gangline side by side with Slurm (Debian's 22.05 packages, installed with apt-get when missing; the
# recipe of ../shared/slurm-peer) on deploy/clusters/vs-slurm.yaml: idle latency, the peer's seeded mixed
# workload, preemption of a full cluster and submission throughput, real processes on both sides; prints
# a table with the ratios and one JSON line, and stops and removes everything it started. Needs root and
# the running broker (make infra-up) and PostgreSQL (the API's submissions). About 11 minutes in full;
# VS_SLURM_ARGS=--quick for a short run.
VS_SLURM_ARGS ?=
bench-vs-slurm: venv
	PYTHONPATH=libs:. $(PY) -m services.bench.vs_slurm $(VS_SLURM_ARGS)
bench-restart: venv
	$(PY) -m services.bench.restart $(BENCH_ARGS)

# Chaos under load on a broker of its own (127.0.0.1:19192, its own data dir; never the shared 9092):
# SIGKILL of each decision service 3 times, one broker restart on its kept data, a silent node and an
# XID 79, then the invariant checker and `gangline replay --verify --decider all` over the log. About
# 5 minutes; prints one JSON summary and fails on any violation. Its short version runs in make test
# (tests/e2e/test_chaos.py).
CHAOS_ARGS ?=
chaos: venv
	PYTHONPATH=libs:. $(PY) -m services.bench.chaos $(CHAOS_ARGS)

# The same on a replicated broker of its own: three KRaft nodes on 127.0.0.1:39092-39097 (own data dirs
# under .cache/kafka/39092; never the shared 9092 nor CI's 19092), the node leading the most partitions
# killed -9 under load and left dead; every acknowledged request must be readable, the services must go
# on deciding, nothing granted twice. About 5 minutes. Its short slice (no service kills) runs in make
# test (tests/e2e/test_replicated_broker.py).
CHAOS_BROKERS_ARGS ?=
chaos-brokers: venv
	PYTHONPATH=libs:. $(PY) -m services.bench.chaos --kafka-nodes 3 --port 39092 $(CHAOS_BROKERS_ARGS)

# schemathesis against the API's OpenAPI (every phase and check) on a real API process, on the
# running Kafka and PostgreSQL (make infra-up); prints schemathesis' summary and report figures.
# The bounded slice of it runs in make test (tests/integration/api/test_fuzz.py).
# Every check runs, positive_data_acceptance too: any cursor of a list's pattern is a position in it, and
# the two rules of a submission JSON Schema cannot say (min_workers <= workers <= max_workers; command and
# env together at most 256 KiB) are kept by the valid cases schemathesis generates
# (tests/integration/api/schemathesis_hooks.py); FUZZ_API_EXCLUDE=check,... leaves checks out.
FUZZ_API_EXAMPLES ?= 500
FUZZ_API_CHECKS ?= all
FUZZ_API_EXCLUDE ?=
test-analytics-restart: venv
	deploy/local/run-tests.sh -q tests/e2e/test_analytics.py

fuzz-api: venv
	PYTHONPATH=libs:. $(PY) tests/integration/api/fuzz_api.py --max-examples $(FUZZ_API_EXAMPLES) \
		--checks $(FUZZ_API_CHECKS) --exclude-checks "$(FUZZ_API_EXCLUDE)"

# The full fuzz (tests/e2e/fuzz_requests.py): FUZZ_INPUTS schema-derived (hypothesis-jsonschema) and mutated
# records into jobs.requests of the services run as processes on topics of their own, and schemathesis
# against a real API process for FUZZ_API_MAX_TIME seconds beside it (the checks of fuzz-api); on the
# running Kafka and PostgreSQL (make infra-up). Prints the figures, then one JSON line; fails when an input
# went unanswered, a service exited, a valid job sent afterwards was not granted or an API check failed.
# The bounded slice runs in make test (tests/e2e/test_fuzz_requests.py).
FUZZ_INPUTS ?= 100000
FUZZ_API_MAX_TIME ?= 720
fuzz: venv
	PYTHONPATH=libs:. $(PY) tests/e2e/fuzz_requests.py --inputs $(FUZZ_INPUTS) --api-examples 100000 \
		--api-max-time $(FUZZ_API_MAX_TIME) --api-exclude-checks "$(FUZZ_API_EXCLUDE)"

# --- trace-driven simulation (gangline.sim); traces live in ../shared/traces ---
TRACES ?= ../shared/traces

PHILLY := $(TRACES)/pollux-philly/philly.csv

# The full trace on the Philly-sized cluster (load ~15%: nothing waits), on the same cluster cut to a
# fifth (490 GPUs, load ~76%: it really queues) and to a quarter (616 GPUs, ~61%), then the
# 4x-arrivals window of the first 12k jobs, then the first 8,000 jobs on the contended cluster.
# Every campaign runs the three baselines and the core's simulator under the default profile;
# --services adds a row through the services' own handlers (admission, quota, placement, preemption,
# node_health on an in-memory bus) where that finishes in minutes on the 2-core box: the full trace
# on the contended and quarter clusters does not (docs/sim/README.md, "Simulator speed").
simulate-philly: venv
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly.yaml \
		--queues deploy/queues/philly.yaml --services --no-progress \
		--report docs/sim/philly-report.json --plots docs/sim/philly
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly-contended.yaml \
		--queues deploy/queues/philly-contended.yaml --no-progress \
		--report docs/sim/philly-contended-report.json --plots docs/sim/philly-contended
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly-quarter.yaml \
		--queues deploy/queues/philly-quarter.yaml --no-progress \
		--report docs/sim/philly-quarter-report.json --plots docs/sim/philly-quarter
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly.yaml \
		--queues deploy/queues/philly.yaml --time-scale 4 --limit 12000 --cycle-s 60 --services --no-progress \
		--report docs/sim/philly-x4-12k-report.json --plots docs/sim/philly-x4-12k
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly-contended.yaml \
		--queues deploy/queues/philly-contended.yaml --limit 8000 --services --no-progress \
		--report docs/sim/philly-contended-8k-report.json --plots docs/sim/philly-contended-8k

ALIBABA := $(TRACES)/alibaba-gpu-v2023/openb_pod_list_default.csv

# FGD-style packing on the Alibaba 2023 GPU-sharing trace: every pod at once, none ends (core
# simulator only: the services cannot register shared-GPU nodes yet).
simulate-alibaba: venv
	$(BIN)/gangline simulate --trace $(ALIBABA) --cluster deploy/clusters/alibaba-openb.yaml \
		--time-scale 1e6 --hold --sample-s 1 --baselines k8s-first-fit --no-progress \
		--report docs/sim/alibaba-packing-report.json

# The default profile on work it was not tuned on (docs/policy.md): the first 8,000 jobs of Philly's
# second half (--skip 41124) on the contended cluster, and a synthetic gang-heavy generic-CSV trace
# (python -m gangline.sim.synthetic, seed 15) on the vs-slurm cluster; then issue 15's goals for each.
SYNTHETIC := docs/sim/synthetic/synthetic-4000.csv
# The default and the default with the gate's line shortest run first (docs/policy.md), in one run each.
POLICY_PROFILES := --profile deploy/profiles/default.yaml --profile deploy/profiles/default-shortest.yaml
simulate-policy: venv
	mkdir -p docs/sim/synthetic
	PYTHONPATH=libs $(PY) -m gangline.sim.synthetic --out $(SYNTHETIC) --jobs 4000 --gpus 128 --seed 15
	$(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly-contended.yaml \
		--queues deploy/queues/philly-contended.yaml --skip 41124 --limit 8000 --no-progress \
		$(POLICY_PROFILES) --report docs/sim/philly-contended-h2-8k-report.json
	$(BIN)/gangline simulate --trace $(SYNTHETIC) --format generic --cluster deploy/clusters/vs-slurm.yaml \
		--queues deploy/queues/synthetic.yaml --no-progress $(POLICY_PROFILES) --report docs/sim/synthetic-report.json
	for report in docs/sim/philly-contended-h2-8k-report.json docs/sim/synthetic-report.json; do \
		for policy in default default-shortest; do \
			PYTHONPATH=libs $(PY) -m gangline.sim.goals $$report --policy $$policy || exit 1; done; done

# Simulator speed under contention: the full trace, the baselines and the default profile; sim_wall_s
# printed per policy. BENCH_SIM_ARGS="--baselines none" times the default profile alone (issue 15's 60 s).
BENCH_SIM_ARGS ?=
bench-sim: venv
	time $(BIN)/gangline simulate --trace $(PHILLY) --cluster deploy/clusters/philly-contended.yaml \
		--queues deploy/queues/philly-contended.yaml --no-progress --report /tmp/gangline-bench-sim.json \
		$(BENCH_SIM_ARGS)

# The core's gated simulator (the default profile's row of gangline simulate) timed like the services
# below: CPU and wall, the load, and a digest of every grant (job, allocation, nodes, GPUs, time), the
# same before and after a speed-up (BENCH_SIM_CORE_ARGS="--runs 1" for the whole trace).
BENCH_SIM_CORE_ARGS ?= --limit 8000 --runs 3
bench-sim-core: venv
	PYTHONPATH=libs:. $(PY) -m services.bench.sim_services --engine core --trace $(PHILLY) \
		--cluster deploy/clusters/philly-contended.yaml --queues deploy/queues/philly-contended.yaml \
		$(BENCH_SIM_CORE_ARGS)

# The services' own decisions timed: 3 runs of the first 3,000 contended jobs (CPU and wall, medians,
# load, and a digest of every grant: the same in every run and before and after a speed-up).
BENCH_SIM_SERVICES_ARGS ?= --limit 3000 --runs 3
bench-sim-services: venv
	PYTHONPATH=libs:. $(PY) -m services.bench.sim_services --trace $(PHILLY) \
		--cluster deploy/clusters/philly-contended.yaml --queues deploy/queues/philly-contended.yaml \
		$(BENCH_SIM_SERVICES_ARGS)
