from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import T0, admitted, cluster, env

from gangline.bus import Outgoing
from gangline.core.actions.queueing import PreemptionPolicy
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.profile import Profile, load_profile_file
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, make_envelope
from gangline.events.jobs import (
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobPending,
    JobPreempted,
    JobPreempting,
    JobQueued,
    JobRequeued,
    JobSpec,
    PendingReason,
)
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.queues import QueuesFile, queues_of
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState
from services.placement.handlers import decide as place
from services.preemption.handlers import Mirror, PreemptionState, decide, end_batch, fold_event

TOPICS = TopicNames()
H100 = "H100-SXM5-80GB"


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


LAB = {
    "cohorts": [{"name": "lab"}],
    "queues": [
        {"name": "team-a", "cohort": "lab", "quotas": {H100: {"nominal": 8, "borrowing_limit": 0}}},
        {"name": "team-b", "cohort": "lab", "quotas": {H100: {"nominal": 8}}},
    ],
}
ONE_TEAM = {"queues": [{"name": "team-a", "quotas": {H100: {"nominal": 16}}}]}


def with_queues(
    doc: dict[str, Any], *, nodes: int = 2, min_runtime_s: float = 0.0, profile: Profile | None = None
) -> Setup:
    """Placement and preemption over ``nodes`` x 8 H100, preemption with the queues of ``doc``."""
    queues = queues_of(QueuesFile.model_validate(doc))
    placement = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    preemption = PreemptionState(
        mirror=Mirror(topics=TOPICS, profile=profile or default_profile(), gated=False),
        tree=queues.whole_tree,
        policy=PreemptionPolicy(min_runtime_s=min_runtime_s, default_grace_s=0.0),
    )
    for node in cluster(("a", nodes, 8)).registrations():
        placement.restore(env(node))
        preemption.restore(env(node))
    return placement, preemption


Setup = tuple[PlacementState, PreemptionState]


def start(setup: Setup, job: str, *, at: float, **spec: Any) -> AllocationGranted:
    placement, preemption = setup
    fields: dict[str, Any] = {"queue": "team-a", "workers": 1, "gpus_per_worker": 1, **spec}
    admission = env(JobAdmitted(job_id=JobId(job), spec=JobSpec.model_validate(fields)), at=at)
    preemption.restore(admission)
    for _, out in place(admission, placement, now=T0 + timedelta(seconds=at)):
        if isinstance(out.data, AllocationGranted):
            granted = make_envelope(out.data, event_id=out.id, source=out.source, time=out.time)
            preemption.restore(granted)
            return out.data
    raise AssertionError(f"{job} was not placed")


def admit_only(setup: Setup, job: str, *, at: float, **spec: Any) -> None:
    """A job quota holds: admitted (preemption reads it), never placed."""
    fields: dict[str, Any] = {"queue": "team-a", "workers": 1, "gpus_per_worker": 1, **spec}
    setup[1].restore(env(JobAdmitted(job_id=JobId(job), spec=JobSpec.model_validate(fields)), at=at))


def held(job: str, *, at: float, constraint: str = "quota") -> Envelope:
    """Quota's job.pending: the job waits for quota on H100 (no victims named: preemption chooses)."""
    reason = PendingReason(
        code="quota",
        constraint=constraint,
        message="team-a uses 8 of its 8 H100; cohort has 0 to lend; needs 8",
        details={"queue": "team-a", "gpu_type": H100},
    )
    return env(JobPending(job_id=JobId(job), reasons=(reason,)), at=at)


def asked(out: list[Outgoing]) -> dict[str, JobPreempting]:
    return {e.data.job_id: e.data for _, e in out if isinstance(e.data, JobPreempting)}


FAIR = Path(__file__).resolve().parents[3] / "deploy" / "profiles" / "fair.yaml"


@pytest.mark.parametrize("profile", ["default", "fair"])
def test_a_job_quota_holds_reclaims_from_the_borrower_losing_the_least_and_asks_once(profile: str) -> None:
    setup = with_queues(
        LAB, profile=load_profile_file(FAIR, placement_registry()) if profile == "fair" else None
    )
    preemption = setup[1]
    start(setup, "b-1", at=0, queue="team-b", gpus_per_worker=8, preemptible=True, priority=9)
    start(setup, "b-2", at=10, queue="team-b", gpus_per_worker=8, preemptible=True, checkpoint_grace_s=30)
    admit_only(setup, "a-1", at=50, gpus_per_worker=8)
    out = decide(held("a-1", at=60, constraint="reclaim"), preemption, now=T0 + timedelta(seconds=60))
    # b-2 started later: it loses 50 s x 8 GPUs, b-1 would lose 60 s x 8 (its priority does not shield it).
    [asking] = asked(out).values()
    assert (asking.job_id, asking.preemptor_job_id) == ("b-2", "a-1")
    assert "reclaims the quota" in asking.reason and "borrows 8" in asking.reason
    assert asking.deadline == T0 + timedelta(seconds=90)
    # The hold read again (a retried batch) asks nobody twice, and nobody more for the same waiter.
    assert decide(held("a-1", at=61), preemption, now=T0 + timedelta(seconds=61)) == []


def test_reclaim_never_takes_the_lender_s_borrower_below_its_nominal_quota() -> None:
    # team-b uses 12 of its 8 (borrowing 4 of team-a's): b-big (8 GPUs, 10 s old) would lose the least,
    # but taking it leaves team-b 4 of its 8. b-small (4 GPUs, 60 s) is what team-b borrows.
    setup = with_queues(LAB)
    preemption = setup[1]
    small = start(setup, "b-small", at=0, queue="team-b", gpus_per_worker=4, preemptible=True)
    big = start(setup, "b-big", at=50, queue="team-b", gpus_per_worker=8, preemptible=True)
    assert small.placements[0].node != big.placements[0].node
    admit_only(setup, "a-1", at=55, gpus_per_worker=8)
    out = decide(held("a-1", at=60, constraint="reclaim"), preemption, now=T0 + timedelta(seconds=60))
    assert set(asked(out)) == {"b-small"}


def test_nothing_is_reclaimed_for_a_job_its_queue_is_not_owed() -> None:
    setup = with_queues(LAB)
    preemption = setup[1]
    start(setup, "b-1", at=0, queue="team-b", gpus_per_worker=8, preemptible=True)  # team-b's own 8
    start(setup, "a-0", at=1, queue="team-a", gpus_per_worker=4, preemptible=True)
    admit_only(setup, "a-1", at=50, gpus_per_worker=8)
    # team-a is not owed 8 more (4 + 8 > 8), team-b borrows nothing, a-0 has the same priority: no victim.
    assert decide(held("a-1", at=60), preemption, now=T0 + timedelta(seconds=60)) == []


def test_the_core_frees_one_node_where_quota_s_old_rule_named_victims_on_two() -> None:
    # team-a holds its 16 of 16 in four 4-GPU jobs, two per node, all priority 0. quota's old rule
    # (lowest priority, then most recently granted) named n0-late and n1-late: 8 GPUs by count, but
    # on two nodes, so the waiting 1 x 8 job still did not fit anywhere. The core's victim search
    # frees one whole node, the one losing the fewest GPU-hours.
    setup = with_queues(ONE_TEAM)
    preemption = setup[1]
    spec: dict[str, Any] = {"gpus_per_worker": 4, "preemptible": True}
    nodes = {}
    for job, at in (("n0-early", 20), ("n0-late", 40), ("n1-early", 10), ("n1-late", 30)):
        granted = start(setup, job, at=at, **spec)
        nodes[job] = granted.placements[0].node
    assert nodes["n0-early"] == nodes["n0-late"] != nodes["n1-early"] == nodes["n1-late"]
    admit_only(setup, "urgent", at=90, gpus_per_worker=8, priority=5)
    out = decide(held("urgent", at=100), preemption, now=T0 + timedelta(seconds=100))
    # node n0 loses (60 + 80) s x 4 GPUs, node n1 (70 + 90) s x 4.
    assert set(asked(out)) == {"n0-early", "n0-late"}
    assert all("needs the GPUs" in a.reason for a in asked(out).values())


def test_a_job_younger_than_the_minimum_runtime_is_not_a_victim_until_it_is_old_enough() -> None:
    setup = with_queues(ONE_TEAM, nodes=1, min_runtime_s=120)
    preemption = setup[1]
    start(setup, "young", at=0, gpus_per_worker=8, preemptible=True)
    admit_only(setup, "urgent", at=5, gpus_per_worker=8, priority=5)
    assert decide(held("urgent", at=60), preemption, now=T0 + timedelta(seconds=60)) == []
    # A later batch in which something changed plans the jobs quota holds again.
    node = cluster(("a", 1, 8)).registrations()[0]
    out = decide(env(node, at=130), preemption, now=T0 + timedelta(seconds=130))
    assert set(asked(out)) == {"young"}


def test_a_hold_read_before_the_victims_grant_is_planned_once_the_grant_is_read() -> None:
    setup = with_queues(LAB)
    placement, preemption = setup
    start(setup, "b-1", at=0, queue="team-b", gpus_per_worker=8, preemptible=True)
    admission = admitted("b-2", queue="team-b", gpus_per_worker=8, preemptible=True)
    preemption.restore(admission)
    [grant] = [o for _, o in place(admission, placement, now=T0) if isinstance(o.data, AllocationGranted)]
    admit_only(setup, "a-1", at=50, gpus_per_worker=8)
    # Quota read b-2's grant before preemption did: team-b borrows nothing here yet.
    assert decide(held("a-1", at=60, constraint="reclaim"), preemption, now=T0 + timedelta(seconds=60)) == []
    out = decide(grant, preemption, now=T0 + timedelta(seconds=61))
    assert set(asked(out)) in ({"b-1"}, {"b-2"})
    # Queued by quota since: no longer held, never planned for again.
    preemption.fold(env(JobQueued(job_id=JobId("a-1"), queue="team-a", gpu_type=H100), at=62))
    assert JobId("a-1") not in preemption.held


def test_held_jobs_go_to_the_core_only_when_owed_or_outranking_preemptible_work_owed_ones_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.preemption import handlers

    planned: list[list[str]] = []
    cycle = handlers.run_queue_cycle

    def recording(snap: Any, jobs: Any, *args: Any, **kwargs: Any) -> Any:
        planned.append([j.id for j in jobs])
        return cycle(snap, jobs, *args, **kwargs)

    monkeypatch.setattr(handlers, "run_queue_cycle", recording)
    setup = with_queues(LAB)
    preemption = setup[1]
    start(setup, "b-1", at=0, queue="team-b", gpus_per_worker=8, preemptible=True, priority=3)
    start(setup, "b-2", at=1, queue="team-b", gpus_per_worker=8, priority=3)
    admit_only(setup, "b-peer", at=2, queue="team-b", gpus_per_worker=8, priority=3)
    # b-peer does not outrank b-1, and team-b is not owed anything: no plan at all.
    assert decide(held("b-peer", at=3), preemption, now=T0 + timedelta(seconds=3)) == []
    assert planned == []
    admit_only(setup, "b-urgent", at=4, queue="team-b", gpus_per_worker=8, priority=9)
    admit_only(setup, "a-owed", at=5, gpus_per_worker=8)
    preemption.fold(held("b-urgent", at=6))
    out = decide(held("a-owed", at=7, constraint="reclaim"), preemption, now=T0 + timedelta(seconds=7))
    assert planned == [["a-owed", "b-urgent"]]  # owed first; b-peer still left out
    # One cycle: the core's preempt runs before its reclaim, so b-urgent takes b-1 (lower priority, its
    # queue); b-2, the only other borrower, is not preemptible: nothing is left to reclaim for a-owed.
    assert {j: a.preemptor_job_id for j, a in asked(out).items()} == {"b-1": "b-urgent"}


@pytest.mark.parametrize("then", ["deadline", "checkpoint"])
def test_a_victim_that_completes_before_it_is_released_is_not_released_preempted_or_requeued(
    then: str,
) -> None:
    """Preemption racing a completion: the victim's job.completed is read before placement's release of
    it; neither the deadline passing nor a late checkpoint makes preemption release or requeue it."""
    placement, preemption = setup()
    run_job(
        placement, preemption, admitted("cheap", gpus_per_worker=8, preemptible=True, checkpoint_grace_s=5)
    )
    run_job(placement, preemption, admitted("urgent", gpus_per_worker=8, priority=5))
    [(_, asking)] = decide(pending("urgent"), preemption, now=T0)
    assert isinstance(asking.data, JobPreempting)
    completed = JobCompleted(job_id=JobId("cheap"), allocation_id=AllocationId("cheap.1"))
    assert decide(env(completed, at=1), preemption, now=T0 + timedelta(seconds=1)) == []
    if then == "deadline":
        later = pending("x")
        out = decide(later, preemption, now=T0 + timedelta(seconds=6))
    else:
        ack = JobCheckpointed(
            job_id=JobId("cheap"), allocation_id=AllocationId("cheap.1"), node=NodeId("a-0"), checkpoint="c"
        )
        out = decide(env(ack, at=2), preemption, now=T0 + timedelta(seconds=2))
    kinds = [type(e.data) for _, e in out]
    assert AllocationReleased not in kinds and JobPreempted not in kinds and JobRequeued not in kinds, kinds
    # Placement's release for the completion is the one release; the urgent job is not asked for again.
    released = AllocationReleased(
        job_id=JobId("cheap"), allocation_id=AllocationId("cheap.1"), reason="completed"
    )
    out = decide(env(released, at=3), preemption, now=T0 + timedelta(seconds=3))
    assert [e.data for _, e in out if isinstance(e.data, JobPreempting | AllocationReleased)] == []


def test_a_victim_whose_checkpoint_and_completion_come_in_one_batch_is_left_to_placement() -> None:
    """The chaos run's case: the agent checkpoints a victim and then reports it completed (it finished in
    its grace); preemption reads both in one poll. It finishes victims at the batch's end, so the end
    wins: no release as preempted (placement releases it completed), nothing after the job's end."""
    placement, preemption = setup()
    run_job(
        placement, preemption, admitted("cheap", gpus_per_worker=8, preemptible=True, checkpoint_grace_s=5)
    )
    run_job(placement, preemption, admitted("urgent", gpus_per_worker=8, priority=5))
    [(_, asking)] = decide(pending("urgent"), preemption, now=T0)
    assert isinstance(asking.data, JobPreempting)
    ack = JobCheckpointed(
        job_id=JobId("cheap"), allocation_id=AllocationId("cheap.1"), node=NodeId("a-0"), checkpoint="c"
    )
    completed = JobCompleted(job_id=JobId("cheap"), allocation_id=AllocationId("cheap.1"))
    now = T0 + timedelta(seconds=2)
    batch = [env(ack, at=1), env(completed, at=1)]
    out = [o for envelope in batch for o in fold_event(envelope, preemption, now=now)]
    out += end_batch(preemption, now=now)
    assert out == []
    # Checkpointed alone in its batch, a victim is finished at that batch's end.
    placement, preemption = setup()
    run_job(
        placement, preemption, admitted("cheap", gpus_per_worker=8, preemptible=True, checkpoint_grace_s=5)
    )
    run_job(placement, preemption, admitted("urgent", gpus_per_worker=8, priority=5))
    decide(pending("urgent"), preemption, now=T0)
    assert fold_event(env(ack, at=1), preemption, now=now) == []
    finished = end_batch(preemption, now=now)
    assert [type(e.data) for _, e in finished] == [AllocationReleased, JobPreempted, JobRequeued]
    [preempted] = [e.data for _, e in finished if isinstance(e.data, JobPreempted)]
    assert preempted.checkpointed
