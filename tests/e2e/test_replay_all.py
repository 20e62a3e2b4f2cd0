"""Every service's decisions in a run with a preemption and a node failure, replayed from the log: identical.

Admission, quota, placement, preemption and node_health run against simulated nodes: four preemptible
jobs fill two nodes, an urgent gang preempts them (they checkpoint and resume); every service is then
stopped and started again (a new run, restored from the log; placement and preemption from their
snapshots and the log after them); a node goes silent and is declared failed
(its jobs released and requeued), and more requests come. The log is exported from Kafka and
`gangline replay --verify --decider all` re-runs every service's transactions from the batches and
positions their outputs carry; each service is also replayed on its own with the settings it ran with.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from pathlib import Path

import pytest

from e2e.harness import (
    LogReader,
    Tasks,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_cluster,
    start_pipeline,
    urgent_gang_after,
)
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobPending
from gangline.events.nodes import NodeFailed
from gangline.replay.kafka import KafkaSource
from gangline.replay.log import LogRecord, write_jsonl
from services.admission.replay import replay_admission
from services.admission.settings import AdmissionSettings
from services.common.replay import ReplayReport, decider_topics
from services.common.topics import TopicNames
from services.node_health.replay import replay_node_health
from services.node_health.settings import NodeHealthSettings
from services.placement.replay import replay_placement
from services.preemption.replay import replay_preemption
from services.preemption.settings import PreemptionSettings
from services.quota.replay import replay_quota
from services.quota.settings import QuotaSettings
from services.tools.cli import main as gangline_main

NODE_HEALTH = {"silence_s": "4", "check_every_s": "0.2"}


async def restart(tasks: Tasks, env: dict[str, str], service: str) -> None:
    """Stop a service (an in-flight transaction is aborted) and start it again: a new run, restored."""
    task = tasks.tasks[service]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    start_pipeline(tasks, env, only=(service,))


def two_nodes() -> ClusterSpec:
    group = NodeGroup(
        name="n", count=2, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="leaf-a"
    )
    return ClusterSpec(name="replay", groups=(group,))


async def test_every_service_replays_identical_after_a_preemption_and_a_node_failure(
    kafka_bootstrap: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # `default` is a limited queue here, with room to spare: every job goes through quota (job.queued),
    # so quota has decisions to replay, and the preemption is placement's, as in the preemption story.
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text("queues:\n  - name: default\n    quotas: {H100-SXM5-80GB: {nominal: 1000}}\n")
    async with private_topics(kafka_bootstrap, "replayall") as topics:
        # Snapshots every few events: placement and preemption restart from theirs (and the tail); the
        # replay, which rebuilds every run's state from the whole log, must agree with what they decided.
        env = service_env(
            kafka_bootstrap, topics, **NODE_HEALTH, queues_file=str(queues_file), snapshot_every_events="5"
        )
        caplog.set_level(logging.INFO, logger="services.common.snapshots")
        cluster = fake_cluster(kafka_bootstrap, topics, two_nodes(), heartbeat_s=0.3)
        tasks = Tasks()
        try:
            await start_cluster(tasks, cluster, env)
            victims = [f"low-{i}" for i in range(4)]
            low = {"queue": "default", "workers": 1, "gpus_per_worker": 4, "preemptible": True}
            await send_raw(
                kafka_bootstrap,
                topics.requests,
                [(v, request_bytes(v, **low, checkpoint_grace_s=30)) for v in victims]
                + [("nope", request_bytes("nope", queue="no-such-queue", workers=1, gpus_per_worker=1))],
            )
            async with LogReader(kafka_bootstrap, [topics.allocations, topics.health, topics.events]) as log:

                def grants(job: str) -> list[AllocationGranted]:
                    return log.grants(topics.allocations, job)

                await urgent_gang_after(
                    log, kafka_bootstrap, topics, victims, timeout_s=60, check=tasks.check
                )
                await log.until(
                    lambda: all(len(grants(v)) == 2 for v in victims), timeout_s=60, check=tasks.check
                )
                for service in ("admission", "quota", "placement", "preemption", "node_health"):
                    await restart(tasks, env, service)
                doomed = grants(victims[0])[1].placements[0].node
                await cluster.fail_node(doomed)
                await log.until(
                    lambda: any(
                        r.reason == "node_failed" for r in log.of(topics.allocations, AllocationReleased)
                    ),
                    timeout_s=60,
                    check=tasks.check,
                )
                late = [(f"late-{i}", request_bytes(f"late-{i}", **low)) for i in range(2)]
                await send_raw(kafka_bootstrap, topics.requests, late)
                # The cluster is full now: they are admitted and queued, and wait (job.pending).
                await log.until(
                    lambda: {p.job_id for p in log.of(topics.events, JobPending)} >= {j for j, _ in late},
                    timeout_s=60,
                    check=tasks.check,
                )
            assert [f.node for f in log.of(topics.health, NodeFailed)] == [doomed]
            loaded = [r for r in caplog.records if r.getMessage() == "state loaded from a snapshot"]
            # placement's, preemption's, node_health's and quota's restarts (quota's under its half-life)
            assert len(loaded) == 4
        finally:
            await tasks.stop()
        records = await KafkaSource(kafka_bootstrap).fetch(decider_topics(topics.prefix))

    names = TopicNames(prefix=topics.prefix)
    prefix = {"topic_prefix": topics.prefix, "queues_file": queues_file}
    results: dict[str, ReplayReport] = {
        "admission": replay_admission(records, AdmissionSettings(**prefix)),
        "quota": replay_quota(records, QuotaSettings(**prefix)),
        "placement": replay_placement(records, topics=names, unlimited_queues=frozenset()),
        "preemption": replay_preemption(records, PreemptionSettings(**prefix)),
        "node_health": replay_node_health(records, NodeHealthSettings(**prefix, **NODE_HEALTH)),
    }
    for service, result in results.items():
        print(result.summary())
        assert result.ok, (service, [d.message for d in result.differences[:10]])
        source = "gangline/node-health" if service == "node_health" else f"gangline/{service}"
        written = [r for r in records if r.envelope.get("source") == source]
        assert result.compared == len(written) > 0, service
        # Preemption had nothing to do after the restart, node_health nothing before it.
        assert result.incarnations == (1 if service in ("preemption", "node_health") else 2), service
    kinds = {
        r.type for r in records if r.envelope.get("source") in ("gangline/preemption", "gangline/node-health")
    }
    assert {"gangline.job.preempting.v1", "gangline.node.failed.v1", "gangline.job.requeued.v1"} <= kinds
    statuses = [r for r in records if r.type == "gangline.queue.status.v1"]
    assert statuses and {r.topic for r in statuses} == {names.queue_status}  # compared with quota's outputs
    # Quota restarted in between: none of its statuses repeats the figures of the one before it.
    figures = [{k: v for k, v in r.envelope["data"].items() if k != "as_of"} for r in statuses]
    assert all(a != b for a, b in itertools.pairwise(figures)), figures

    # The same log from a file, through `gangline replay --decider all` (settings from the environment).
    path = tmp_path / "log.jsonl"
    write_jsonl(records, path)
    for key, value in NODE_HEALTH.items():
        monkeypatch.setenv(f"GANGLINE_{key.upper()}", value)
    monkeypatch.setenv("GANGLINE_QUEUES_FILE", str(queues_file))
    capsys.readouterr()
    argv = ["replay", "--from", str(path), "--verify", "--decider", "all", "--prefix", topics.prefix]
    assert gangline_main(argv) == 0
    out = capsys.readouterr().out
    assert "all services: 5 replayed (admission, quota, placement, preemption, node_health)" in out
    print(out)

    # A declaration of failure changed after the fact is named: where, which node, which field.
    target = next(r for r in records if r.type == "gangline.node.failed.v1")
    forged = json.loads(json.dumps(target.envelope))
    forged["data"]["reason"] = "operator said so"
    write_jsonl(
        [
            LogRecord(r.topic, r.partition, r.offset, r.key, forged, r.headers, r.timestamp_ms)
            if r is target
            else r
            for r in records
        ],
        path,
    )
    argv = ["replay", "--from", str(path), "--verify", "--decider", "node-health", "--prefix", topics.prefix]
    assert gangline_main(argv) == 1
    assert f"{target.where} job {doomed}: data.reason: recorded " in capsys.readouterr().out
    print("\n".join(result.summary() for result in results.values()))
