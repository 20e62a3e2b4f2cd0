"""Placement retires finished, fully released jobs: its state stays bounded by the live jobs, and the
log read again (a restore, a re-delivery) cannot bring a retired job back or free GPUs twice."""

from __future__ import annotations

from svc_helpers import admitted, env
from test_placement import feed, grants, new_state

from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope
from gangline.events.jobs import JobCompleted
from gangline.events.types import AllocationId, GpuId, JobId, NodeId, QueueName
from services.placement.handlers import PlacementState


def finish(state: PlacementState, job: str) -> tuple[list[Envelope], AllocationGranted]:
    """Admit ``job`` (one 8-GPU worker), let it run, complete it; the events and its grant."""
    admitted_job = admitted(job, gpus_per_worker=8)
    out = feed(state, admitted_job)
    [grant] = grants(out)
    granted = next(e for e in out if isinstance(e.data, AllocationGranted))
    completed = env(JobCompleted(job_id=JobId(job), allocation_id=grant.allocation_id))
    released = env(
        AllocationReleased(job_id=JobId(job), allocation_id=grant.allocation_id, reason="completed")
    )
    feed(state, completed)
    feed(state, released)
    return [admitted_job, granted, completed, released], grant


def used_gpus(state: PlacementState) -> set[str]:
    return {g for r in state.running() for p in r.allocation.placements for g in p.gpus}


def test_a_finished_fully_released_job_leaves_the_jobs() -> None:
    state = new_state(("a", 1, 8))
    _, grant = finish(state, "done")

    assert "done" not in state.jobs
    assert "done" not in state.waiting
    assert state.retired == {"done": (grant.allocation_id,)}
    assert used_gpus(state) == set()


def test_a_finished_job_still_holding_gpus_is_not_retired() -> None:
    state = new_state(("a", 1, 8))
    [grant] = grants(feed(state, admitted("busy", gpus_per_worker=8)))
    # Folded only (preemption's mirror folds; placement releases at the batch's end).
    state.fold(env(JobCompleted(job_id=JobId("busy"), allocation_id=grant.allocation_id)))

    assert "busy" in state.jobs and state.retired == {}
    assert len(used_gpus(state)) == 8
    assert state.to_release == {(JobId("busy"), grant.allocation_id)}


def test_redelivered_events_of_a_retired_job_change_nothing() -> None:
    state = new_state(("a", 1, 8))
    events, _ = finish(state, "done")
    before = (dict(state.jobs), dict(state.retired), dict(state.waiting), used_gpus(state))

    for envelope in events:
        assert feed(state, envelope) == []

    assert (dict(state.jobs), dict(state.retired), dict(state.waiting), used_gpus(state)) == before
    # The GPUs it had are free: the next job gets them.
    assert [g.job_id for g in grants(feed(state, admitted("next", gpus_per_worker=8)))] == ["next"]


def test_a_grant_for_a_retired_job_arriving_late_keeps_its_gpus_taken() -> None:
    state = new_state(("a", 1, 8))
    finish(state, "done")
    late = AllocationGranted(
        job_id=JobId("done"),
        allocation_id=AllocationId("done.2"),
        queue=QueueName("default"),
        placements=(Placement(rank=0, node=NodeId("a-0"), gpus=tuple(GpuId(f"gpu{k}") for k in range(4))),),
    )

    assert feed(state, env(late)) == []

    assert "done" not in state.retired and state.jobs[JobId("done")].finished
    assert len(used_gpus(state)) == 4
    # Only the other four GPUs are left: a 4-GPU job gets the untaken ones, an 8-GPU job waits.
    [small] = grants(feed(state, admitted("small", gpus_per_worker=4)))
    assert grants(feed(state, admitted("big", gpus_per_worker=8))) == []
    assert set(small.placements[0].gpus).isdisjoint(late.placements[0].gpus)
    # Its release, when it comes, frees them and retires the job again.
    feed(
        state,
        env(AllocationReleased(job_id=JobId("done"), allocation_id=late.allocation_id, reason="failed")),
    )
    assert "done" in state.retired and "done" not in state.jobs
