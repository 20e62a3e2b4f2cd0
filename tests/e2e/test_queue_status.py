"""One fair-share figure, end to end: what `GET /v1/queues` reports is quota's own queue.status.

Two queues of one cohort run jobs on simulated H100 nodes (team-b borrowing team-a's idle quota); quota
publishes each queue's status on queues.status, the ledger projects it, and the API reports it. Once
the jobs are done, every figure the API shows for a queue is the one in quota's latest status for it.

And when the cluster goes quiet with a change the throttle held back, quota's tick publishes it.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from e2e.harness import (
    LogReader,
    Tasks,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_pipeline,
)
from e2e.test_stories import h100_nodes
from gangline.bus import EventProducer
from gangline.events.allocations import AllocationReleased
from gangline.events.base import make_envelope
from gangline.events.codec import encode
from gangline.events.jobs import JobAdmitted, JobSpec
from gangline.events.queues import QueueStatus, QuotaTicked
from gangline.events.types import JobId
from services.api.app import Resources, create_app
from services.api.auth import Authenticator, Tenant, TokenConfig
from services.api.settings import ApiSettings
from services.common.queues import load_queues
from services.ledger.settings import LedgerSettings
from services.ledger.wiring import Ledger

H100 = "H100-SXM5-80GB"


async def test_the_api_reports_quotas_latest_queue_status(
    kafka_bootstrap: str, pg_dsn: str, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    team_a, team_b = f"team-a-{run}", f"team-b-{run}"
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(
        f"cohorts:\n  - name: lab-{run}\nqueues:\n"
        f"  - name: {team_a}\n    cohort: lab-{run}\n    quotas: {{{H100}: {{nominal: 8}}}}\n"
        f"  - name: {team_b}\n    cohort: lab-{run}\n    weight: 2\n    quotas: {{{H100}: {{nominal: 8}}}}\n",
        encoding="utf-8",
    )
    token = f"tok-{uuid.uuid4().hex}"
    auth = Authenticator(TokenConfig(tenants=(Tenant.with_token("ops", token, admin=True),)))
    async with private_topics(kafka_bootstrap, "qstatus") as topics:
        env = service_env(kafka_bootstrap, topics, queues_file=str(queues_file), status_interval_s="0.5")
        cluster = fake_cluster(kafka_bootstrap, topics, h100_nodes(2))
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
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            tasks.start("ledger", ledger.run())
            start_pipeline(tasks, env)
            jobs = [(f"a-{k}", team_a, 4) for k in range(2)] + [(f"b-{k}", team_b, 4) for k in range(3)]
            await send_raw(
                kafka_bootstrap,
                topics.requests,
                [
                    (job, request_bytes(job, queue=q, workers=1, gpus_per_worker=g, duration_hint_s=1))
                    for job, q, g in jobs
                ],
            )
            async with (
                EventProducer(kafka_bootstrap) as producer,
                LogReader(kafka_bootstrap, [topics.allocations, topics.queue_status]) as log,
            ):
                app = create_app(
                    api_settings,
                    resources=Resources(pg_pool, producer),
                    queues=load_queues(queues_file),
                    authenticator=auth,
                )
                client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")

                def done() -> set[str]:
                    return {
                        r.job_id
                        for r in log.of(topics.allocations, AllocationReleased)
                        if r.reason == "completed"
                    }

                await log.until(lambda: done() >= {j for j, _, _ in jobs}, timeout_s=90, check=tasks.check)

                def latest() -> dict[str, QueueStatus]:
                    found: dict[str, QueueStatus] = {}
                    for status in log.of(topics.queue_status, QueueStatus):
                        found[status.queue] = status  # one partition: the log's order is quota's
                    return found

                async def listed() -> dict[str, Any]:
                    response = await client.get("/v1/queues", headers={"Authorization": f"Bearer {token}"})
                    return {q["queue"]: q for q in response.json()["items"]}

                reported: dict[str, Any] = {}
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while True:  # until the ledger has projected quota's latest status of both queues
                    tasks.check()
                    await log.poll()
                    statuses, reported = latest(), await listed()
                    if set(statuses) >= {team_a, team_b} and all(
                        reported[q]["as_of"] == statuses[q].as_of.isoformat().replace("+00:00", "Z")
                        for q in (team_a, team_b)
                    ):
                        break
                    assert loop.time() < deadline, f"the API never showed quota's latest: {reported}"
                await client.aclose()
        finally:
            await tasks.stop()
            ledger.request_stop()

    assert len(log.of(topics.queue_status, QueueStatus)) >= 2
    for queue in (team_a, team_b):
        status, item = statuses[queue], reported[queue]
        assert item["reported"] == "quota"
        assert (item["dominant_share"], item["dominant_resource"], item["position"], item["of"]) == (
            status.dominant_share,
            status.dominant_resource,
            status.position,
            status.of,
        )
        assert item["charged"] == {r: v.used for r, v in status.resources.items()}
        assert item["lendable"] == {r: v.lendable for r, v in status.resources.items()}
    # Quota ran work in both: a decayed share it ordered by, not zero.
    assert statuses[team_a].dominant_share > 0 and statuses[team_b].dominant_share > 0


async def test_a_change_the_throttle_held_back_is_published_once_the_cluster_goes_quiet(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Quota alone, on its nodes: with no job it reports the queue (before, a queue no job had charged was
    never reported), then is fed admissions: the second comes inside the throttle's interval and nothing
    follows. The queue's latest status must come to say what quota charges (before quota's ticks it never
    did: the status said the first job's GPUs only), and the publication is the tick's (its time)."""
    run = uuid.uuid4().hex[:6]
    queue = f"team-a-{run}"
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(
        f"queues:\n  - name: {queue}\n    quotas: {{{H100}: {{nominal: 8}}}}\n", encoding="utf-8"
    )

    def admitted(job: str, gpus: int) -> tuple[str, bytes]:
        spec = JobSpec(queue=queue, workers=1, gpus_per_worker=gpus)
        data = JobAdmitted(job_id=JobId(job), spec=spec)
        envelope = make_envelope(
            data, event_id=str(uuid.uuid4()), source="test/admission", time=datetime.now(UTC)
        )
        return job, encode(envelope)

    async with private_topics(kafka_bootstrap, "qquiet") as topics:
        # 4 s of event time between two publications of a tree: the second admission, sent at once, is held.
        env = service_env(kafka_bootstrap, topics, queues_file=str(queues_file), status_interval_s="4")
        cluster = fake_cluster(kafka_bootstrap, topics, h100_nodes(1))
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env, only=("quota",))
            async with LogReader(kafka_bootstrap, [topics.queue_status, topics.quota_ticks]) as log:

                def used() -> list[int]:
                    return [s.resources[H100].used for s in log.of(topics.queue_status, QueueStatus)]

                # Started on the nodes with no job at all, quota reports the queue (its first quiet tick).
                await log.until(lambda: used() == [0], timeout_s=60, check=tasks.check)
                # j1 after the interval (its event time is the clock's), so its own status goes out at once.
                reported_at = log.of(topics.queue_status, QueueStatus)[0].as_of
                await asyncio.sleep(max(0.0, 4.5 - (datetime.now(UTC) - reported_at).total_seconds()))
                await send_raw(kafka_bootstrap, topics.events, [admitted("j1", 4)])
                await log.until(lambda: used() == [0, 4], timeout_s=60, check=tasks.check)
                await send_raw(kafka_bootstrap, topics.events, [admitted("j2", 2)])
                await log.until(lambda: used()[-1:] == [6], timeout_s=30, check=tasks.check)
        finally:
            await tasks.stop()

    assert used() == [0, 4, 6]
    ticks = log.of(topics.quota_ticks, QuotaTicked)
    assert {t.cohort for t in ticks} == {queue}  # a queue of no cohort is a tree of its own
    status = log.of(topics.queue_status, QueueStatus)[-1]
    ticked = [e for e in log.events[topics.quota_ticks] if isinstance(e.data, QuotaTicked)][-1]
    assert status.as_of == ticked.time  # the tick's time made it due
