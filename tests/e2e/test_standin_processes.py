"""Stand-in nodes whose ranks are real processes (``--runner process``, what ``make bench-vs-slurm`` runs):
a gang's command runs once per rank with its GPUs and the torch.distributed environment, and a
preemptible job that acknowledges the checkpoint signal is checkpointed and makes room for an urgent one."""

from __future__ import annotations

from pathlib import Path

from e2e.harness import LogReader, Tasks, private_topics, request_bytes, send_raw, service_env, start_pipeline
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted
from gangline.events.jobs import JobCheckpointed, JobCompleted, JobStarted
from gangline.events.nodes import NodeRegistered
from services.agent.standin import StandInCluster
from services.bench.vs_slurm import job_data

SPEC = ClusterSpec(
    name="standin-proc",
    groups=(
        NodeGroup(
            name="p", count=2, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="leaf-a"
        ),
    ),
)


async def test_ranks_run_as_processes_and_a_checkpointing_victim_makes_room(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    async with private_topics(kafka_bootstrap, "standin-proc") as topics:
        cluster = StandInCluster(
            spec=SPEC,
            bootstrap=kafka_bootstrap,
            topics=topics,
            group_id=f"g-{topics.prefix}standin-proc",
            heartbeat_s=0.5,
            work_dir=tmp_path / "nodes",
            runner="process",
        )
        tasks = Tasks()
        try:
            tasks.start("standin-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, service_env(kafka_bootstrap, topics))
            topics_read = [topics.events, topics.allocations, topics.inventory]
            async with LogReader(kafka_bootstrap, topics_read) as log:
                await log.until(
                    lambda: len(log.of(topics.inventory, NodeRegistered)) == 2,
                    timeout_s=30,
                    check=tasks.check,
                )

                # 1. A 2x8 gang: one process per rank, each with its node's eight GPUs.
                ranks = tmp_path / "ranks.txt"
                command = f'echo "$RANK $WORLD_SIZE $GANGLINE_JOB_ID $CUDA_VISIBLE_DEVICES" >> {ranks}'
                gang = request_bytes(
                    "gang", queue="default", workers=2, gpus_per_worker=8, command=["sh", "-c", command]
                )
                await send_raw(kafka_bootstrap, topics.requests, [("gang", gang)])
                await log.until(
                    lambda: any(c.job_id == "gang" for c in log.of(topics.events, JobCompleted)),
                    timeout_s=60,
                    check=tasks.check,
                )
                lines = sorted(ranks.read_text().splitlines())
                assert [line.split()[:3] for line in lines] == [["0", "2", "gang"], ["1", "2", "gang"]]
                gpus = [line.split()[3].split(",") for line in lines]
                assert all(len(g) == 8 and all(u.startswith("GPU-") for u in g) for g in gpus)
                assert not set(gpus[0]) & set(gpus[1])

                # 2. Both nodes under preemptible jobs that acknowledge SIGTERM; an urgent gang takes them.
                starts = tmp_path / "starts.txt"
                for k in range(2):
                    low = job_data(
                        1, 8, 300, starts, checkpoints=True, preemptible=True, checkpoint_grace_s=600
                    )
                    await send_raw(
                        kafka_bootstrap, topics.requests, [(f"low-{k}", request_bytes(f"low-{k}", **low))]
                    )
                await log.until(
                    lambda: {s.job_id for s in log.of(topics.events, JobStarted)} >= {"low-0", "low-1"},
                    timeout_s=60,
                    check=tasks.check,
                )
                urgent = request_bytes("urgent", **job_data(2, 8, 1, starts, priority=100))
                await send_raw(kafka_bootstrap, topics.requests, [("urgent", urgent)])
                # The grace is 600 s: the urgent gang starts within the bound only if the victims ack.
                await log.until(
                    lambda: any(s.job_id == "urgent" for s in log.of(topics.events, JobStarted)),
                    timeout_s=90,
                    check=tasks.check,
                )
                checkpointed = {c.job_id for c in log.of(topics.events, JobCheckpointed)}
                assert checkpointed == {"low-0", "low-1"}
                assert any(g.job_id == "urgent" for g in log.of(topics.allocations, AllocationGranted))
                assert "urgent" in starts.read_text()
        finally:
            await tasks.stop()
