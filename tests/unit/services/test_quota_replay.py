"""Quota's decisions replayed from a recorded log: identical when untouched, across restarts and
batches handled in any partition order; a tampered pending reason or a dropped release is named."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from replay_recorder import TOPICS, Log, ServiceRun, Wiring, envelope_of, outputs_of, tampered
from svc_helpers import T0, env

from gangline.events.allocations import AllocationReleased
from gangline.events.jobs import JobAdmitted, JobRequeued, JobSpec
from gangline.events.types import AllocationId, JobId
from gangline.replay.log import LogRecord
from services.common.select import select_types
from services.quota.handlers import SOURCE, QuotaState, decide
from services.quota.replay import replay_quota
from services.quota.settings import QuotaSettings
from services.quota.wiring import QUOTA_EVENTS, RESTORE_EVENTS, new_state

QUEUES_FILE = Path(__file__).with_name("test_quota_queues.yaml")
"""team: 8 H100 of quota; default and research: unlimited."""
SETTINGS = QuotaSettings(queues_file=QUEUES_FILE)


def wiring() -> Wiring:
    def decider(state: QuotaState, clock: Any) -> Any:
        return lambda envelope, meta: decide(envelope, state, now=clock())

    return Wiring(
        live_topics=(TOPICS.events, TOPICS.allocations),
        restore_topics=(TOPICS.events, TOPICS.allocations),
        new_state=lambda now: new_state(SETTINGS),
        restore=lambda state, envelope: state.restore(envelope),
        decide=decider,
        select=lambda state: select_types(dict.fromkeys(QUOTA_EVENTS, True)),
        restore_select=lambda state: select_types(dict.fromkeys(RESTORE_EVENTS, True)),
    )


def admit(log: Log, job: str, gpus: int, *, priority: int = 0, queue: str = "team") -> None:
    spec = JobSpec(queue=queue, workers=1, gpus_per_worker=gpus, priority=priority)
    log.produce(TOPICS.events, env(JobAdmitted(job_id=JobId(job), spec=spec), at=len(log.records)))


def release(log: Log, job: str, reason: str = "completed") -> None:
    event = AllocationReleased(job_id=JobId(job), allocation_id=AllocationId(f"{job}.1"), reason=reason)
    log.produce(TOPICS.allocations, env(event))


def recorded_log() -> Log:
    """Jobs wait for quota, releases let the highest priority through, quota restarts, a job is requeued."""
    log = Log()
    run = ServiceRun(log, wiring())
    for k in range(6):
        admit(log, f"j{k}", 4, priority=k % 3)
    admit(log, "huge", 16)  # bigger than the queue's whole limit: fails at once
    admit(log, "free", 8, queue="default")
    run.drain(max_per_partition=2)
    release(log, "j0")
    release(log, "j1")
    run.drain()
    run.start()  # restored from the log, then the committed offsets onwards
    admit(log, "j6", 4, priority=5)
    release(log, "j2", reason="preempted")  # not final: still charged, requeued
    log.produce(TOPICS.events, env(JobRequeued(job_id=JobId("j2"), reason="preempted", attempt=2)))
    run.drain(max_per_partition=1)
    for job in ("j3", "j4", "j5"):
        release(log, job)
    run.drain()
    return log


def test_an_untouched_log_replays_identical_across_a_restart() -> None:
    log = recorded_log()
    outputs = outputs_of(log.records, SOURCE)
    kinds = {r.type.split(".")[2] for r in outputs}
    assert {"queued", "pending", "failed"} <= kinds

    result = replay_quota(log.records, SETTINGS)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2
    assert result.compared == len(outputs) >= 10
    assert result.transactions >= 4


def test_a_tampered_pending_reason_is_named_with_its_position_job_and_field() -> None:
    records = recorded_log().records
    target = next(r for r in outputs_of(records, SOURCE) if r.type == "gangline.job.pending.v1")

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["reasons"][0]["details"]["used"] = 0

    result = replay_quota(tampered(records, target, forge), SETTINGS)

    first = result.first
    assert first is not None
    assert (first.where, first.job_id) == (target.where, target.envelope["data"]["job_id"])
    assert first.field == "data.reasons[0].details.used"
    assert first.recorded == "0" and first.replayed == "8"


def test_a_dropped_release_is_named_as_the_decisions_it_made() -> None:
    records = recorded_log().records
    queued = [r for r in outputs_of(records, SOURCE) if r.type == "gangline.job.queued.v1"]
    releases = [r for r in records if r.type == "gangline.allocation.released.v1"]
    dropped = next(r for r in releases if any(q.envelope["causationid"] == r.event_id for q in queued))
    let_through = [q for q in queued if q.envelope["causationid"] == dropped.event_id]

    result = replay_quota([r for r in records if r is not dropped], SETTINGS)

    assert not result.ok
    # What the release let through is missing; so is what its job's requeue decided (it waits for it).
    missing = {d.where for d in result.differences if d.replayed == "not decided by the replay"}
    assert let_through[0].where in missing
    assert result.differences[0].replayed == "not decided by the replay"


def test_the_order_a_batch_handled_its_partitions_is_what_the_replay_follows() -> None:
    """The same inputs handled in other partition orders decide differently; each replays identical."""
    decided: set[tuple[str, ...]] = set()
    for seed in range(6):
        log = Log()
        run = ServiceRun(log, wiring())
        run.rng.seed(seed)
        for k in range(9):
            admit(log, f"j{k}", 4)
        run.drain()
        queued = tuple(
            r.envelope["data"]["job_id"] for r in log.records if r.type == "gangline.job.queued.v1"
        )
        decided.add(queued)
        result = replay_quota(log.records, SETTINGS)
        assert result.ok, [d.message for d in result.differences]
    assert len(decided) > 1


def test_outputs_without_headers_cannot_be_replayed() -> None:
    records = recorded_log().records
    target = outputs_of(records, SOURCE)[0]
    stripped = [
        LogRecord(r.topic, r.partition, r.offset, r.key, r.envelope, {}, r.timestamp_ms) if r is target else r
        for r in records
    ]

    result = replay_quota(stripped, SETTINGS)

    assert [(d.where, d.field) for d in result.differences[:1]] == [(target.where, "headers")]


def test_the_order_waiting_jobs_are_let_through_does_not_depend_on_the_fold_order() -> None:
    """A restore interleaves the partitions as it reads them: the queue's order comes from the log instead."""
    log = Log()
    for k, priority in enumerate([0, 5, 0, 0, 5, 0]):
        admit(log, f"w{k}", 4, priority=priority)
    admitted = [r for r in log.records if r.type == "gangline.job.admitted.v1"]
    blocker = env(
        JobAdmitted(job_id=JobId("blocker"), spec=JobSpec(queue="team", workers=1, gpus_per_worker=8))
    )
    released = env(
        AllocationReleased(job_id=JobId("blocker"), allocation_id=AllocationId("b.1"), reason="failed")
    )
    orders = []
    for seed in range(4):
        state = new_state(SETTINGS)
        decide(blocker, state, now=T0)  # queued: the queue is full
        shuffled = list(admitted)
        random.Random(seed).shuffle(shuffled)
        for r in shuffled:
            envelope = envelope_of(r)
            assert envelope is not None
            decide(envelope, state, now=T0)
        let_through = [e.data.job_id for _, e in decide(released, state, now=T0)]
        orders.append(let_through)
    assert orders[0] == ["w1", "w4"]  # the highest priority first, then the earliest admitted
    assert all(order == orders[0] for order in orders)
