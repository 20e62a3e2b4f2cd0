"""Every service's ``/metrics`` on a running system: the catalogue's families with their labels, figures
that match what happened, and consumer lag that reads 0 once the consumers are caught up.

Two simulated 8-GPU H100 nodes (NodeAgents on the NVML stand-in) run: team-b's job borrowing 2 of
team-a's idle GPUs, two preemptible jobs of the unlimited ``default`` queue that an urgent 8-GPU job
preempts (they then wait: 2 GPUs are left, stranded), an unreadable request (dead-lettered) and an XID
on one GPU. Then each service is scraped until its figures say so and its lag reads 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness import LogReader, Tasks, private_topics, request_bytes, send_raw, service_env, start_pipeline
from e2e.test_stories import h100_nodes
from gangline.events.allocations import AllocationGranted
from gangline.events.jobs import JobPreempted, JobRequeued
from gangline.events.topics import dead_letter_topic
from gangline.telemetry.metrics import CONSUMERS, FAMILIES
from services.agent.metrics import serving_agents
from services.agent.standin import StandInCluster, XidInjection
from services.api.app import create_app
from services.api.settings import ApiSettings
from services.ledger.__main__ import main as ledger_main
from services.ledger.settings import LedgerSettings

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

H100 = "H100-SXM5-80GB"
SERVICES = ("admission", "quota", "placement", "preemption", "node_health", "ledger", "api", "agent")
XID = 999
"""A code outside the catalogue: watched and counted, the GPU stays usable."""

Scrape = dict[str, Metric]


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


async def scrape(client: httpx.AsyncClient, port: int) -> Scrape:
    response = await client.get(f"http://127.0.0.1:{port}/metrics")
    response.raise_for_status()
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def check_catalogue(scraped: Scrape, service: str) -> None:
    """``service`` serves each family the catalogue says it serves, of its type, with exactly its labels."""
    for family in FAMILIES.values():
        if service not in family.services:
            continue
        metric = scraped.get(family.name.removesuffix("_total"))
        assert metric is not None, f"{service} does not serve {family.name}"
        assert metric.type == family.kind, (family.name, metric.type)
        for sample in metric.samples:
            extra = {"le"} if sample.name.endswith("_bucket") else set()
            assert set(sample.labels) == set(family.labels) | extra, (service, sample)


def value(scraped: Scrape, family: str, sample: str | None = None, **labels: str) -> float:
    """The sum of ``family``'s samples (named ``sample``, default the family's own) matching ``labels``."""
    metric = scraped.get(family.removesuffix("_total"))
    if metric is None:
        return 0.0
    name = sample or family
    return sum(
        s.value
        for s in metric.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def lag(scraped: Scrape, service: str) -> float | None:
    """The service's lag over all its topics; None while it serves none yet."""
    metric = scraped.get("gangline_consumer_lag_records")
    samples = [s for s in metric.samples if s.labels.get("service") == service] if metric else []
    return sum(s.value for s in samples) if samples else None


async def test_every_service_serves_its_metrics_and_lag_reads_zero_once_caught_up(
    kafka_bootstrap: str, pg_dsn: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    team_a, team_b = f"team-a-{run}", f"team-b-{run}"
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(
        f"cohorts:\n  - name: lab-{run}\nqueues:\n  - name: default\n    unlimited: true\n"
        f"  - name: {team_a}\n    cohort: lab-{run}\n    quotas: {{{H100}: {{nominal: 4}}}}\n"
        f"  - name: {team_b}\n    cohort: lab-{run}\n    quotas: {{{H100}: {{nominal: 4}}}}\n",
        encoding="utf-8",
    )
    *metric_ports, api_port = free_ports(len(SERVICES) + 1)
    ports = dict(zip(SERVICES, metric_ports, strict=True))
    async with private_topics(kafka_bootstrap, "metrics") as topics:
        env = service_env(kafka_bootstrap, topics, queues_file=str(queues_file), idle_commit_ms="100")
        cluster = StandInCluster(
            spec=h100_nodes(2),
            bootstrap=kafka_bootstrap,
            topics=topics,
            group_id=f"g-{topics.prefix.rstrip('.')}.standin",
            heartbeat_s=3.0,
        )
        ledger = LedgerSettings.from_env(
            {},
            kafka_bootstrap=kafka_bootstrap,
            topic_prefix=topics.prefix,
            group_prefix=topics.prefix + "ledger",
            pg_dsn=pg_dsn,
            poll_timeout_ms=100,
            metrics_port=ports["ledger"],
        )
        api = ApiSettings.from_env(
            {},
            kafka_bootstrap=kafka_bootstrap,
            topic_prefix=topics.prefix,
            pg_dsn=pg_dsn,
            port=api_port,
            queues_file=str(queues_file),
            metrics_port=ports["api"],
        )
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(api), host="127.0.0.1", port=api_port, log_config=None, access_log=False
            )
        )
        tasks = Tasks()
        agents = serving_agents(lambda: cluster.agents.values(), host="127.0.0.1", port=ports["agent"])
        async with agents, httpx.AsyncClient(timeout=10) as client:
            try:
                tasks.start("nodes", cluster.run())
                await cluster.ready.wait()
                tasks.start("ledger", ledger_main(ledger))
                tasks.start("api", server.serve())
                start_pipeline(tasks, env, metrics_ports=ports)
                async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:
                    await _drive(kafka_bootstrap, topics.requests, team_b, run, log, tasks.check)
                await cluster.inject_xid(XidInjection(next(iter(cluster.agents)), "gpu0", XID))
                await client.get(f"http://127.0.0.1:{api_port}/healthz")
                scraped = await _scrape_until_settled(client, ports, tasks.check)
                decision = ("admission", "quota", "placement", "preemption", "node_health")
                ready = {
                    name: await client.get(f"http://127.0.0.1:{ports[name]}/readyz") for name in decision
                }
            finally:
                server.should_exit = True  # the API drains and runs its lifespan's shutdown
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(tasks.tasks["api"]), 15)
                await tasks.stop()

    # Every family of the catalogue is served by each service it names, with exactly its labels (the
    # analytics app's by tests/e2e/test_analytics.py, which runs it).
    assert {s for f in FAMILIES.values() for s in f.services} - set(scraped) == {"analytics"}
    for service in scraped:
        check_catalogue(scraped[service], service)
    # ... and what they say is what happened.
    placement, quota = scraped["placement"], scraped["quota"]
    assert value(placement, "gangline_jobs", queue="default", state="running") == 1
    assert value(placement, "gangline_jobs", queue="default", state="pending") == 2
    assert value(placement, "gangline_jobs", queue=team_b, state="running") == 1
    assert value(placement, "gangline_pending_jobs", queue="default") == 2
    assert value(placement, "gangline_gpus", gpu_model=H100, state="allocated") == 14
    assert value(placement, "gangline_gpus", gpu_model=H100, state="free") == 2
    assert value(placement, "gangline_fragmented_gpus", gpu_model=H100) == 2
    grants = "gangline_request_to_grant_seconds_count"
    assert value(placement, "gangline_request_to_grant_seconds", grants, queue="default") == 3
    assert value(placement, "gangline_request_to_grant_seconds", grants, queue=team_b) == 1
    assert value(quota, "gangline_quota_gpus", queue=team_b, gpu_model=H100, kind="nominal") == 4
    assert value(quota, "gangline_quota_gpus", queue=team_b, gpu_model=H100, kind="used") == 6
    assert value(quota, "gangline_quota_gpus", queue=team_b, gpu_model=H100, kind="borrowed") == 2
    assert value(quota, "gangline_quota_gpus", queue=team_a, gpu_model=H100, kind="lent") == 2
    assert value(quota, "gangline_fair_share", queue=team_b) > value(
        quota, "gangline_fair_share", queue=team_a
    )
    waits = "gangline_admission_wait_seconds_count"
    assert value(quota, "gangline_admission_wait_seconds", waits, queue=team_b) == 1
    preemption = scraped["preemption"]
    assert value(preemption, "gangline_preemptions_total", queue="default", reason="priority") == 2
    assert value(preemption, "gangline_gpu_hours_lost_total", queue="default") == 0  # both checkpointed
    admission = scraped["admission"]
    letters = dead_letter_topic(topics.requests)
    assert value(admission, "gangline_dead_letters_total", topic=letters) == 1
    # The ledger reads jobs.requests too, and dead-letters what it cannot read as well.
    assert value(scraped["ledger"], "gangline_dead_letters_total", topic=letters) == 1
    assert value(admission, "gangline_decisions_total", service="admission", kind="job.admitted") == 4
    assert value(admission, "gangline_transactions_total", service="admission", result="committed") >= 3
    assert value(scraped["api"], "gangline_http_requests_total", route="/healthz", code="200") >= 1
    agent = scraped["agent"]
    assert value(agent, "gangline_gpu_xid_errors_total", gpu="gpu0", xid=str(XID)) == 1
    assert len(scraped["agent"]["gangline_gpu_temperature_celsius"].samples) == 16
    for service in CONSUMERS:
        assert lag(scraped[service], service) == 0, service
    # Caught up, each decision service says it is ready (the leaders: restored and processing).
    for name, answer in ready.items():
        assert (answer.status_code, answer.text) == (
            200,
            "ready: processing, its state restored from the log\n",
        ), name


async def _drive(
    bootstrap: str, requests: str, queue_b: str, run: str, log: LogReader, check: Callable[[], None]
) -> None:
    """team-b borrows; two preemptible jobs fill the other node; an urgent gang takes it from them.

    Job ids are the run's own: the ledger's database outlives the test's topics."""
    borrower, victims, urgent = f"b-{run}", [f"low-0-{run}", f"low-1-{run}"], f"urgent-{run}"

    def granted(job: str) -> bool:
        return any(g.job_id == job for g in log.of(log.topics[1], AllocationGranted))

    await send_raw(
        bootstrap,
        requests,
        [(borrower, request_bytes(borrower, queue=queue_b, workers=1, gpus_per_worker=6))],
    )
    await log.until(lambda: granted(borrower), timeout_s=60, check=check)
    await send_raw(
        bootstrap,
        requests,
        [
            (v, request_bytes(v, queue="default", workers=1, gpus_per_worker=4, preemptible=True))
            for v in victims
        ],
    )
    await log.until(lambda: all(granted(v) for v in victims), timeout_s=60, check=check)
    request = request_bytes(urgent, queue="default", workers=1, gpus_per_worker=8, priority=100)
    await send_raw(bootstrap, requests, [(urgent, request), ("junk", b"{not json")])

    def preempted_and_requeued() -> bool:
        preempted = {p.job_id for p in log.of(log.topics[0], JobPreempted)}
        requeued = {r.job_id for r in log.of(log.topics[0], JobRequeued)}
        return granted(urgent) and preempted >= set(victims) and requeued >= set(victims)

    await log.until(preempted_and_requeued, timeout_s=90, check=check)


async def _scrape_until_settled(
    client: httpx.AsyncClient, ports: dict[str, int], check: Callable[[], None]
) -> dict[str, Scrape]:
    """Scrape every service until the figures the test reads are in and each consumer's lag reads 0."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while True:
        check()
        scraped = {service: await scrape(client, port) for service, port in ports.items()}
        placement, agent = scraped["placement"], scraped["agent"]
        settled = (
            value(placement, "gangline_jobs", queue="default", state="pending") == 2
            and value(placement, "gangline_gpus", state="allocated") == 14
            and value(agent, "gangline_gpu_xid_errors_total") >= 1
            and len(agent.get("gangline_gpu_temperature_celsius", Metric("x", "", "gauge")).samples) == 16
            and value(scraped["api"], "gangline_http_requests_total") >= 1
            and all(lag(scraped[service], service) == 0 for service in CONSUMERS)
        )
        if settled:
            return scraped
        assert loop.time() < deadline, "the figures never settled: " + ", ".join(
            f"{s} lag {lag(scraped[s], s)}" for s in CONSUMERS
        )
        await asyncio.sleep(0.2)
