"""Quota charges a job only to hardware it can run on, end to end.

One H100 node of 8 GPUs and two GB200 nodes of 4; team-a owns 8 of each. While team-a's H100 quota is
in use, a 1x8 job that names no GPU type waits for H100 (its pending reason says GB200's nodes cannot
hold a worker of 8) instead of being charged to GB200, where it would wait forever. When the H100 job is
cancelled, the waiting job is queued on H100 and granted there.
"""

from __future__ import annotations

import json
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
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobPending, JobQueued

H100 = "H100-SXM5-80GB"
GB200 = "GB200-186GB"
QUEUES = f"""
queues:
  - name: team-a
    quotas:
      {H100}: {{nominal: 8}}
      {GB200}: {{nominal: 8}}
"""
CLUSTER = ClusterSpec(
    name="fit",
    groups=(
        NodeGroup(name="h", count=1, gpu_model=H100, gpus_per_node=8, memory_mib=81920, leaf="leaf-a"),
        NodeGroup(name="gb", count=2, gpu_model=GB200, gpus_per_node=4, memory_mib=190464, leaf="leaf-a"),
    ),
)


def cancel_bytes(job_id: str) -> bytes:
    """A job.cancel_requested envelope as a producer writes it."""
    return json.dumps(
        {
            "specversion": "1.0",
            "id": str(uuid.uuid4()),
            "source": "test/raw-producer",
            "type": "gangline.job.cancel_requested.v1",
            "time": datetime.now(UTC).isoformat(),
            "subject": job_id,
            "datacontenttype": "application/json",
            "data": {"job_id": job_id, "reason": "make room"},
        }
    ).encode()


async def test_a_job_waits_for_the_model_that_can_hold_it_and_goes_there_when_it_frees(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(QUEUES, encoding="utf-8")
    async with private_topics(kafka_bootstrap, "quotafit") as topics:
        env = service_env(kafka_bootstrap, topics, queues_file=str(queues_file))
        cluster = fake_cluster(kafka_bootstrap, topics, CLUSTER)
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            holder = request_bytes("holder", queue="team-a", workers=1, gpus_per_worker=8)
            await send_raw(kafka_bootstrap, topics.requests, [("holder", holder)])
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                def grants(job: str) -> list[AllocationGranted]:
                    return [g for g in log.of(topics.allocations, AllocationGranted) if g.job_id == job]

                def queued(job: str) -> list[JobQueued]:
                    return [q for q in log.of(topics.events, JobQueued) if q.job_id == job]

                def pending(job: str) -> list[JobPending]:
                    return [p for p in log.of(topics.events, JobPending) if p.job_id == job]

                await log.until(lambda: bool(grants("holder")), timeout_s=60, check=tasks.check)
                assert [q.gpu_type for q in queued("holder")] == [H100]

                big = request_bytes("big", queue="team-a", workers=1, gpus_per_worker=8, duration_hint_s=1)
                await send_raw(kafka_bootstrap, topics.requests, [("big", big)])
                await log.until(lambda: bool(pending("big")), timeout_s=60, check=tasks.check)
                assert queued("big") == []  # not charged to GB200
                [reason] = pending("big")[0].reasons
                assert (reason.code, reason.details["gpu_type"]) == ("quota", H100)
                assert f"{GB200} cannot hold it" in reason.message

                await send_raw(kafka_bootstrap, topics.requests, [("holder", cancel_bytes("holder"))])
                await log.until(lambda: bool(grants("big")), timeout_s=60, check=tasks.check)
                assert [q.gpu_type for q in queued("big")] == [H100]
                [granted] = grants("big")
                assert [p.node for p in granted.placements] == ["h-0"]

            releases = {(r.job_id, r.reason) for r in log.of(topics.allocations, AllocationReleased)}
            assert ("holder", "cancelled") in releases
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
