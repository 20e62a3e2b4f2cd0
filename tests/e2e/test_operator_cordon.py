"""Operators' cordon and drain, end to end: asked through the API (admins only), honoured by placement and
node_health, on simulated nodes over the real broker, with the ledger and the database.

Two 8-GPU nodes. A job runs on one (``busy``); the other (``spare``) is cordoned: a second job waits
(health) rather than land there. ``busy`` is drained with no grace: node_health asks its job to
checkpoint, preemption takes the GPUs back and requeues it, and nothing lands on ``busy`` again: the
drained node is empty. Uncordoning ``spare`` lets the waiting work run there.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from e2e.harness import LogReader, Tasks, audit_allocations, fake_cluster, private_topics, service_env
from e2e.harness import start_pipeline as start_services
from gangline.bus import EventProducer
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobPending, JobPreempting, JobRequeued
from gangline.events.nodes import NodeCordoned, NodeUncordoned
from gangline.replay.kafka import KafkaSource
from services.api.app import Resources, create_app
from services.api.auth import Authenticator, Tenant, TokenConfig
from services.api.settings import ApiSettings
from services.common.replay import decider_topics, load
from services.ledger.settings import LedgerSettings
from services.ledger.wiring import Ledger


def app(settings: ApiSettings, resources: Resources, auth: Authenticator) -> Any:
    return create_app(settings, resources=resources, authenticator=auth)


def live_on(grants: list[AllocationGranted], releases: list[AllocationReleased], node: str) -> list[str]:
    released = {r.allocation_id for r in releases}
    return [
        g.allocation_id
        for g in grants
        if g.allocation_id not in released and any(p.node == node for p in g.placements)
    ]


async def test_a_cordoned_node_takes_no_new_work_and_a_drained_node_empties(
    kafka_bootstrap: str, pg_dsn: str, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    spec = ClusterSpec(
        name=f"ops-{run}",
        groups=(
            NodeGroup(
                name=f"op{run}", count=2, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920
            ),
        ),
    )
    tokens = {"admin": f"tok-admin-{uuid.uuid4().hex}", "team": f"tok-team-{uuid.uuid4().hex}"}
    auth = Authenticator(
        TokenConfig(
            tenants=(
                Tenant.with_token(f"ops-{run}", tokens["admin"], admin=True),
                Tenant.with_token(f"team-{run}", tokens["team"]),
            )
        )
    )
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    team = {"Authorization": f"Bearer {tokens['team']}"}
    first, second = f"first-{run}", f"second-{run}"
    async with private_topics(kafka_bootstrap, "cordon") as topics:
        env = service_env(kafka_bootstrap, topics)
        cluster = fake_cluster(kafka_bootstrap, topics, spec, heartbeat_s=0.5)
        ledger = Ledger(
            LedgerSettings.from_env(
                {},
                kafka_bootstrap=kafka_bootstrap,
                topic_prefix=topics.prefix,
                group_prefix=topics.prefix + "ledger",
                pg_dsn=pg_dsn,
                poll_timeout_ms=100,
            ),
            pg_pool,
        )
        api_settings = ApiSettings.from_env(
            {}, kafka_bootstrap=kafka_bootstrap, topic_prefix=topics.prefix, pg_dsn=pg_dsn
        )
        tasks = Tasks()
        watched = [topics.allocations, topics.events, topics.operator]
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            tasks.start("ledger", ledger.run())
            start_services(tasks, env)
            async with (
                EventProducer(kafka_bootstrap) as producer,
                LogReader(kafka_bootstrap, watched) as log,
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(
                        app=create_app(
                            api_settings, resources=Resources(pg_pool, producer), authenticator=auth
                        )
                    ),
                    base_url="http://api",
                ) as api,
            ):

                def grants() -> list[AllocationGranted]:
                    return log.of(topics.allocations, AllocationGranted)

                def releases() -> list[AllocationReleased]:
                    return log.of(topics.allocations, AllocationReleased)

                async def ledger_says(check: Callable[[dict[str, Any]], bool]) -> None:
                    """Until the API (the ledger's projection) shows what ``check`` asks (bounded)."""
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + 60
                    while True:
                        tasks.check()
                        listed = (await api.get("/v1/nodes", headers=admin)).json()["items"]
                        if check({n["node"]: n for n in listed}):
                            return
                        assert loop.time() < deadline, f"the API never showed it: {listed}"
                        await log.poll()  # reads on meanwhile (and waits up to 200 ms)

                names = sorted(cluster.nodes)
                await ledger_says(lambda nodes: set(names) <= set(nodes))

                job = {"queue": "default", "workers": 1, "gpus_per_worker": 8}
                submitted = await api.post("/v1/jobs", json={**job, "job_id": first}, headers=team)
                assert submitted.status_code == 202, submitted.text
                await log.until(
                    lambda: any(g.job_id == first for g in grants()), timeout_s=60, check=tasks.check
                )
                busy = grants()[0].placements[0].node
                spare = next(n for n in names if n != busy)

                # Cordon: only an admin may; then no new work lands on the spare node.
                refused = await api.post(f"/v1/nodes/{spare}/cordon", json={"reason": "bios"}, headers=team)
                assert refused.status_code == 403
                assert refused.headers["content-type"].startswith("application/problem+json")
                cordoned = await api.post(f"/v1/nodes/{spare}/cordon", json={"reason": "bios"}, headers=admin)
                assert cordoned.status_code == 202, cordoned.text
                await ledger_says(lambda nodes: nodes[spare]["cordon"] is not None)
                submitted = await api.post("/v1/jobs", json={**job, "job_id": second}, headers=team)
                assert submitted.status_code == 202, submitted.text

                def pending_on_health() -> bool:
                    return any(
                        p.job_id == second and any(r.code == "health" for r in p.reasons)
                        for p in log.of(topics.events, JobPending)
                    )

                await log.until(pending_on_health, timeout_s=60, check=tasks.check)
                assert [g.job_id for g in grants()] == [first]  # nothing went to the cordoned node

                # Drain the busy node at once: its job is asked to checkpoint, released and requeued.
                drained = await api.post(f"/v1/nodes/{busy}/drain", json={"grace_s": 0}, headers=admin)
                assert drained.status_code == 202 and drained.json()["drain_grace_s"] == 0

                def emptied() -> bool:
                    return any(r.job_id == first and r.reason == "preempted" for r in releases()) and any(
                        q.job_id == first and q.reason == "preempted"
                        for q in log.of(topics.events, JobRequeued)
                    )

                await log.until(emptied, timeout_s=60, check=tasks.check)
                [asked] = [p for p in log.of(topics.events, JobPreempting) if p.job_id == first]
                assert busy in asked.reason and "drained" in asked.reason and asked.preemptor_job_id is None
                assert live_on(grants(), releases(), busy) == []  # the drained node is empty
                assert [g.job_id for g in grants()] == [first]  # and nothing new went anywhere

                # Back in service: the spare node takes the waiting work (one 8-GPU job fits).
                back = await api.post(f"/v1/nodes/{spare}/uncordon", headers=admin)
                assert back.status_code == 202
                await log.until(lambda: len(grants()) >= 2, timeout_s=60, check=tasks.check)
                regranted = grants()[1]
                assert regranted.job_id in (first, second)
                assert {p.node for p in regranted.placements} == {spare}
                assert live_on(grants(), releases(), busy) == []
                operator = [type(e.data) for e in log.events[topics.operator]]
                assert operator == [NodeCordoned, NodeCordoned, NodeUncordoned]
                assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
            ledger.request_stop()
        records = await KafkaSource(kafka_bootstrap).fetch(decider_topics(topics.prefix))

    # The operators' words are in the log the decisions are replayed from: the same decisions again.
    for service in ("placement", "preemption", "node_health"):
        result = load(service).replay_log(records, prefix=topics.prefix, gated=True)
        assert result.ok, (service, [d.message for d in result.differences[:10]])
        assert result.compared > 0, service
    drained_asks = [
        r
        for r in records
        if r.type == "gangline.job.preempting.v1" and r.envelope["source"] == "gangline/node-health"
    ]
    assert len(drained_asks) == 1
