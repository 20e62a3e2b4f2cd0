"""The preemption and node-failure stories, end to end over the real broker with simulated nodes."""

from __future__ import annotations

from pathlib import Path

from e2e.harness import (
    URGENT,
    LogReader,
    Tasks,
    audit_allocations,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_cluster,
    urgent_gang_after,
)
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobCheckpointed, JobPreempted, JobPreempting, JobRequeued
from gangline.events.nodes import NodeFailed
from gangline.replay.chain import verify_chain
from gangline.replay.kafka import KafkaSource
from gangline.replay.log import read_jsonl, write_jsonl


def h100_nodes(count: int) -> ClusterSpec:
    return ClusterSpec(
        name="story",
        groups=(
            NodeGroup(
                name="n",
                count=count,
                gpu_model="H100-SXM5-80GB",
                gpus_per_node=8,
                memory_mib=81920,
                leaf="leaf-a",
            ),
        ),
    )


async def test_preemption_story(kafka_bootstrap: str, tmp_path: Path) -> None:
    async with private_topics(kafka_bootstrap, "preempt") as topics:
        env = service_env(kafka_bootstrap, topics)
        cluster = fake_cluster(kafka_bootstrap, topics, h100_nodes(2))
        tasks = Tasks()
        try:
            await start_cluster(tasks, cluster, env)
            victims = [f"low-{i}" for i in range(4)]
            await send_raw(
                kafka_bootstrap,
                topics.requests,
                [
                    (
                        v,
                        request_bytes(
                            v,
                            queue="default",
                            workers=1,
                            gpus_per_worker=4,
                            preemptible=True,
                            checkpoint_grace_s=30,
                        ),
                    )
                    for v in victims
                ],
            )
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                def grants(job: str) -> list[AllocationGranted]:
                    return log.grants(topics.allocations, job)

                # The cluster full, an urgent gang of 2 x 8 GPUs arrives.
                await urgent_gang_after(
                    log, kafka_bootstrap, topics, victims, timeout_s=60, check=tasks.check
                )
                await log.until(lambda: bool(grants(URGENT)), timeout_s=60, check=tasks.check)
                # ... and once it is done, the victims resume from their checkpoints.
                await log.until(
                    lambda: all(len(grants(v)) == 2 for v in victims), timeout_s=60, check=tasks.check
                )

            asked = {p.job_id for p in log.of(topics.events, JobPreempting)}
            assert asked == set(victims)
            assert {c.job_id for c in log.of(topics.events, JobCheckpointed)} == set(victims)
            preempted = log.of(topics.events, JobPreempted)
            assert {p.job_id for p in preempted} == set(victims) and all(p.checkpointed for p in preempted)
            requeued = {r.job_id: r for r in log.of(topics.events, JobRequeued)}
            assert set(requeued) == set(victims)
            assert all(
                r.resume_from and r.resume_from.startswith(f"ckpt://{j}/") for j, r in requeued.items()
            )
            releases = [r for r in log.of(topics.allocations, AllocationReleased) if r.reason == "preempted"]
            assert sorted(r.job_id for r in releases) == sorted(victims)
            assert len(grants(URGENT)) == 1 and len(grants(URGENT)[0].placements) == 2
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
        # The hash chain: every writer of allocations.log (placement, preemption) stamped its records;
        # the exported log verifies offline. The nodes write none (DESIGN §3): completions are released
        # by placement.
        exported = tmp_path / "allocations.jsonl"
        write_jsonl(await KafkaSource(kafka_bootstrap).fetch([topics.allocations]), exported)
        records = list(read_jsonl(exported))
        report = verify_chain(records, topics=[topics.allocations])
        assert report.problems == []
        assert report.records == len(records) >= 10
        sources = {cid.split("/", 1)[1] for cid in report.heads}
        assert {"gangline/placement", "gangline/preemption"} <= sources
        assert not any(s.startswith("gangline/agent/") for s in sources)
        writers = {r.envelope["source"] for r in records}
        assert writers <= {"gangline/placement", "gangline/preemption", "gangline/node-health"}, writers


async def test_node_failure_story(kafka_bootstrap: str) -> None:
    async with private_topics(kafka_bootstrap, "nodefail") as topics:
        env = service_env(kafka_bootstrap, topics, silence_s="4", check_every_s="0.2")
        cluster = fake_cluster(kafka_bootstrap, topics, h100_nodes(3), heartbeat_s=0.3)
        tasks = Tasks()
        try:
            await start_cluster(tasks, cluster, env)
            gang = request_bytes("gang", queue="default", workers=2, gpus_per_worker=8)
            await send_raw(kafka_bootstrap, topics.requests, [("gang", gang)])
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations, topics.health]) as log:

                def grants() -> list[AllocationGranted]:
                    return log.of(topics.allocations, AllocationGranted)

                await log.until(lambda: len(grants()) == 1, timeout_s=60, check=tasks.check)
                doomed = grants()[0].placements[0].node
                await cluster.fail_node(doomed)
                await log.until(lambda: len(grants()) == 2, timeout_s=60, check=tasks.check)

            failed = log.of(topics.health, NodeFailed)
            assert [f.node for f in failed] == [doomed] and failed[0].code == "heartbeat_timeout"
            first, second = grants()
            released = log.of(topics.allocations, AllocationReleased)
            assert [(r.allocation_id, r.reason) for r in released] == [(first.allocation_id, "node_failed")]
            requeued = log.of(topics.events, JobRequeued)
            assert [(r.job_id, r.reason, r.attempt) for r in requeued] == [("gang", "node_failed", 2)]
            assert doomed not in {p.node for p in second.placements}
            assert len(second.placements) == 2
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
