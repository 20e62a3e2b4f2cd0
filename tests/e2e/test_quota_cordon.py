"""Quota honours an operator's cordon, end to end: a cordoned node is no hardware a job can be charged to.

One H100 node of 8 GPUs and two GB200 nodes of 4; team-a owns 16 H100 and 8 GB200. A 1x8 H100 job holds
the H100 node; a 2x4 job that names no GPU type is charged to H100 (its first flavour, with quota to
spare) and waits there for GPUs. The H100 node is cordoned (``node.cordoned`` on nodes.operator, as the
API writes it): quota no longer counts it as hardware that can hold the 2x4 job and moves it to GB200
(a ``job.queued`` that replaces the first), where placement grants it. Before quota read the operator
topic the job stayed charged to H100, behind a node that would take no new work.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

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
from gangline.bus import EventProducer
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted
from gangline.events.base import Envelope, make_envelope
from gangline.events.jobs import JobQueued
from gangline.events.nodes import NodeCordoned

H100 = "H100-SXM5-80GB"
GB200 = "GB200-186GB"
QUEUES = f"""
queues:
  - name: team-a
    quotas:
      {H100}: {{nominal: 16}}
      {GB200}: {{nominal: 8}}
"""
CLUSTER = ClusterSpec(
    name="cordon-quota",
    groups=(
        NodeGroup(name="h", count=1, gpu_model=H100, gpus_per_node=8, memory_mib=81920, leaf="leaf-a"),
        NodeGroup(name="gb", count=2, gpu_model=GB200, gpus_per_node=4, memory_mib=190464, leaf="leaf-a"),
    ),
)


async def test_a_job_waiting_on_a_cordoned_model_moves_to_one_whose_nodes_take_work(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(QUEUES, encoding="utf-8")
    async with private_topics(kafka_bootstrap, "quotacordon") as topics:
        env = service_env(kafka_bootstrap, topics, queues_file=str(queues_file))
        cluster = fake_cluster(kafka_bootstrap, topics, CLUSTER)
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            holder = request_bytes("holder", queue="team-a", workers=1, gpus_per_worker=8, gpu_type=H100)
            await send_raw(kafka_bootstrap, topics.requests, [("holder", holder)])
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                def grants(job: str) -> list[AllocationGranted]:
                    return [g for g in log.of(topics.allocations, AllocationGranted) if g.job_id == job]

                def queued(job: str) -> list[Envelope]:
                    return [
                        e
                        for e in log.events[topics.events]
                        if isinstance(e.data, JobQueued) and e.data.job_id == job
                    ]

                await log.until(lambda: bool(grants("holder")), timeout_s=60, check=tasks.check)
                gang = request_bytes("gang", queue="team-a", workers=2, gpus_per_worker=4)
                await send_raw(kafka_bootstrap, topics.requests, [("gang", gang)])
                await log.until(lambda: bool(queued("gang")), timeout_s=60, check=tasks.check)
                [first] = queued("gang")
                assert first.data.gpu_type == H100  # type: ignore[attr-defined]
                assert grants("gang") == []  # the H100 node is full

                cordon = NodeCordoned(node="h-0", reason="bios update", requested_by="ops")
                async with EventProducer(kafka_bootstrap) as producer:
                    await producer.publish(
                        topics.operator,
                        make_envelope(
                            cordon, event_id=str(uuid.uuid4()), source="gangline/api", time=datetime.now(UTC)
                        ),
                    )

                await log.until(  # the move (jobs.events) and the grant (allocations.log): read side by side
                    lambda: bool(grants("gang")) and len(queued("gang")) > 1, timeout_s=60, check=tasks.check
                )
                moved = queued("gang")[1:]
                assert [(e.data.gpu_type, e.data.replaces) for e in moved] == [(GB200, first.id)]  # type: ignore[attr-defined]
                [granted] = grants("gang")
                assert sorted(p.node for p in granted.placements) == ["gb-0", "gb-1"]
                assert [g.job_id for g in log.of(topics.allocations, AllocationGranted)] == ["holder", "gang"]
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
