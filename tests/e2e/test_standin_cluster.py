"""A cluster of real NodeAgents on NVML stand-ins, end to end: registration from NVML inventory, a job
run and reported by the agents, repeated job-fault XIDs that drain a GPU, and an XID 79 that cordons
a GPU and moves its gang elsewhere, whole."""

from __future__ import annotations

from e2e.harness import (
    LogReader,
    Tasks,
    audit_allocations,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_pipeline,
)
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobCompleted, JobRequeued, JobStarted
from gangline.events.nodes import GpuErrorReported, GpuHealthChanged, NodeRegistered
from gangline.events.types import NodeId
from services.agent.standin import StandInCluster, XidInjection

SPEC = ClusterSpec(
    name="standin",
    groups=(
        NodeGroup(
            name="n",
            count=4,
            gpu_model="H100-SXM5-80GB",
            gpus_per_node=8,
            memory_mib=81920,
            leaf="leaf-a",
        ),
    ),
)


async def test_standin_cluster_runs_jobs_and_moves_a_gang_off_a_gpu_that_fell_off_the_bus(
    kafka_bootstrap: str,
) -> None:
    async with private_topics(kafka_bootstrap, "standin") as topics:
        env = service_env(kafka_bootstrap, topics, job_fault_xids_limit="3", error_window_s="600")
        cluster = StandInCluster(
            spec=SPEC,
            bootstrap=kafka_bootstrap,
            topics=topics,
            group_id=f"g-{topics.prefix}standin",
            time_scale=0.1,  # a 10 s job runs for 1 s
            heartbeat_s=0.5,
        )
        tasks = Tasks()
        try:
            tasks.start("standin-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            topics_read = [topics.events, topics.allocations, topics.health, topics.inventory]
            async with LogReader(kafka_bootstrap, topics_read) as log:

                def grants(job: str) -> list[AllocationGranted]:
                    return [g for g in log.of(topics.allocations, AllocationGranted) if g.job_id == job]

                # 1. Registration from the stand-in's NVML inventory.
                await log.until(
                    lambda: len(log.of(topics.inventory, NodeRegistered)) == 4,
                    timeout_s=30,
                    check=tasks.check,
                )
                registered = log.of(topics.inventory, NodeRegistered)
                assert {r.node for r in registered} == {"n-0", "n-1", "n-2", "n-3"}
                for r in registered:
                    assert r.labels["gangline/nvml"] == "standin"
                    assert [g.id for g in r.gpus] == [f"gpu{k}" for k in range(8)]
                    assert {g.model for g in r.gpus} == {"H100-SXM5-80GB"}
                    assert all(len(g.nvlink_peers) == 7 and g.uuid.startswith("GPU-") for g in r.gpus)

                # 2. A job granted, started and completed by the agents.
                short = request_bytes(
                    "short", queue="default", workers=1, gpus_per_worker=8, duration_hint_s=10
                )
                await send_raw(kafka_bootstrap, topics.requests, [("short", short)])

                def finished(job: str) -> bool:
                    return any(c.job_id == job for c in log.of(topics.events, JobCompleted)) and any(
                        r.job_id == job and r.reason == "completed"
                        for r in log.of(topics.allocations, AllocationReleased)
                    )

                await log.until(lambda: finished("short"), timeout_s=60, check=tasks.check)
                [started] = [s for s in log.of(topics.events, JobStarted) if s.job_id == "short"]
                assert started.allocation_id == grants("short")[0].allocation_id

                # 3. Job-fault XIDs repeating on one GPU: node_health drains it before it fails.
                for _ in range(3):
                    await cluster.inject_xid(XidInjection(NodeId("n-2"), "gpu7", 13))

                def drained() -> list[GpuHealthChanged]:
                    return [c for c in log.of(topics.health, GpuHealthChanged) if c.state == "degraded"]

                await log.until(lambda: bool(drained()), timeout_s=30, check=tasks.check)
                [degraded] = drained()
                assert (degraded.node, degraded.gpu, degraded.previous) == ("n-2", "gpu7", "healthy")
                assert degraded.cause.xid == 13 and "3 job-fault XIDs" in degraded.cause.message
                reports = log.of(topics.health, GpuErrorReported)
                assert [(c.gpu, c.state, c.cause.xid) for c in reports] == [("gpu7", "healthy", 13)] * 3

                # 4. XID 79 under a running gang: GPU cordoned, allocation released, gang placed again.
                gang = request_bytes("gang", queue="default", workers=2, gpus_per_worker=8)
                await send_raw(kafka_bootstrap, topics.requests, [("gang", gang)])
                await log.until(
                    lambda: (
                        bool(grants("gang"))
                        and any(s.job_id == "gang" for s in log.of(topics.events, JobStarted))
                    ),
                    timeout_s=60,
                    check=tasks.check,
                )
                first = grants("gang")[0]
                hit = first.placements[0]
                await cluster.inject_xid(XidInjection(hit.node, hit.gpus[0], 79))
                await log.until(lambda: len(grants("gang")) == 2, timeout_s=60, check=tasks.check)

            failed = [c for c in log.of(topics.health, GpuHealthChanged) if c.state == "failed"]
            # The agent saw it as NVML does: the XID event, or the GPU no longer answering its sample.
            assert [(c.node, c.gpu) for c in failed] == [(hit.node, hit.gpus[0])]
            assert failed[0].cause.kind in ("xid", "lost")
            released = [r for r in log.of(topics.allocations, AllocationReleased) if r.job_id == "gang"]
            assert [(r.allocation_id, r.reason) for r in released] == [(first.allocation_id, "node_failed")]
            requeued = [r for r in log.of(topics.events, JobRequeued) if r.job_id == "gang"]
            assert [(r.reason, r.attempt) for r in requeued] == [("gpu_failed", 2)]
            second = grants("gang")[1]
            assert len(second.placements) == 2 and all(len(p.gpus) == 8 for p in second.placements)
            assert hit.node not in {p.node for p in second.placements}  # 7 healthy GPUs cannot hold a rank
            # The drained GPU keeps no new work: neither placement of the gang uses n-2.
            assert "n-2" not in {p.node for p in first.placements + second.placements}
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
