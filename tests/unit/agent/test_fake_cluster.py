"""The simulated nodes of ``services.agent.fake`` without Kafka: what they send, in which batches."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiokafka.errors import LeaderNotAvailableError

from gangline.cluster_spec import uniform_cluster
from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.codec import encode
from gangline.events.jobs import (
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobPreempting,
    JobSpec,
    JobStarted,
)
from gangline.events.types import AllocationId, GpuId, JobId, NodeId, QueueName
from services.agent.fake import FakeCluster, Outgoing
from services.common.topics import TopicNames

TOPICS = TopicNames(prefix="unit.")


class RecordingCluster(FakeCluster):
    """Sends nothing: keeps each batch it would have sent."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sent: list[list[Outgoing]] = []

    async def _send_all(self, items: Sequence[Outgoing]) -> None:
        self.sent.append(list(items))

    def events(self) -> list[Event]:
        return [event for batch in self.sent for _, event, _ in batch]


def cluster(**overrides: float) -> RecordingCluster:
    # time_scale 0.01: a 1 s job runs 10 ms.
    return RecordingCluster(
        spec=uniform_cluster(4),
        bootstrap="unused:9092",
        topics=TOPICS,
        group_id="unit",
        time_scale=overrides.get("time_scale", 0.01),
        checkpoint_delay_s=overrides.get("checkpoint_delay_s", 0.01),
    )


def envelope(event: Event, event_id: str) -> Envelope:
    return make_envelope(event, event_id=event_id, source="unit", time=datetime.now(UTC))


def admitted(job: str, duration_s: int | None = 1, time_limit_s: int | None = None) -> Envelope:
    spec = JobSpec(
        queue=QueueName("default"),
        workers=1,
        gpus_per_worker=1,
        duration_hint_s=duration_s,
        time_limit_s=time_limit_s,
    )
    return envelope(JobAdmitted(job_id=JobId(job), spec=spec), f"admitted-{job}")


def granted(job: str, node: str = "n-0", gpu: str = "gpu0") -> Envelope:
    event = AllocationGranted(
        job_id=JobId(job),
        allocation_id=AllocationId(f"{job}.1"),
        queue=QueueName("default"),
        placements=(Placement(rank=0, node=NodeId(node), gpus=(GpuId(gpu),)),),
    )
    return envelope(event, f"granted-{job}")


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_the_grants_of_one_poll_are_acknowledged_in_one_batch_in_order() -> None:
    nodes = cluster()
    jobs = [f"j{k}" for k in range(5)]
    for k, job in enumerate(jobs):
        nodes.on_event(admitted(job, duration_s=None))
        nodes.on_event(granted(job, node=f"n-{k % 4}", gpu=f"gpu{k}"))
    await nodes.flush()
    assert len(nodes.sent) == 1
    assert [(topic, type(e), e.job_id) for topic, e, _ in nodes.sent[0]] == [
        (TOPICS.events, JobStarted, JobId(job)) for job in jobs
    ]
    assert nodes.stats.started == 5 and nodes.stats.batches == 1


async def test_a_redelivered_grant_is_started_once() -> None:
    nodes = cluster()
    nodes.on_event(admitted("j", duration_s=None))
    nodes.on_event(granted("j"))
    nodes.on_event(granted("j"))
    await nodes.flush()
    assert [type(e) for e in nodes.events()] == [JobStarted]


async def test_a_grant_read_again_after_its_job_ended_here_starts_nothing() -> None:
    """The chaos run's case: after a long broker outage the nodes' consumer group lost its offsets and
    read old grants again; a job that completed here, or was released, does not start again."""
    nodes = cluster()
    nodes.on_event(admitted("done"))
    nodes.on_event(granted("done"))
    nodes.on_event(admitted("stopped", duration_s=None))
    nodes.on_event(granted("stopped", gpu="gpu1"))
    await nodes.flush()
    await until(lambda: nodes.stats.completed == 1)
    release = AllocationReleased(
        job_id=JobId("stopped"), allocation_id=AllocationId("stopped.1"), reason="preempted"
    )
    nodes.on_event(envelope(release, "released-stopped"))
    for job, gpu in (("done", "gpu0"), ("stopped", "gpu1")):
        nodes.on_event(granted(job, gpu=gpu))
    await nodes.flush()
    assert [type(e) for e in nodes.events()].count(JobStarted) == 2
    assert nodes.running_allocations() == []


async def test_a_job_completes_after_its_start_and_leaves_the_release_to_placement() -> None:
    nodes = cluster()
    nodes.on_event(admitted("j"))
    nodes.on_event(granted("j"))
    await nodes.flush()
    await until(lambda: nodes.stats.completed == 1 and len(nodes.sent) == 2)
    assert [type(e) for e in nodes.events()] == [JobStarted, JobCompleted]
    completed_batch = nodes.sent[1]
    assert [topic for topic, _, _ in completed_batch] == [TOPICS.events]
    completed = completed_batch[0][1]
    assert isinstance(completed, JobCompleted) and completed.gpu_seconds is not None
    assert all(topic != TOPICS.allocations for batch in nodes.sent for topic, _, _ in batch)
    assert nodes.running_allocations() == []


async def test_a_grant_read_before_its_admission_still_completes() -> None:
    # The grant (allocations.log) may be read before job.admitted (jobs.events): the job must not run forever.
    nodes = cluster()
    nodes.on_event(granted("j"))
    await nodes.flush()
    assert nodes.stats.started_before_admitted == 1
    assert [type(e) for e in nodes.events()] == [JobStarted]
    nodes.on_event(admitted("j"))
    await until(lambda: nodes.stats.completed == 1)
    await nodes.flush()
    assert [type(e) for e in nodes.events()] == [JobStarted, JobCompleted]


async def test_a_job_without_a_duration_runs_until_released() -> None:
    nodes = cluster()
    nodes.on_event(admitted("j", duration_s=None))
    nodes.on_event(granted("j"))
    await nodes.flush()
    await asyncio.sleep(0.05)
    assert [g.job_id for g in nodes.running_allocations()] == [JobId("j")]
    release = AllocationReleased(job_id=JobId("j"), allocation_id=AllocationId("j.1"), reason="cancelled")
    nodes.on_event(envelope(release, "release-j"))
    assert nodes.running_allocations() == []


async def test_a_release_before_the_duration_ends_cancels_the_completion() -> None:
    nodes = cluster(time_scale=0.05)  # the 1 s job runs 50 ms
    nodes.on_event(admitted("j"))
    nodes.on_event(granted("j"))
    release = AllocationReleased(job_id=JobId("j"), allocation_id=AllocationId("j.1"), reason="preempted")
    nodes.on_event(envelope(release, "release-j"))
    await nodes.flush()
    await asyncio.sleep(0.1)
    await nodes.flush()
    assert [type(e) for e in nodes.events()] == [JobStarted]
    assert nodes.stats.completed == 0


async def test_preempting_is_acknowledged_with_a_checkpoint_after_the_delay() -> None:
    nodes = cluster()
    nodes.on_event(admitted("j", duration_s=None))
    nodes.on_event(granted("j", node="n-2"))
    asked = JobPreempting(
        job_id=JobId("j"),
        allocation_id=AllocationId("j.1"),
        deadline=datetime.now(UTC) + timedelta(seconds=30),
        reason="an urgent job needs the GPUs",
    )
    nodes.on_event(envelope(asked, "preempting-j"))
    await nodes.flush()
    await until(lambda: nodes.stats.checkpointed == 1)
    await nodes.flush()
    ack = nodes.events()[-1]
    assert isinstance(ack, JobCheckpointed)
    assert (ack.allocation_id, ack.node, ack.checkpoint) == ("j.1", "n-2", "ckpt://j/j.1")


async def test_a_silent_node_neither_starts_nor_acknowledges() -> None:
    nodes = cluster(checkpoint_delay_s=0.02)
    nodes.on_event(admitted("j", duration_s=None))
    nodes.on_event(granted("j", node="n-1"))
    await nodes.fail_node(NodeId("n-1"))
    asked = JobPreempting(
        job_id=JobId("j"),
        allocation_id=AllocationId("j.1"),
        deadline=datetime.now(UTC) + timedelta(seconds=30),
        reason="an urgent job needs the GPUs",
    )
    nodes.on_event(envelope(asked, "preempting-j"))
    nodes.on_event(admitted("k", duration_s=None))
    nodes.on_event(granted("k", node="n-1", gpu="gpu3"))
    await asyncio.sleep(0.06)
    await nodes.flush()
    assert [(type(e), e.job_id) for e in nodes.events()] == [(JobStarted, JobId("j"))]


@dataclass
class Record:
    key: bytes | None
    value: bytes | None
    topic: str = TOPICS.allocations


async def test_releases_of_jobs_not_running_here_are_not_decoded() -> None:
    nodes = cluster()
    nodes.on_event(admitted("j", duration_s=None))
    nodes.on_event(granted("j"))
    release = AllocationReleased(job_id=JobId("j"), allocation_id=AllocationId("j.1"), reason="preempted")
    value = encode(envelope(release, "release-j"))
    other = encode(
        envelope(
            AllocationReleased(job_id=JobId("k"), allocation_id=AllocationId("k.1"), reason="completed"),
            "release-k",
        )
    )
    assert nodes._wanted(Record(b"j", value))
    assert not nodes._wanted(Record(b"k", other))
    assert nodes._wanted(Record(b"k", encode(granted("k"))))
    assert nodes._wanted(Record(b"k", b"not json"))  # unrecognisable: decoded (and ignored) as before
    started = JobStarted(job_id=JobId("k"), allocation_id=AllocationId("k.1"))
    assert not nodes._wanted(Record(b"k", encode(envelope(started, "s"))))  # not an agent's business
    nodes.on_event(envelope(release, "release-j"))
    assert not nodes._wanted(Record(b"j", value))  # ended here: its release, read again, is skipped


async def test_a_job_past_its_time_limit_checkpoints_and_fails_with_time_limit() -> None:
    nodes = cluster()
    nodes.on_event(admitted("j", duration_s=3600, time_limit_s=1))  # 1 s of job time: 10 ms here
    nodes.on_event(granted("j"))
    await nodes.flush()
    await until(lambda: any(isinstance(e, JobFailed) for e in nodes.events()))
    await nodes.flush()
    assert [type(e) for e in nodes.events()] == [JobStarted, JobCheckpointed, JobFailed]
    failed = nodes.events()[-1]
    assert isinstance(failed, JobFailed) and failed.code == "time_limit"
    assert nodes.stats.completed == 0 and nodes.running_allocations() == []


async def test_a_job_checkpointed_for_a_preemption_stops_and_never_completes() -> None:
    """Its release is the preemption's: a job.completed after the checkpoint would race it (placement
    releasing the allocation again, a requeued job that had ended)."""
    nodes = cluster(time_scale=0.05, checkpoint_delay_s=0.01)  # the 1 s job would complete at 50 ms
    nodes.on_event(admitted("j"))
    nodes.on_event(granted("j"))
    asked = JobPreempting(
        job_id=JobId("j"),
        allocation_id=AllocationId("j.1"),
        deadline=datetime.now(UTC) + timedelta(seconds=30),
        reason="an urgent job needs the GPUs",
    )
    nodes.on_event(envelope(asked, "preempting-j"))
    await nodes.flush()
    await until(lambda: nodes.stats.checkpointed == 1)
    await asyncio.sleep(0.1)
    await nodes.flush()
    assert [type(e) for e in nodes.events()] == [JobStarted, JobCheckpointed]
    assert nodes.stats.completed == 0


class FlakyBroker:
    """An aiokafka producer stand-in whose deliveries fail while ``away`` (a broker restart longer than
    the producer's timeout: aiokafka fails the batch with the last retriable error)."""

    def __init__(self) -> None:
        self.away = True
        self.taken: list[tuple[str, bytes]] = []
        self.refused = 0

    async def send(self, topic: str, *, value: bytes, **_: object) -> asyncio.Future[None]:
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.away:
            self.refused += 1
            delivery.set_exception(LeaderNotAvailableError())
        else:
            self.taken.append((topic, value))
            delivery.set_result(None)
        return delivery


@dataclass
class _Producer:
    raw: FlakyBroker
    chain: None = None


def on_flaky_broker(broker: FlakyBroker) -> FakeCluster:
    nodes = FakeCluster(
        spec=uniform_cluster(2),
        bootstrap="unused:9092",
        topics=TOPICS,
        group_id="unit",
        time_scale=0.01,
        heartbeat_s=0.01,
        resend_s=0.01,
    )
    nodes._producer = _Producer(broker)  # type: ignore[assignment]
    return nodes


async def test_reports_the_broker_did_not_take_are_sent_again_in_order_when_it_is_back() -> None:
    """The chaos run's case: the broker's restart took 65 s on a loaded machine; the nodes' sends failed
    with LeaderNotAvailableError and the whole simulated cluster stopped."""
    broker = FlakyBroker()
    nodes = on_flaky_broker(broker)
    nodes.on_event(admitted("a", duration_s=None))
    nodes.on_event(granted("a"))
    nodes.on_event(admitted("b", duration_s=None))
    nodes.on_event(granted("b", gpu="gpu1"))
    flush = asyncio.ensure_future(nodes.flush())
    await until(lambda: broker.refused >= 4)
    assert not flush.done()  # still trying
    broker.away = False
    await asyncio.wait_for(flush, 5)
    sent = [json.loads(value) for _, value in broker.taken]
    assert [(e["type"], e["data"]["job_id"]) for e in sent] == [
        ("gangline.job.started.v1", "a"),
        ("gangline.job.started.v1", "b"),
    ]


async def test_heartbeats_the_broker_did_not_take_are_dropped_and_the_beats_go_on() -> None:
    broker = FlakyBroker()
    nodes = on_flaky_broker(broker)
    beats = asyncio.create_task(nodes._heartbeats())
    try:
        await until(lambda: broker.refused >= 4)
        assert not beats.done() and nodes.stats.heartbeats == 0
        broker.away = False
        await until(lambda: nodes.stats.heartbeats >= 4)
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
    assert {topic for topic, _ in broker.taken} == {TOPICS.heartbeats}
