"""Liveness over the real broker: big gangs are not starved, no window strands a job that fits, and a
preemption holds back only work that would take the GPUs it frees (simulated nodes, every service)."""

from __future__ import annotations

import asyncio

from e2e.harness import (
    LogReader,
    Tasks,
    audit_allocations,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_pipeline,
)
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobAdmitted, JobCompleted, JobPending, JobPreempting


def nodes(*groups: tuple[str, int, str]) -> ClusterSpec:
    """(name, count, GPU model) groups of 8-GPU nodes, one leaf each."""
    return ClusterSpec(
        name="liveness",
        groups=tuple(
            NodeGroup(
                name=name,
                count=count,
                gpu_model=model,
                gpus_per_node=8,
                memory_mib=81920,
                leaf=f"leaf-{name}",
            )
            for name, count, model in groups
        ),
    )


def small(job_id: str) -> tuple[str, bytes]:
    return job_id, request_bytes(job_id, queue="default", workers=1, gpus_per_worker=1)


async def test_a_big_gang_is_granted_while_a_stream_of_small_jobs_keeps_the_cluster_full(
    kafka_bootstrap: str,
) -> None:
    async with private_topics(kafka_bootstrap, "starve") as topics:
        env = service_env(kafka_bootstrap, topics)
        # Jobs with no duration hint run 2 s: nobody knows when they end, so nothing can be backfilled.
        cluster = fake_cluster(
            kafka_bootstrap, topics, nodes(("n", 4, "H100-SXM5-80GB")), default_duration_s=2
        )
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            sent = [f"small-{k}" for k in range(32)]
            await send_raw(kafka_bootstrap, topics.requests, [small(j) for j in sent])
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                def granted() -> dict[str, AllocationGranted]:
                    return {g.job_id: g for g in log.of(topics.allocations, AllocationGranted)}

                await log.until(lambda: len(granted()) == 32, timeout_s=60, check=tasks.check)
                gang = request_bytes("gang", queue="default", workers=4, gpus_per_worker=8)
                await send_raw(kafka_bootstrap, topics.requests, [("gang", gang)])
                # A closed loop: each small job that ends is followed by a new one, and four more always
                # wait, so there is always a small job ready for any GPU that frees up.
                sent_before_gang = len(sent)
                for _ in range(600):  # at most 60 s
                    if "gang" in granted():
                        break
                    done = len(log.of(topics.events, JobCompleted))
                    more = [f"small-{k}" for k in range(len(sent), min(done + 36, 300))]
                    if more:
                        await send_raw(kafka_bootstrap, topics.requests, [small(j) for j in more])
                        sent += more
                    await asyncio.sleep(0.1)
                    await log.poll()
                    tasks.check()
                assert "gang" in granted(), log.summary()
                gang_grant = granted()["gang"]
                assert len({p.node for p in gang_grant.placements}) == 4
                # The stream kept coming while the gang waited; none of those newer jobs jumped it
                # onto the GPUs it was waiting for after the first of them freed up.
                assert len(sent) > sent_before_gang + 4
                assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()


async def test_a_small_job_that_fits_is_granted_behind_300_blocked_gangs(kafka_bootstrap: str) -> None:
    async with private_topics(kafka_bootstrap, "window") as topics:
        env = service_env(kafka_bootstrap, topics)
        spec = nodes(("h", 2, "H100-SXM5-80GB"), ("l", 1, "L40S"))
        cluster = fake_cluster(kafka_bootstrap, topics, spec)  # jobs with no hint run until released
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            h100 = {"queue": "default", "gpus_per_worker": 8, "gpu_type": "H100-SXM5-80GB"}
            filler = request_bytes("filler", workers=1, **h100)
            await send_raw(kafka_bootstrap, topics.requests, [("filler", filler)])
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                def grants() -> list[str]:
                    return [g.job_id for g in log.of(topics.allocations, AllocationGranted)]

                await log.until(lambda: grants() == ["filler"], timeout_s=60, check=tasks.check)
                # 300 gangs that need both H100 nodes, one of which the filler holds: all blocked.
                gangs = [(f"gang-{k}", request_bytes(f"gang-{k}", workers=2, **h100)) for k in range(300)]
                await send_raw(kafka_bootstrap, topics.requests, gangs)

                def admitted() -> set[str]:
                    return {a.job_id for a in log.of(topics.events, JobAdmitted)}

                def pending() -> set[str]:
                    return {p.job_id for p in log.of(topics.events, JobPending)}

                # All admitted, and the front of the line (the 256 a cycle always looks at) told why it waits.
                await log.until(
                    lambda: len(admitted()) == 301 and len(pending()) >= 256, timeout_s=90, check=tasks.check
                )
                # Behind them, a one-GPU job that fits the idle L40S node.
                await send_raw(kafka_bootstrap, topics.requests, [small("late-small")])
                await log.until(lambda: "late-small" in grants(), timeout_s=60, check=tasks.check)
                assert grants() == ["filler", "late-small"]
                [late] = [
                    g for g in log.of(topics.allocations, AllocationGranted) if g.job_id == "late-small"
                ]
                assert late.placements[0].node.startswith("l-")
        finally:
            await tasks.stop()


async def test_a_preemption_on_one_gpu_model_does_not_hold_work_on_another(kafka_bootstrap: str) -> None:
    async with private_topics(kafka_bootstrap, "holdback") as topics:
        env = service_env(kafka_bootstrap, topics)
        spec = nodes(("h", 1, "H100-SXM5-80GB"), ("l", 1, "L40S"))
        # The victim takes 5 s to checkpoint: the preemption is in flight all that time.
        cluster = fake_cluster(kafka_bootstrap, topics, spec, checkpoint_delay_s=5.0)
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            low = request_bytes(
                "low",
                queue="default",
                workers=1,
                gpus_per_worker=8,
                gpu_type="H100-SXM5-80GB",
                preemptible=True,
            )
            await send_raw(kafka_bootstrap, topics.requests, [("low", low)])
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                def grants() -> list[str]:
                    return [g.job_id for g in log.of(topics.allocations, AllocationGranted)]

                await log.until(lambda: grants() == ["low"], timeout_s=60, check=tasks.check)
                urgent = request_bytes(
                    "urgent",
                    queue="default",
                    workers=1,
                    gpus_per_worker=8,
                    gpu_type="H100-SXM5-80GB",
                    priority=10,
                )
                await send_raw(kafka_bootstrap, topics.requests, [("urgent", urgent)])
                await log.until(
                    lambda: bool(log.of(topics.events, JobPreempting)), timeout_s=60, check=tasks.check
                )
                other = request_bytes("other", queue="default", workers=1, gpus_per_worker=4, gpu_type="L40S")
                await send_raw(kafka_bootstrap, topics.requests, [("other", other)])
                await log.until(lambda: "other" in grants(), timeout_s=60, check=tasks.check)
                # Granted while the H100 victim still checkpointed: before its release and the urgent grant.
                assert not log.of(topics.allocations, AllocationReleased)
                assert "urgent" not in grants()
                await log.until(lambda: "urgent" in grants(), timeout_s=60, check=tasks.check)
                assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
