"""The log the running services wrote, replayed through placement's own handlers: every output identical.

A few hundred requests (gangs held inside a leaf, singles at two priorities) go through admission,
quota and placement (a real process) to the fake nodes, which run them and release their GPUs.
Midway placement is killed with SIGKILL and started again: it restores from its latest snapshot and
the log after it, and goes on.
The log is exported from Kafka, and `gangline replay --verify --decider placement-service` re-runs
every placement transaction from the input positions its outputs carry; admission's and quota's
decisions are replayed from the same log.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import (
    ROOT,
    LogReader,
    Proc,
    Tasks,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_pipeline,
)
from gangline.cluster_spec import load_cluster_spec
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.replay.kafka import KafkaSource
from gangline.replay.log import LogRecord, write_jsonl
from services.admission.replay import replay_admission
from services.admission.settings import AdmissionSettings
from services.agent.fake import FakeCluster
from services.common.topics import TopicNames
from services.placement.replay import decider_topics, replay_placement
from services.quota.replay import decider_topics as quota_topics
from services.quota.replay import replay_quota
from services.quota.settings import QuotaSettings
from services.tools.cli import main as gangline_main

JOBS = 300
QUEUES = """
queues:
  - name: default
    unlimited: true
  - name: team
    quotas:
      H100-SXM5-80GB: {nominal: 1000}
      GB200-186GB: {nominal: 1000}
      L40S-48GB: {nominal: 1000}
"""
"""Half the jobs in an unlimited queue (placed once admitted), half in a limited one (queued by quota,
placed on the model quota chose): placement's replay covers both ways in."""


def queue_of(i: int) -> str:
    return "team" if i % 2 else "default"


def workload(rng: random.Random) -> list[tuple[str, bytes]]:
    jobs: list[tuple[str, bytes]] = []
    for i in range(JOBS):
        job_id = f"r-{i:03d}"
        spec: dict[str, Any]
        if i % 5 == 2:
            spec = {
                "queue": queue_of(i),
                "workers": rng.choice([2, 4]),
                "gpus_per_worker": rng.choice([2, 4]),
                "gpu_type": "H100-SXM5-80GB",
                "duration_hint_s": rng.choice([1, 2]),
                "topology": {"level": "leaf", "mode": "required"},
            }
        else:
            spec = {
                "queue": queue_of(i),
                "workers": 1,
                "gpus_per_worker": rng.choice([1, 1, 2, 4, 8]),
                "duration_hint_s": rng.choice([1, 2, 3]),
                "priority": rng.choice([0, 0, 10]),
            }
        jobs.append((job_id, request_bytes(job_id, **spec)))
    return jobs


async def test_a_placement_run_with_a_kill_and_restart_replays_identical(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = workload(random.Random(17))
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(QUEUES, encoding="utf-8")
    async with private_topics(kafka_bootstrap, "replayplc") as topics:
        # Snapshots every 50 events: the restart loads one and reads only the tail, and the replay below,
        # which ignores snapshots and rebuilds from the whole log, must agree with what it decided.
        env = service_env(
            kafka_bootstrap,
            topics,
            session_timeout_ms="3000",
            queues_file=str(queues_file),
            snapshot_every_events="50",
        )
        placement = Proc("services.placement", env, tmp_path / "placement.log")
        cluster = FakeCluster(
            spec=load_cluster_spec(ROOT / "deploy" / "clusters" / "default.yaml"),
            bootstrap=kafka_bootstrap,
            topics=topics,
            group_id=f"g-{topics.prefix}fake",
            time_scale=0.2,
            heartbeat_s=1.0,
        )
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env, only=("admission", "quota"))
            placement.start()
            await send_raw(kafka_bootstrap, topics.requests, jobs[: JOBS // 2])
            async with LogReader(kafka_bootstrap, [topics.allocations]) as log:

                def granted() -> set[str]:
                    return {g.job_id for g in log.of(topics.allocations, AllocationGranted)}

                def released() -> set[str]:
                    return {r.job_id for r in log.of(topics.allocations, AllocationReleased)}

                await log.until(lambda: len(granted()) >= JOBS // 4, timeout_s=120, check=tasks.check)
                placement.kill9()
                await send_raw(kafka_bootstrap, topics.requests, jobs[JOBS // 2 :])
                placement.start()
                await log.until(
                    lambda: len(granted()) == JOBS and len(released()) == JOBS,
                    timeout_s=240,
                    check=tasks.check,
                )
            assert placement.alive()
            placement.terminate()
            assert '"message": "state loaded from a snapshot"' in (tmp_path / "placement.log").read_text()
            # Placement's inputs and outputs, and quota's (its queue statuses too): both are replayed below.
            wanted = sorted({*decider_topics(topics.prefix), *quota_topics(topics.prefix)})
            records = await KafkaSource(kafka_bootstrap).fetch(wanted)
        finally:
            placement.terminate()
            await tasks.stop()

    result = replay_placement(records, topics=TopicNames(prefix=topics.prefix))
    grants = sum(r.type == "gangline.allocation.granted.v1" for r in records)
    assert grants == JOBS
    assert result.incarnations == 2
    assert result.transactions > 0 and result.inputs > 0
    # Every output placement sent was compared: grants, job.placed, job.pending.
    placement_outputs = sum(r.envelope.get("source") == "gangline/placement" for r in records)
    assert result.compared == placement_outputs >= 2 * grants
    assert result.ok, [d.message for d in result.differences[:10]]
    print(result.summary())

    # The same log exported to a file, through `gangline replay` (hash chain and decisions).
    path = tmp_path / "log.jsonl"
    write_jsonl(records, path)
    monkeypatch.setenv("GANGLINE_QUEUES_FILE", str(queues_file))
    argv = ["replay", "--from", str(path), "--verify", "--decider", "placement-service"]
    assert gangline_main([*argv, "--prefix", topics.prefix]) == 0
    out = capsys.readouterr().out
    assert "hash chain: 0 chained" not in out and "identical" in out

    # A grant given other GPUs after the fact is named: where it is, whose it is, which field.
    target = next(r for r in reversed(records) if r.type == "gangline.allocation.granted.v1")
    forged = json.loads(json.dumps(target.envelope))
    forged["data"]["placements"][-1]["gpus"][-1] = "gpu77"
    tampered = [
        LogRecord(r.topic, r.partition, r.offset, r.key, forged, r.headers, r.timestamp_ms)
        if r is target
        else r
        for r in records
    ]
    first = replay_placement(tampered, topics=TopicNames(prefix=topics.prefix)).first
    assert first is not None
    assert (first.where, first.job_id) == (target.where, target.envelope["data"]["job_id"])
    assert first.field.startswith("data.placements[") and first.recorded == '"gpu77"'
    print(f"{result.summary()}; {grants} grants; a forged grant named: {first.message}")

    # Admission and quota, which decide per event, ran alongside: their decisions replay identical too
    # (hundreds of requests in batches spread over the partitions, in the order each batch handled them).
    prefix = {"topic_prefix": topics.prefix, "queues_file": queues_file}
    team_jobs = sum(queue_of(i) == "team" for i in range(JOBS))
    for other, least in (
        (replay_admission(records, AdmissionSettings(**prefix)), JOBS),
        (replay_quota(records, QuotaSettings(**prefix)), team_jobs),
    ):
        print(other.summary())
        assert other.ok, [d.message for d in other.differences[:10]]
        assert other.compared >= least
