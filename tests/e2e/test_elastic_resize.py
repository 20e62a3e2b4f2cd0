"""Elastic grow/shrink over the real broker, every service and fake nodes, under the fair profile.

One node of 4 GPUs. A 3-GPU job holds most of it; an elastic 1..4-worker job lands on the GPU that is
left, and grows to 4 workers when the blocker ends (placement: ``job.resizing``; the agent checkpoints;
preemption: ``allocation.released`` ``resized`` and the 4-worker grant in one transaction). A 2-worker
gang of higher priority arrives: preemption shrinks the elastic job to the 2 workers the gang leaves
it (the same protocol), the gang is granted the GPUs it gave up, the elastic job grows back to 4 when
the gang is done, then completes. No GPU is held twice, the log's invariants hold and
`gangline replay --verify --decider all` reproduces every decision (node_health has none here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.harness import (
    ROOT,
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
from gangline.events.jobs import JobCompleted, JobResizing
from gangline.replay.invariants import check_log
from gangline.replay.kafka import KafkaSource
from gangline.replay.log import write_jsonl
from services.common.replay import decider_topics
from services.tools.cli import main as gangline_main

PROFILE = ROOT / "deploy" / "profiles" / "fair.yaml"


def one_node() -> ClusterSpec:
    group = NodeGroup(name="e", count=1, gpu_model="H100-SXM5-80GB", gpus_per_node=4, memory_mib=81920)
    return ClusterSpec(name="elastic", groups=(group,))


async def test_an_elastic_job_grows_into_idle_gpus_and_is_shrunk_for_a_gang(
    kafka_bootstrap: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `default` is limited (room to spare): every job goes through quota, which keeps the elastic job
    # charged (for its most workers) across its resizes.
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text("queues:\n  - name: default\n    quotas: {H100-SXM5-80GB: {nominal: 1000}}\n")
    async with private_topics(kafka_bootstrap, "elastic") as topics:
        env = service_env(kafka_bootstrap, topics, profile_path=str(PROFILE), queues_file=str(queues_file))
        cluster = fake_cluster(kafka_bootstrap, topics, one_node(), heartbeat_s=0.3)
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            async with LogReader(kafka_bootstrap, [topics.allocations, topics.events]) as log:

                def sizes(job: str) -> list[int]:
                    return [
                        g.workers for g in log.of(topics.allocations, AllocationGranted) if g.job_id == job
                    ]

                def completed(job: str) -> bool:
                    """Its end reported and its allocation released for it."""
                    ended = any(c.job_id == job for c in log.of(topics.events, JobCompleted))
                    releases = log.of(topics.allocations, AllocationReleased)
                    return ended and any(r.job_id == job and r.reason == "completed" for r in releases)

                blocker = request_bytes(
                    "blocker", queue="default", workers=3, gpus_per_worker=1, duration_hint_s=3
                )
                await send_raw(kafka_bootstrap, topics.requests, [("blocker", blocker)])
                await log.until(lambda: sizes("blocker") == [3], timeout_s=60, check=tasks.check)
                elastic = request_bytes(
                    "el",
                    queue="default",
                    workers=1,
                    min_workers=1,
                    max_workers=4,
                    gpus_per_worker=1,
                    checkpoint_grace_s=20,
                    duration_hint_s=8,
                )
                await send_raw(kafka_bootstrap, topics.requests, [("el", elastic)])
                # Placed on the one free GPU, grown to 4 once the blocker is done.
                await log.until(lambda: sizes("el") == [1, 4], timeout_s=60, check=tasks.check)
                gang = request_bytes(
                    "gang", queue="default", workers=2, gpus_per_worker=1, priority=10, duration_hint_s=3
                )
                await send_raw(kafka_bootstrap, topics.requests, [("gang", gang)])
                await log.until(lambda: sizes("gang") == [2], timeout_s=60, check=tasks.check)
                await log.until(
                    lambda: completed("el") and completed("gang"), timeout_s=90, check=tasks.check
                )

                # Shrunk only as far as the gang needs, then back to 4 once it is done.
                assert sizes("el") == [1, 4, 2, 4]
                resizing = [r for r in log.of(topics.events, JobResizing) if r.job_id == "el"]
                assert [(r.from_workers, r.to_workers) for r in resizing] == [(1, 4), (4, 2), (2, 4)]
                assert resizing[1].preemptor_job_id == "gang"
                grants = [g for g in log.of(topics.allocations, AllocationGranted) if g.job_id == "el"]
                assert [g.resizes for g in grants] == [None, *(g.allocation_id for g in grants[:-1])]
                releases = [
                    r.reason for r in log.of(topics.allocations, AllocationReleased) if r.job_id == "el"
                ]
                assert releases == ["resized"] * 3 + ["completed"]
                # The gang got GPUs the elastic job had given up, and no GPU was ever held twice.
                gang_gpus = {
                    g
                    for p in next(
                        iter(g for g in log.of(topics.allocations, AllocationGranted) if g.job_id == "gang")
                    ).placements
                    for g in p.gpus
                }
                assert gang_gpus <= {g for p in grants[1].placements for g in p.gpus} - {
                    g for p in grants[2].placements for g in p.gpus
                }
                assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
        records = await KafkaSource(kafka_bootstrap).fetch(decider_topics(topics.prefix))

    summary = check_log(records, prefix=topics.prefix)
    assert summary.ok, summary.to_json()
    assert summary.violations["gpus_double_held"] == 0 and summary.completed == 3
    # Every service's decisions, replayed from the log with the settings they ran with.
    path = tmp_path / "log.jsonl"
    write_jsonl(records, path)
    monkeypatch.setenv("GANGLINE_PROFILE_PATH", str(PROFILE))
    monkeypatch.setenv("GANGLINE_QUEUES_FILE", str(queues_file))
    capsys.readouterr()
    argv = ["replay", "--from", str(path), "--verify", "--decider", "all", "--prefix", topics.prefix]
    assert gangline_main(argv) == 0
    out = capsys.readouterr().out
    print(out)
    # node_health had nothing to decide (no node failed).
    assert "all services: 4 replayed (admission, quota, placement, preemption)" in out
    assert "outputs compared: identical" in out
