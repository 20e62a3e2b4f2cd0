from __future__ import annotations

from datetime import timedelta

from svc_helpers import T0, admitted, cluster, env

from gangline.core.defaults import default_profile
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import (
    JobCheckpointed,
    JobPending,
    JobPreempted,
    JobPreempting,
    JobRequeued,
    PendingReason,
)
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState
from services.placement.handlers import decide as place
from services.preemption.handlers import PreemptionState, decide

TOPICS = TopicNames()


def setup() -> tuple[PlacementState, PreemptionState]:
    placement = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    preemption = PreemptionState(mirror=PlacementState(topics=TOPICS, profile=default_profile(), gated=False))
    for node in cluster(("a", 1, 8)).registrations():
        placement.restore(env(node))
        preemption.restore(env(node))
    return placement, preemption


def run_job(
    placement: PlacementState, preemption: PreemptionState, envelope: Envelope
) -> AllocationGranted | None:
    preemption.restore(envelope)
    for _, out in place(envelope, placement, now=T0):
        preemption.restore(out)
        if isinstance(out.data, AllocationGranted):
            return out.data
    return None


def pending(job: str) -> Envelope:
    reason = PendingReason(code="capacity", constraint="gang", message="no room")
    return env(JobPending(job_id=JobId(job), reasons=(reason,)))


def test_victims_are_asked_to_checkpoint_then_released_and_requeued_from_the_checkpoint() -> None:
    placement, preemption = setup()
    run_job(
        placement, preemption, admitted("cheap", gpus_per_worker=4, preemptible=True, checkpoint_grace_s=60)
    )
    run_job(placement, preemption, admitted("keep", gpus_per_worker=4, preemptible=False))
    assert run_job(placement, preemption, admitted("urgent", gpus_per_worker=4, priority=5)) is None
    out = decide(pending("urgent"), preemption, now=T0 + timedelta(seconds=10))
    [asking] = [e.data for _, e in out]
    assert isinstance(asking, JobPreempting)
    assert (asking.job_id, asking.preemptor_job_id) == ("cheap", "urgent")
    assert asking.deadline == T0 + timedelta(seconds=70)
    # Asked only once.
    assert decide(pending("urgent"), preemption, now=T0 + timedelta(seconds=11)) == []
    ack = JobCheckpointed(
        job_id=JobId("cheap"),
        allocation_id=asking.allocation_id,
        node=NodeId("a-0"),
        checkpoint="ckpt://cheap/1",
    )
    done = [e.data for _, e in decide(env(ack, at=12), preemption, now=T0 + timedelta(seconds=12))]
    assert [type(d) for d in done] == [AllocationReleased, JobPreempted, JobRequeued]
    assert isinstance(done[1], JobPreempted) and done[1].checkpointed
    assert (
        isinstance(done[2], JobRequeued) and done[2].resume_from == "ckpt://cheap/1" and done[2].attempt == 2
    )


def test_a_victim_that_misses_its_deadline_is_released_without_a_checkpoint() -> None:
    placement, preemption = setup()
    run_job(
        placement, preemption, admitted("cheap", gpus_per_worker=8, preemptible=True, checkpoint_grace_s=5)
    )
    run_job(placement, preemption, admitted("urgent", gpus_per_worker=8, priority=5))
    [(_, asking)] = decide(pending("urgent"), preemption, now=T0)
    assert isinstance(asking.data, JobPreempting)
    later = env(
        JobPending(job_id=JobId("x"), reasons=(PendingReason(code="quota", constraint="q", message="m"),))
    )
    out = [e.data for _, e in decide(later, preemption, now=T0 + timedelta(seconds=6))]
    [preempted] = [d for d in out if isinstance(d, JobPreempted)]
    assert not preempted.checkpointed and preempted.allocation_id == AllocationId("cheap.1")


def test_nothing_is_preempted_for_an_equal_priority_or_for_quota() -> None:
    placement, preemption = setup()
    run_job(placement, preemption, admitted("peer", gpus_per_worker=8, preemptible=True))
    run_job(placement, preemption, admitted("same", gpus_per_worker=8))
    assert decide(pending("same"), preemption, now=T0) == []


def quota_plan(job: str, victims: str, constraint: str = "reclaim") -> Envelope:
    reason = PendingReason(
        code="quota",
        constraint=constraint,
        message=f"team-a is owed quota lent to the cohort; stopping {victims}",
        details={"victims": victims},
    )
    return env(JobPending(job_id=JobId(job), reasons=(reason,)))


def test_victims_named_by_quota_are_asked_once_each_whatever_their_priority() -> None:
    placement, preemption = setup()
    run_job(
        placement,
        preemption,
        admitted("lender", gpus_per_worker=4, priority=9, preemptible=True, checkpoint_grace_s=30),
    )
    run_job(placement, preemption, admitted("pinned", gpus_per_worker=4, preemptible=False))
    out = decide(quota_plan("owed", "lender,pinned,ghost"), preemption, now=T0)
    [asking] = [e.data for _, e in out]
    assert isinstance(asking, JobPreempting)
    assert (asking.job_id, asking.preemptor_job_id) == ("lender", "owed")
    assert "reclaims the quota" in asking.reason
    assert asking.deadline == T0 + timedelta(seconds=30)
    # The same plan read again (a retried batch, the quota service planning again) asks nobody twice.
    assert decide(quota_plan("owed", "lender"), preemption, now=T0 + timedelta(seconds=1)) == []


def test_a_quota_plan_does_not_start_placement_s_victim_search() -> None:
    placement, preemption = setup()
    run_job(placement, preemption, admitted("low", gpus_per_worker=8, preemptible=True))
    plan = quota_plan("high", "someone-gone", constraint="priority")
    assert decide(plan, preemption, now=T0) == []
    assert preemption.pending == {} and preemption.quota_plans == {}


def held_back_grant(
    placement: PlacementState, preemption: PreemptionState, envelope: Envelope
) -> Envelope | None:
    """Run a job, folding all but its grant into preemption (quota read allocations.log first)."""
    preemption.restore(envelope)
    grant = None
    for _, out in place(envelope, placement, now=T0):
        if isinstance(out.data, AllocationGranted):
            grant = out
        else:
            preemption.restore(out)
    return grant


def test_a_victim_named_before_its_grant_was_read_is_asked_once_the_grant_is() -> None:
    placement, preemption = setup()
    grant = held_back_grant(
        placement,
        preemption,
        admitted("borrower", gpus_per_worker=4, preemptible=True, checkpoint_grace_s=30),
    )
    assert grant is not None
    preemption.restore(admitted("owed", gpus_per_worker=8))
    # Quota plans before preemption read the grant: nothing to ask yet, and not forgotten.
    assert decide(quota_plan("owed", "borrower"), preemption, now=T0) == []
    out = decide(grant, preemption, now=T0 + timedelta(seconds=1))
    [asking] = [e.data for _, e in out]
    assert isinstance(asking, JobPreempting)
    assert (asking.job_id, asking.preemptor_job_id) == ("borrower", "owed")
    assert preemption.named_early == {}
    # Asked once: the grant read again asks nobody.
    assert decide(grant, preemption, now=T0 + timedelta(seconds=2)) == []


def test_a_victim_named_early_and_released_before_its_grant_was_read_is_not_asked() -> None:
    placement, preemption = setup()
    grant = held_back_grant(placement, preemption, admitted("borrower", gpus_per_worker=4, preemptible=True))
    assert grant is not None and isinstance(grant.data, AllocationGranted)
    preemption.restore(admitted("owed", gpus_per_worker=8))
    assert decide(quota_plan("owed", "borrower"), preemption, now=T0) == []
    released = AllocationReleased(
        job_id=JobId("borrower"), allocation_id=grant.data.allocation_id, reason="completed"
    )
    preemption.fold(env(released, at=1))
    assert decide(grant, preemption, now=T0 + timedelta(seconds=2)) == []
    assert preemption.named_early == {}


def test_a_victim_released_before_the_plan_was_read_is_not_asked_when_it_runs_again() -> None:
    # Quota planned on a grant preemption had already seen released; the job was placed again since.
    placement, preemption = setup()
    grant = held_back_grant(placement, preemption, admitted("borrower", gpus_per_worker=4, preemptible=True))
    assert grant is not None and isinstance(grant.data, AllocationGranted)
    preemption.restore(admitted("owed", gpus_per_worker=8))
    preemption.fold(grant)
    first = grant.data.allocation_id
    preemption.fold(
        env(AllocationReleased(job_id=JobId("borrower"), allocation_id=first, reason="preempted"), at=1)
    )
    assert decide(quota_plan("owed", "borrower"), preemption, now=T0 + timedelta(seconds=2)) == []
    again = grant.data.model_copy(update={"allocation_id": AllocationId("borrower.2")})
    assert decide(env(again, at=5), preemption, now=T0 + timedelta(seconds=5)) == []
    assert preemption.named_early == {}
