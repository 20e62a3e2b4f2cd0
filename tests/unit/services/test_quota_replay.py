"""Quota's decisions replayed from a recorded log: identical when untouched, across restarts and
batches handled in any partition order; a tampered pending reason or a dropped release is named."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from typing import Any

from replay_recorder import TOPICS, Log, ServiceRun, Wiring, envelope_of, outputs_of, tampered
from svc_helpers import T0, env

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationReleased
from gangline.events.jobs import JobAdmitted, JobCompleted, JobRequeued, JobSpec
from gangline.events.nodes import NodeFailed, NodeRegistered
from gangline.events.types import AllocationId, JobId
from gangline.replay.log import LogRecord
from services.quota.handlers import SOURCE, QuotaState, decide
from services.quota.replay import replay_quota
from services.quota.settings import QuotaSettings
from services.quota.status import tick
from services.quota.wiring import (
    LIVE_EVENTS,
    RESTORE_EVENTS,
    input_topics,
    new_state,
    quota_select,
    restore_topics,
)

H100 = "H100-SXM5-80GB"
GB200 = "GB200-186GB"
QUEUES_FILE = Path(__file__).with_name("test_quota_queues.yaml")
"""team: 8 H100 of quota; default and research: unlimited."""
SETTINGS = QuotaSettings(queues_file=QUEUES_FILE)


def wiring(settings: QuotaSettings = SETTINGS) -> Wiring:
    def decider(state: QuotaState, clock: Any) -> Any:
        return lambda envelope, meta: decide(envelope, state, now=clock())

    return Wiring(
        live_topics=input_topics(TOPICS),
        restore_topics=restore_topics(TOPICS),
        new_state=lambda now: new_state(settings),
        restore=lambda state, envelope: state.restore(envelope),
        decide=decider,
        select=lambda state: quota_select(TOPICS, state.retired, LIVE_EVENTS),
        restore_select=lambda state: quota_select(TOPICS, state.retired, RESTORE_EVENTS),
    )


def admit(
    log: Log,
    job: str,
    gpus: int,
    *,
    priority: int = 0,
    queue: str = "team",
    gpu_type: str | None = None,
    at: float | None = None,
) -> None:
    spec = JobSpec(queue=queue, workers=1, gpus_per_worker=gpus, priority=priority, gpu_type=gpu_type)
    when = len(log.records) if at is None else at
    log.produce(TOPICS.events, env(JobAdmitted(job_id=JobId(job), spec=spec), at=when))


def group(name: str, model: str, count: int, gpus: int) -> list[NodeRegistered]:
    spec = NodeGroup(name=name, count=count, gpu_model=model, gpus_per_node=gpus, memory_mib=81920, leaf="l")
    return ClusterSpec(groups=(spec,)).registrations()


def release(log: Log, job: str, reason: str = "completed", *, at: float = 0.0) -> None:
    event = AllocationReleased(job_id=JobId(job), allocation_id=AllocationId(f"{job}.1"), reason=reason)
    log.produce(TOPICS.allocations, env(event, at=at))


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


STATUS_EVERY_S = QuotaSettings(queues_file=QUEUES_FILE, status_interval_s=1.0, fair_share_half_life_s=60.0)
"""Queue statuses at most once a second of event time (the log's events are a second apart)."""


def status_log() -> Log:
    """Usage in the team's tree moves, in event time, before and after a restart of quota."""
    log = Log()
    run = ServiceRun(log, wiring(STATUS_EVERY_S))
    for k in range(4):
        admit(log, f"j{k}", 4, priority=k % 2)
    run.drain(max_per_partition=1)
    release(log, "j0", at=len(log.records))
    run.drain()
    run.start()
    admit(log, "j4", 2)
    release(log, "j1", at=len(log.records))
    run.drain(max_per_partition=1)
    for job in ("j2", "j3"):
        release(log, job, at=len(log.records))
        run.drain()
    return log


def test_queue_statuses_replay_identical_across_a_restart() -> None:
    log = status_log()
    statuses = [r for r in outputs_of(log.records, SOURCE) if r.type == "gangline.queue.status.v1"]
    assert {r.topic for r in statuses} == {TOPICS.queue_status}
    runs = {r.headers.get("gangline-incarnation") for r in statuses}
    assert len(runs) == 2  # published before and after the restart

    result = replay_quota(log.records, STATUS_EVERY_S)

    assert result.ok, [d.message for d in result.differences]
    assert result.compared == len(outputs_of(log.records, SOURCE))


def test_a_status_waits_for_an_event_quota_handles_not_one_it_skips_and_the_replay_skips_it_too() -> None:
    """The live ``select`` skips, undecoded, what is read about a retired job: quota never sees it. A status
    held back by the interval goes with the next event quota does handle; the replay must not hand
    quota the skipped record (it would publish the status there, with another cause)."""
    log = Log()
    run = ServiceRun(log, wiring(STATUS_EVERY_S))
    admit(log, "j0", 4, at=0)  # queued: usage moves, the first status
    run.drain()
    release(log, "j0", at=0.5)  # j0 retired (its final release); within the interval: the status waits
    run.drain()
    completed = JobCompleted(job_id=JobId("j0"), allocation_id=AllocationId("j0.1"))
    log.produce(TOPICS.events, env(completed, at=2))  # the interval is over, but j0 is retired: skipped live
    run.drain()
    admit(log, "j1", 2, at=3)  # the next event quota handles: the held-back status goes with it
    run.drain()

    statuses = [r for r in outputs_of(log.records, SOURCE) if r.type == "gangline.queue.status.v1"]
    causes = [next(c for c in log.records if c.event_id == r.envelope["causationid"]) for r in statuses]
    assert [c.type for c in causes] == ["gangline.job.admitted.v1"] * 2
    assert [r.envelope["data"]["resources"][H100]["used"] for r in statuses] == [4, 2]

    result = replay_quota(log.records, STATUS_EVERY_S)

    assert result.ok, [d.message for d in result.differences]
    assert result.compared == len(outputs_of(log.records, SOURCE))


def test_a_status_quotas_tick_made_due_is_replayed_like_any_other() -> None:
    """The cluster goes quiet with a status held back; quota's tick (in the log, on quota.ticks) makes it
    due, and the replay re-decides it from the same records; a forged one is named."""
    log = Log()
    run = ServiceRun(log, wiring(STATUS_EVERY_S))
    admit(log, "j0", 4, at=0)  # the first status
    run.drain()
    admit(log, "j1", 2, at=0.5)  # held back: inside the interval, and nothing follows
    run.drain()
    log.produce(TOPICS.quota_ticks, tick("team", at=T0 + timedelta(seconds=30), event_id="tick-1"))
    run.drain()

    statuses = [r for r in outputs_of(log.records, SOURCE) if r.type == "gangline.queue.status.v1"]
    assert [r.envelope["data"]["resources"][H100]["used"] for r in statuses] == [4, 6]
    assert statuses[-1].envelope["causationid"] == "tick-1"
    result = replay_quota(log.records, STATUS_EVERY_S)
    assert result.ok, [d.message for d in result.differences]
    decided = [r for r in outputs_of(log.records, SOURCE) if r.topic != TOPICS.quota_ticks]  # not the tick
    assert result.compared == len(decided) == 4

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["resources"][H100]["used"] = 4

    forged = replay_quota(tampered(log.records, statuses[-1], forge), STATUS_EVERY_S).first
    assert forged is not None and forged.where == statuses[-1].where


def test_a_tampered_queue_status_is_named_with_its_field() -> None:
    records = status_log().records
    target = [r for r in outputs_of(records, SOURCE) if r.type == "gangline.queue.status.v1"][-1]

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["dominant_share"] = 0.5

    result = replay_quota(tampered(records, target, forge), STATUS_EVERY_S)

    first = result.first
    assert first is not None
    assert (first.where, first.field, first.recorded) == (target.where, "data.dominant_share", "0.5")


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


def test_decisions_over_the_node_inventory_replay_identical_across_a_restart(tmp_path: Path) -> None:
    """A 1x8 job waits for H100 rather than go to 4-GPU GB200 nodes; once a GB200 node of 8 registers,
    the waiting jobs go there; after an H100 node fails the other still holds a worker of 8; quota
    restarts between."""
    queues = tmp_path / "queues.yaml"
    queues.write_text(
        "queues:\n  - name: team\n    quotas:\n"
        f"      {H100}: {{nominal: 8}}\n      {GB200}: {{nominal: 16}}\n",
        encoding="utf-8",
    )
    settings = QuotaSettings(queues_file=queues)
    log = Log()
    run = ServiceRun(log, wiring(settings))
    h100 = group("h", H100, 2, 8)
    for node in [*h100, *group("gb", GB200, 2, 4)]:
        log.produce(TOPICS.inventory, env(node, at=len(log.records)))
    run.drain()
    admit(log, "first", 8)
    run.drain()
    admit(log, "second", 8)  # H100 is in use: waits for it, not charged to GB200
    admit(log, "wide", 8, gpu_type=GB200)  # no GB200 node of 8: waits, saying so
    run.drain(max_per_partition=1)
    run.start()
    for node in group("gb8", GB200, 1, 8):
        log.produce(TOPICS.inventory, env(node, at=len(log.records)))  # "second" and "wide" go to it
    failed = NodeFailed(node=h100[1].node, code="heartbeat_timeout", reason="missed heartbeats")
    log.produce(TOPICS.health, env(failed, at=len(log.records)))
    run.drain()
    release(log, "first")
    run.drain()
    admit(log, "third", 8)  # H100 quota is free, and the node left holds a worker of 8
    run.drain()

    outputs = outputs_of(log.records, SOURCE)
    queued = {
        r.envelope["data"]["job_id"]: r.envelope["data"]["gpu_type"]
        for r in outputs
        if r.type == "gangline.job.queued.v1"
    }
    assert queued == {"first": H100, "second": GB200, "wide": GB200, "third": H100}
    reasons = [r.envelope["data"]["reasons"][0] for r in outputs if r.type == "gangline.job.pending.v1"]
    assert {(r["code"], r["constraint"]) for r in reasons} == {("quota", "quota"), ("gang_size", "hardware")}

    result = replay_quota(log.records, settings)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2 and result.compared == len(outputs)


def test_a_release_read_before_the_end_it_answers_dates_the_charge_as_the_replay_does() -> None:
    """Placement releases a job's GPUs once it reads the agent's job.completed, at its own later time, on
    another topic: quota may read the release first (then the job is retired and the end is skipped),
    while the replay folds a quiet batch in record-time order (the end first). Either way the charge
    ends at the release, so the next status's decayed share is the live one to the last digit."""
    log = Log()
    run = ServiceRun(log, wiring(STATUS_EVERY_S))
    admit(log, "j0", 4, at=0)  # queued, the first status
    run.drain()
    completed = JobCompleted(job_id=JobId("j0"), allocation_id=AllocationId("j0.1"))
    log.produce(TOPICS.events, env(completed, at=0.3))
    release(log, "j0", at=0.8)  # within the interval: the batch decides nothing
    # This batch reads allocations.log before jobs.events, as a consumer may.
    run.rng.shuffle = lambda batch: batch.sort(key=lambda b: b[0][0] != TOPICS.allocations)  # type: ignore[method-assign]
    assert run.drain() == []
    admit(log, "j1", 2, at=3)  # the next status: j0's charge is history, j1's is present
    run.drain()

    statuses = [r for r in outputs_of(log.records, SOURCE) if r.type == "gangline.queue.status.v1"]
    assert [r.envelope["data"]["resources"][H100]["used"] for r in statuses] == [4, 2]
    result = replay_quota(log.records, STATUS_EVERY_S)
    assert result.ok, [d.message for d in result.differences]
    assert result.compared == len(outputs_of(log.records, SOURCE))
