"""A batch whose transaction aborts is retried and replayed once, on the real broker: placement (the
service's own wiring) decides a cycle, its commit fails, a job arrives meanwhile; the retry publishes
the cycle once, and ``gangline replay --verify --decider all`` over the log, its aborted transaction
included, finds every output identical and counts each once."""

from __future__ import annotations

import asyncio
import functools

import pytest
from service_kafka_helpers import envelope, on_topics, running

import services.common.shell as shell
from gangline.bus import BatchInfo, Processor
from gangline.bus.producer import EventProducer
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.base import Envelope
from gangline.events.jobs import JobAdmitted, JobSpec
from gangline.events.types import JobId
from gangline.replay.kafka import KafkaSource
from gangline.replay.log import LogRecord
from services.common import replay
from services.common.topics import TopicNames
from services.placement.handlers import SOURCE
from services.placement.settings import PlacementSettings
from services.placement.wiring import main

pytestmark = pytest.mark.kafka

GRANTED = "gangline.allocation.granted.v1"
SPEC = ClusterSpec(
    name="abort",
    groups=(
        NodeGroup(name="a", count=2, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="l"),
    ),
)


def admitted(job: str, at: float) -> Envelope:
    return envelope(
        JobAdmitted(job_id=JobId(job), spec=JobSpec(queue="default", workers=1, gpus_per_worker=2)), at
    )


async def placement_outputs(bootstrap: str, topics: TopicNames, grants: int) -> list[LogRecord]:
    for _ in range(300):
        records = await KafkaSource(bootstrap).fetch(replay.decider_topics(topics.prefix))
        if sum(1 for r in records if r.type == GRANTED) >= grants:
            return records
        await asyncio.sleep(0.2)
    raise AssertionError(f"fewer than {grants} grants in the log")


async def test_a_cycle_whose_commit_aborted_while_a_job_arrived_is_published_and_replayed_once(
    kafka_bootstrap: str,
    service_topics: TopicNames,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with EventProducer(kafka_bootstrap) as producer:
        aborted: list[BatchInfo] = []

        async def abort_the_first_cycle(batch: BatchInfo) -> None:
            if batch.outputs and not aborted:
                aborted.append(batch)
                # A job comes while the cycle's transaction is open; then the commit fails.
                await producer.publish(service_topics.events, admitted("late", 5))
                raise ConnectionError("simulated failure between produce and commit")

        monkeypatch.setattr(
            shell, "Processor", functools.partial(Processor, before_commit=abort_the_first_cycle)
        )
        settings = PlacementSettings(
            **on_topics(kafka_bootstrap, service_topics),
            gated=False,
        )
        for node in SPEC.registrations():
            await producer.publish(service_topics.inventory, envelope(node, 0))
        async with running(main(settings)):
            for k in range(3):
                await producer.publish(service_topics.events, admitted(f"j{k}", 1 + k))
            records = await placement_outputs(kafka_bootstrap, service_topics, grants=4)
            await asyncio.sleep(1)  # anything more would be a decision published twice
            records = await placement_outputs(kafka_bootstrap, service_topics, grants=4)
    assert len(aborted) == 1
    grants = [r.envelope["data"]["job_id"] for r in records if r.type == GRANTED]
    assert sorted(grants) == ["j0", "j1", "j2", "late"]  # each once
    outputs = [r for r in records if r.envelope.get("source") == SOURCE]

    assert replay.verify_decisions(records, prefix=service_topics.prefix, gated=False, max_problems=5)

    said = capsys.readouterr().out
    assert f"{len(outputs)} outputs compared: identical" in said, said
