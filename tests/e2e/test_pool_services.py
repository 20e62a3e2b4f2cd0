"""With pools every pool-owned service decides its pool alone: a preemption and a node failure stay in
their pools, on their pools' partitions, and every service's decisions replay identical per pool.

Two pools (one per spine) of 2 nodes x 8 H100. Eight preemptible 4-GPU jobs fill both pools (quota routes
four to each). An urgent 2x8 gang is routed to one pool and preempts there, in that pool alone; then a
node of the other pool stops heartbeating and that pool's node_health fails it and releases its jobs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
from gangline.cluster_spec import ClusterSpec, NodeGroup, Pools
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobPreempting, JobRouted
from gangline.events.nodes import NodeFailed
from gangline.replay.kafka import KafkaSource
from gangline.replay.log import write_jsonl
from services.common.replay import decider_topics
from services.tools.cli import main as gangline_main

POOLS = "spine=spine-a,spine-b"
NODE_HEALTH = {"silence_s": "4", "check_every_s": "0.2"}


def two_pools() -> ClusterSpec:
    groups = tuple(
        NodeGroup(
            name=s,
            count=2,
            gpu_model="H100-SXM5-80GB",
            gpus_per_node=8,
            memory_mib=81920,
            leaf=f"leaf-{s}",
            spine=f"spine-{s}",
        )
        for s in "ab"
    )
    return ClusterSpec(name="pools2", groups=groups, pools=Pools(label="spine", names=("spine-a", "spine-b")))


async def test_preemption_and_node_health_decide_per_pool_and_replay_identical(
    kafka_bootstrap: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text("queues:\n  - name: default\n    quotas: {H100-SXM5-80GB: {nominal: 1000}}\n")
    spec = two_pools()
    spine_of = {r.node: r.spine for r in spec.registrations()}
    pools = ("spine-a", "spine-b")
    async with private_topics(kafka_bootstrap, "poolsvc") as topics:
        env = service_env(kafka_bootstrap, topics, **NODE_HEALTH, queues_file=str(queues_file), pools=POOLS)
        cluster = fake_cluster(kafka_bootstrap, topics, spec, heartbeat_s=0.3)
        tasks = Tasks()
        try:
            await start_cluster(tasks, cluster, env)
            victims = [f"low-{i}" for i in range(8)]
            low = {"queue": "default", "workers": 1, "gpus_per_worker": 4, "preemptible": True}
            await send_raw(kafka_bootstrap, topics.requests, [(v, request_bytes(v, **low)) for v in victims])
            async with LogReader(kafka_bootstrap, [topics.allocations, topics.health, topics.events]) as log:

                def grants(job: str) -> list[AllocationGranted]:
                    return log.grants(topics.allocations, job)

                await urgent_gang_after(
                    log, kafka_bootstrap, topics, victims, timeout_s=90, check=tasks.check
                )
                await log.until(lambda: bool(grants(URGENT)), timeout_s=90, check=tasks.check)
                routed = {r.job_id: r.pool for r in log.of(topics.events, JobRouted)}
                urgent_pool = routed[URGENT]
                other = pools[1 - pools.index(urgent_pool)]
                doomed = next(g.placements[0].node for v in victims if routed[v] == other for g in grants(v))
                await cluster.fail_node(doomed)
                await log.until(
                    lambda: any(
                        r.reason == "node_failed" for r in log.of(topics.allocations, AllocationReleased)
                    ),
                    timeout_s=90,
                    check=tasks.check,
                )
                for _ in range(10):
                    await log.poll()
        finally:
            await tasks.stop()
        records = await KafkaSource(kafka_bootstrap).fetch(decider_topics(topics.prefix))

    # Each decision is about its pool's jobs and nodes, on its pool's partition.
    def partitions_of(topic: str, kind: type) -> list[tuple[int, object]]:
        return [
            (p, e.data)
            for p, e in zip(log.partitions[topic], log.events[topic], strict=True)
            if isinstance(e.data, kind)
        ]

    preempting = partitions_of(topics.events, JobPreempting)
    assert preempting and {(p, routed[d.job_id]) for p, d in preempting} == {
        (pools.index(urgent_pool), urgent_pool)
    }
    [(failed_partition, failed)] = partitions_of(topics.health, NodeFailed)
    assert failed.node == doomed and failed_partition == pools.index(other)
    for p, g in partitions_of(topics.allocations, AllocationGranted):
        assert {spine_of[x.node] for x in g.placements} == {pools[p]} == {routed[g.job_id]}
    for p, r in partitions_of(topics.allocations, AllocationReleased):
        assert pools[p] == routed[r.job_id]
    assert audit_allocations(log.stamped[topics.allocations]) == []

    path = tmp_path / "log.jsonl"
    write_jsonl(records, path)
    for key, value in {**NODE_HEALTH, "pools": POOLS, "queues_file": str(queues_file)}.items():
        monkeypatch.setenv(f"GANGLINE_{key.upper()}", value)
    capsys.readouterr()
    argv = ["replay", "--from", str(path), "--verify", "--decider", "all", "--prefix", topics.prefix]
    code = gangline_main(argv)
    out = capsys.readouterr().out
    print(out)
    assert code == 0
    assert "all services: 5 replayed (admission, quota, placement, preemption, node_health)" in out
