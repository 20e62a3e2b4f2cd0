"""The lifecycle fold reads quota's move of a queued job (``job.queued`` that ``replaces`` another) as the
same attempt placed on another GPU model, not as a second attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gangline.events.allocations import AllocationGranted, Placement
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import JobAdmitted, JobQueued, JobSpec
from gangline.events.types import AllocationId, JobId, NodeId
from gangline.fold.cluster import ClusterFold

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = JobId("j1")


def env(event: Event, event_id: str, at: float = 0.0) -> Envelope:
    return make_envelope(event, event_id=event_id, source="test", time=T0 + timedelta(seconds=at))


def test_a_moved_job_waits_once_on_its_new_model_and_a_grant_ends_its_wait() -> None:
    fold = ClusterFold(gated=True)
    spec = JobSpec(queue="team-a", workers=1, gpus_per_worker=4)
    fold.fold(env(JobAdmitted(job_id=JOB, spec=spec), "admitted"))
    fold.fold(env(JobQueued(job_id=JOB, queue="team-a", gpu_type="H100"), "queued"))
    record = fold.jobs[JOB]
    assert JOB in fold.waiting and record.placement_spec() is not None
    assert record.placement_spec().gpu_type == "H100"  # type: ignore[union-attr]

    moved = JobQueued(job_id=JOB, queue="team-a", gpu_type="GB200", replaces="queued")
    assert fold.fold(env(moved, "moved", at=1))  # news: placement runs a cycle for it
    for _ in range(2):  # read again: the same, and no news
        assert not fold.fold(env(moved, "moved", at=1))
        assert record.allowed_attempts(gated=True) == 1
        assert record.placement_spec().gpu_type == "GB200"  # type: ignore[union-attr]

    granted = AllocationGranted(
        job_id=JOB,
        allocation_id=AllocationId("j1.1"),
        queue="team-a",
        placements=(Placement(rank=0, node=NodeId("gb-0"), gpus=("gpu0", "gpu1", "gpu2", "gpu3")),),
    )
    fold.fold(env(granted, "granted", at=2))
    assert JOB not in fold.waiting  # one attempt, granted: no second grant is owed
