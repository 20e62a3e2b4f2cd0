"""Preemption decides once per batch, as it did per event, and keeps state only for live jobs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from svc_helpers import T0, admitted, cluster, env

from gangline.core.actions.queueing import run_queue_cycle
from gangline.core.defaults import default_profile
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import (
    JobCheckpointed,
    JobCompleted,
    JobPending,
    JobPreempted,
    JobPreempting,
    PendingReason,
)
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState
from services.placement.handlers import decide as place
from services.preemption import handlers
from services.preemption.handlers import PreemptionState, decide, end_batch, fold_event

TOPICS = TopicNames()


def new_states(*groups: tuple[str, int, int]) -> tuple[PlacementState, PreemptionState]:
    placement = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    preemption = PreemptionState(mirror=PlacementState(topics=TOPICS, profile=default_profile(), gated=False))
    for node in cluster(*groups).registrations():
        placement.restore(env(node))
        preemption.restore(env(node))
    return placement, preemption


def run(placement: PlacementState, preemption: PreemptionState, envelope: Envelope) -> list[Envelope]:
    """``envelope`` and placement's answers to it, as preemption reads them from the log."""
    preemption.restore(envelope)
    outputs = [out for _, out in place(envelope, placement, now=T0)]
    for out in outputs:
        preemption.restore(out)
    return outputs


def pending(job: str, code: str = "capacity") -> Envelope:
    return env(
        JobPending(job_id=JobId(job), reasons=(PendingReason(code=code, constraint="c", message="m"),))
    )


def checkpointed(job: str, allocation: str, at: float) -> Envelope:
    ack = JobCheckpointed(
        job_id=JobId(job),
        allocation_id=AllocationId(allocation),
        node=NodeId("a-0"),
        checkpoint=f"ckpt://{job}",
    )
    return env(ack, at=at)


def full_cluster() -> tuple[PlacementState, PreemptionState]:
    """Two 8-GPU nodes full of preemptible 4-GPU jobs (three checkpointed at different times); two wait."""
    placement, preemption = new_states(("a", 2, 8))
    for k in range(3):
        run(placement, preemption, admitted(f"low-{k}", gpus_per_worker=4, preemptible=True))
        preemption.restore(checkpointed(f"low-{k}", f"low-{k}.1", at=100 * k))
    run(placement, preemption, admitted("mid", gpus_per_worker=4, priority=1, preemptible=True))
    for urgent in (
        admitted("urgent", gpus_per_worker=8, priority=5),
        admitted("second", gpus_per_worker=4, priority=3),
    ):
        assert not any(isinstance(e.data, AllocationGranted) for e in run(placement, preemption, urgent))
    return placement, preemption


def summary(outputs: list[tuple[str, Envelope]]) -> list[tuple[str, str, str, str]]:
    rows = []
    for topic, envelope in outputs:
        data = envelope.data
        assert isinstance(data, JobPreempting)
        rows.append((topic, envelope.id, data.allocation_id, str(data.preemptor_job_id)))
    return rows


def test_one_search_per_batch_asks_the_same_victims_as_one_search_per_event() -> None:
    now = T0 + timedelta(seconds=1000)
    batch = [pending("urgent"), pending("other", code="quota"), pending("second"), pending("urgent")]
    _, per_event = full_cluster()
    one_by_one = [out for envelope in batch for out in decide(envelope, per_event, now=now)]
    _, batched = full_cluster()
    folded = [out for envelope in batch for out in fold_event(envelope, batched, now=now)]
    assert folded == []
    once = end_batch(batched, now=now)
    assert summary(once) == summary(one_by_one)
    # Since their last checkpoint low-0..2 lost 1000, 900, 800 s of 4 GPUs, mid (never checkpointed) 1000 s.
    # urgent needs a whole node: a-1 (low-2 + mid: 1800) costs less than a-0 (low-0 + low-1: 1900).
    assert [(a, p) for _, _, a, p in summary(once)] == [
        ("low-2.1", "urgent"),
        ("mid.1", "urgent"),
        ("low-1.1", "second"),
    ]
    assert batched.asked == per_event.asked and batched.in_flight.keys() == per_event.in_flight.keys()


def test_a_batch_plans_once_for_its_pending_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    cycle = run_queue_cycle

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append("search")
        return cycle(*args, **kwargs)

    monkeypatch.setattr(handlers, "run_queue_cycle", counting)
    _, state = full_cluster()
    now = T0 + timedelta(seconds=1000)
    for _ in range(10):
        fold_event(pending("second"), state, now=now)
    assert len(end_batch(state, now=now)) == 1
    assert calls == ["search"]
    assert end_batch(state, now=now) == []  # nothing pending since
    assert calls == ["search"]


def test_finished_jobs_leave_no_state_behind() -> None:
    placement, preemption = new_states(("a", 1, 8))
    for k in range(50):
        job = f"j{k}"
        [granted] = [
            e.data
            for e in run(placement, preemption, admitted(job, gpus_per_worker=8, preemptible=True))
            if isinstance(e.data, AllocationGranted)
        ]
        preemption.restore(checkpointed(job, granted.allocation_id, at=k))
        done = [
            env(JobCompleted(job_id=JobId(job), allocation_id=granted.allocation_id)),
            env(
                AllocationReleased(job_id=JobId(job), allocation_id=granted.allocation_id, reason="completed")
            ),
        ]
        for envelope in done:
            run(placement, preemption, envelope)
        # Delivered again (a retried batch, a restart): nothing comes back.
        for envelope in [env(granted), checkpointed(job, granted.allocation_id, at=k), *done]:
            preemption.restore(envelope)
    assert preemption.mirror.jobs == {}
    assert preemption.started_at == {}
    assert preemption.checkpoints == {}
    assert preemption.asked == set() and preemption.in_flight == {}


def test_a_released_victim_is_forgotten_even_when_its_request_comes_again() -> None:
    placement, preemption = new_states(("a", 1, 8))
    run(placement, preemption, admitted("cheap", gpus_per_worker=8, preemptible=True, checkpoint_grace_s=5))
    run(placement, preemption, admitted("urgent", gpus_per_worker=8, priority=5))
    [(_, asking)] = decide(pending("urgent"), preemption, now=T0)
    assert preemption.asked == {AllocationId("cheap.1")}
    done = decide(checkpointed("cheap", "cheap.1", at=1), preemption, now=T0 + timedelta(seconds=1))
    assert [type(e.data) for _, e in done][:2] == [AllocationReleased, JobPreempted]
    assert preemption.asked == set() and "cheap.1" not in preemption.started_at
    preemption.restore(asking)  # re-delivered
    assert preemption.asked == set() and preemption.in_flight == {}
    # The requeued job keeps its checkpoint: it resumes from it.
    assert preemption.checkpoints[JobId("cheap")][1] == "ckpt://cheap"


def test_a_restore_reading_requests_before_grants_still_finishes_the_preemption() -> None:
    placement, preemption = new_states(("a", 1, 8))
    events: list[Envelope] = []
    allocations: list[Envelope] = []
    nodes = [env(n) for n in cluster(("a", 1, 8)).registrations()]

    def log(envelopes: list[Envelope]) -> None:
        for e in envelopes:
            target = allocations if isinstance(e.data, AllocationGranted | AllocationReleased) else events
            target.append(e)

    for request in (
        admitted("cheap", gpus_per_worker=8, preemptible=True, checkpoint_grace_s=5),
        admitted("urgent", gpus_per_worker=8, priority=5),
    ):
        log([request, *run(placement, preemption, request)])
    log([e for _, e in decide(pending("urgent"), preemption, now=T0)])
    assert any(isinstance(e.data, JobPreempting) for e in events)

    # A new replica folds the log topic by topic: inventory, jobs.events, then allocations.log.
    restored = PreemptionState(mirror=PlacementState(topics=TOPICS, profile=default_profile(), gated=False))
    for envelope in [*nodes, *events, *allocations]:
        restored.restore(envelope)
    assert set(restored.in_flight) == {AllocationId("cheap.1")}
    assert decide(pending("urgent"), restored, now=T0 + timedelta(seconds=1)) == []  # never asked twice
    out = [e.data for _, e in decide(pending("x", "quota"), restored, now=T0 + timedelta(seconds=6))]
    [preempted] = [d for d in out if isinstance(d, JobPreempted)]
    assert preempted.allocation_id == AllocationId("cheap.1") and not preempted.checkpointed
