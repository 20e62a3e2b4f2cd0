from __future__ import annotations

from datetime import timedelta

from svc_helpers import T0, admitted, cluster, env

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.profile import Profile, load_profile
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import (
    JobCancelRequested,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempting,
    JobQueued,
    JobRequeued,
)
from gangline.events.nodes import GpuHealthChanged, NodeFailed
from gangline.events.types import AllocationId, JobId, QueueName
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState, decide

TOPICS = TopicNames()
ALLOCATE_ONLY = "name: allocate-only\nactions: [allocate]\nplugins: [health, gpu-fit, gang]\n"


def new_state(
    *groups: tuple[str, int, int] | tuple[str, int, int, str],
    gated: bool = False,
    profile: Profile | None = None,
) -> PlacementState:
    state = PlacementState(topics=TOPICS, profile=profile or default_profile(), gated=gated)
    for node in cluster(*groups).registrations():
        state.restore(env(node))
    state.needs_cycle = False
    return state


def feed(state: PlacementState, envelope: Envelope) -> list[Envelope]:
    outputs = decide(envelope, state, now=T0)
    # Our own outputs come back from the log; folding them again must change nothing.
    for _, out in outputs:
        state.fold(out)
    return [e for _, e in outputs]


def grants(outputs: list[Envelope]) -> list[AllocationGranted]:
    return [e.data for e in outputs if isinstance(e.data, AllocationGranted)]


def test_a_gang_gets_one_grant_with_a_placement_per_rank_and_a_job_placed() -> None:
    state = new_state(("a", 2, 8))
    out = feed(state, admitted("g", workers=2, gpus_per_worker=8))
    [grant] = grants(out)
    assert [p.rank for p in grant.placements] == [0, 1]
    assert {p.node for p in grant.placements} == {"a-0", "a-1"}
    assert all(len(p.gpus) == 8 for p in grant.placements)
    [placed] = [e.data for e in out if isinstance(e.data, JobPlaced)]
    assert placed.allocation_id == grant.allocation_id == "g.1"
    assert all(e.causationid is None for e in out)  # the processor stamps causation, not the handler


def test_no_gpu_is_granted_twice_and_a_gang_that_cannot_fit_waits_with_reasons() -> None:
    state = new_state(("a", 1, 8))
    first = grants(feed(state, admitted("j1", gpus_per_worker=6)))
    out = feed(state, admitted("j2", gpus_per_worker=4))
    assert grants(out) == []
    [pending] = [e.data for e in out if isinstance(e.data, JobPending)]
    assert pending.job_id == "j2" and pending.reasons
    # The same reason is not repeated on the next cycle.
    assert [e for e in feed(state, admitted("j3", gpus_per_worker=2)) if isinstance(e.data, JobPending)] == []
    held = {g for p in first[0].placements for g in p.gpus}
    release = AllocationReleased(job_id=JobId("j1"), allocation_id=first[0].allocation_id, reason="completed")
    after = grants(feed(state, env(release)))
    assert [g.job_id for g in after] == ["j2"]
    assert held & {g for p in after[0].placements for g in p.gpus}


def test_gated_jobs_wait_for_job_queued() -> None:
    state = new_state(("a", 1, 8), gated=True)
    assert feed(state, admitted("j1")) == []
    out = feed(state, env(JobQueued(job_id=JobId("j1"), queue=QueueName("default"))))
    assert [g.job_id for g in grants(out)] == ["j1"]


def test_jobs_of_unlimited_queues_do_not_wait_for_quota() -> None:
    state = new_state(("a", 1, 8), gated=True)
    state.unlimited_queues = frozenset({"default"})
    assert [g.job_id for g in grants(feed(state, admitted("open", gpus_per_worker=2)))] == ["open"]
    assert feed(state, admitted("held", queue="team", gpus_per_worker=2)) == []
    out = feed(state, env(JobQueued(job_id=JobId("held"), queue=QueueName("team"))))
    assert [g.job_id for g in grants(out)] == ["held"]


def test_a_gated_job_goes_only_on_the_gpu_model_quota_charged_it_to() -> None:
    state = PlacementState(topics=TOPICS, profile=default_profile(), gated=True)
    two_models = ClusterSpec(
        name="unit",
        groups=(
            NodeGroup(
                name="h", count=1, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="l0"
            ),
            NodeGroup(
                name="a", count=1, gpu_model="A100-SXM4-80GB", gpus_per_node=8, memory_mib=81920, leaf="l1"
            ),
        ),
    )
    for node in two_models.registrations():
        state.restore(env(node))
    feed(state, admitted("any-model", gpus_per_worker=4))
    queued = JobQueued(job_id=JobId("any-model"), queue=QueueName("default"), gpu_type="H100-SXM5-80GB")
    [grant] = grants(feed(state, env(queued)))
    assert {p.node for p in grant.placements} == {"h-0"}
    # A job with no flavour goes wherever it fits: only the A100 node has 8 free GPUs left.
    feed(state, admitted("free", gpus_per_worker=8))
    [other] = grants(feed(state, env(JobQueued(job_id=JobId("free"), queue=QueueName("default")))))
    assert {p.node for p in other.placements} == {"a-0"}


def test_failed_nodes_are_cordoned_and_a_requeued_gang_gets_its_next_allocation_elsewhere() -> None:
    state = new_state(("a", 3, 8))
    [grant] = grants(feed(state, admitted("g", workers=2, gpus_per_worker=8)))
    dead = grant.placements[0].node
    feed(state, env(NodeFailed(node=dead, code="heartbeat_timeout", reason="silent"), at=5))
    release = AllocationReleased(job_id=JobId("g"), allocation_id=grant.allocation_id, reason="node_failed")
    assert grants(feed(state, env(release))) == []  # not until it is requeued
    out = feed(state, env(JobRequeued(job_id=JobId("g"), reason="node_failed", attempt=2)))
    [again] = grants(out)
    assert again.allocation_id == "g.2"
    assert dead not in {p.node for p in again.placements}


def test_restore_rebuilds_holdings_whatever_the_order_between_topics() -> None:
    state = new_state(("a", 1, 8))
    [grant] = grants(feed(state, admitted("j1", gpus_per_worker=8)))
    restarted = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    # allocations.log read before jobs.events, nodes last: the result is the same cluster.
    restarted.restore(env(grant))
    restarted.restore(admitted("j1", gpus_per_worker=8))
    for node in cluster(("a", 1, 8)).registrations():
        restarted.restore(env(node))
    assert restarted.waiting == {}
    out = feed(restarted, admitted("j2", gpus_per_worker=1))
    assert grants(out) == [] and restarted.needs_cycle is False


def test_lower_priorities_wait_while_gpus_are_freed_for_a_preemptor() -> None:
    state = new_state(("a", 1, 8))
    [low] = grants(feed(state, admitted("low", gpus_per_worker=8, preemptible=True)))
    feed(state, admitted("urgent", gpus_per_worker=8, priority=10))
    asking = JobPreempting(
        job_id=JobId("low"),
        allocation_id=AllocationId(low.allocation_id),
        deadline=T0 + timedelta(seconds=30),
        reason="urgent needs it",
        preemptor_job_id=JobId("urgent"),
    )
    feed(state, env(asking))
    feed(state, env(JobRequeued(job_id=JobId("low"), reason="preempted", attempt=2)))
    release = AllocationReleased(job_id=JobId("low"), allocation_id=low.allocation_id, reason="preempted")
    out = feed(state, env(release))
    # Both wait now; the urgent job is placed on the freed GPUs, the victim waits for capacity.
    assert [g.job_id for g in grants(out)] == ["urgent"]
    [held] = [e.data for e in out if isinstance(e.data, JobPending)]
    assert held.job_id == "low" and held.reasons[0].code == "capacity"


def test_gpus_freed_for_a_preemptor_are_held_for_it_while_its_other_victims_still_run() -> None:
    # Allocate only: no reservation holds anything, the preemption's own hold is what is tested.
    state = new_state(("a", 2, 8), profile=load_profile(ALLOCATE_ONLY, placement_registry()))
    lows = [grants(feed(state, admitted(f"low-{k}", gpus_per_worker=8, preemptible=True)))[0] for k in (0, 1)]
    feed(state, admitted("urgent", workers=2, gpus_per_worker=8, priority=10))
    for low in lows:
        asking = JobPreempting(
            job_id=low.job_id,
            allocation_id=low.allocation_id,
            deadline=T0 + timedelta(seconds=30),
            reason="urgent needs it",
            preemptor_job_id=JobId("urgent"),
        )
        feed(state, env(asking))
    first = AllocationReleased(job_id=lows[0].job_id, allocation_id=lows[0].allocation_id, reason="preempted")
    feed(state, env(first))
    # A newcomer that would take the first victim's GPUs waits: they are kept for the preemptor.
    out = feed(state, admitted("newcomer", gpus_per_worker=8))
    assert grants(out) == []
    [why] = [e.data for e in out if isinstance(e.data, JobPending) and e.data.job_id == "newcomer"]
    assert why.reasons[0].code == "capacity"
    second = AllocationReleased(
        job_id=lows[1].job_id, allocation_id=lows[1].allocation_id, reason="preempted"
    )
    assert [g.job_id for g in grants(feed(state, env(second)))] == ["urgent"]


def test_a_preemption_holds_back_no_work_that_would_not_take_the_gpus_it_frees() -> None:
    state = new_state(("a", 1, 8), ("b", 1, 8, "L40S"))
    [low] = grants(feed(state, admitted("low", gpus_per_worker=8, preemptible=True)))
    feed(state, admitted("urgent", gpus_per_worker=8, priority=10, gpu_type="H100-SXM5-80GB"))
    asking = JobPreempting(
        job_id=JobId("low"),
        allocation_id=AllocationId(low.allocation_id),
        deadline=T0 + timedelta(seconds=30),
        reason="urgent needs it",
        preemptor_job_id=JobId("urgent"),
    )
    feed(state, env(asking))
    # While low checkpoints, a lower-priority job for the other GPU model is placed at once.
    out = feed(state, admitted("other-model", gpus_per_worker=4, gpu_type="L40S"))
    assert [g.job_id for g in grants(out)] == ["other-model"]


def test_cancelling_frees_a_running_gang_and_drops_a_waiting_job() -> None:
    state = new_state(("a", 1, 8))
    [running] = grants(feed(state, admitted("run", gpus_per_worker=8)))
    assert grants(feed(state, admitted("wait", gpus_per_worker=8))) == []
    out = feed(state, env(JobCancelRequested(job_id=JobId("wait"), reason="not needed")))
    [failed] = [e.data for e in out if isinstance(e.data, JobFailed)]
    assert (failed.job_id, failed.code, failed.reason) == ("wait", "cancelled", "not needed")
    assert "wait" not in state.waiting
    feed(state, admitted("next", gpus_per_worker=8))
    out = feed(state, env(JobCancelRequested(job_id=JobId("run"), requested_by="alice")))
    released = [e.data for e in out if isinstance(e.data, AllocationReleased)]
    assert [(r.allocation_id, r.reason) for r in released] == [(running.allocation_id, "cancelled")]
    assert [f.code for f in (e.data for e in out) if isinstance(f, JobFailed)] == ["cancelled_while_running"]
    # The freed GPUs go to the next job in the same transaction; a second cancel changes nothing.
    assert [g.job_id for g in grants(out)] == ["next"]
    assert feed(state, env(JobCancelRequested(job_id=JobId("run")))) == []


def _health(node: str, gpu: str, previous: str, state: str) -> Envelope:
    return env(
        GpuHealthChanged.model_validate(
            {
                "node": node,
                "gpu": gpu,
                "previous": previous,
                "state": state,
                "cause": {"kind": "xid", "message": "XID 13 three times in an hour", "xid": 13},
            }
        )
    )


def test_a_degraded_gpu_keeps_its_running_work_but_takes_no_new_work() -> None:
    state = new_state(("a", 1, 8))
    [running] = grants(feed(state, admitted("j1", gpus_per_worker=4)))
    held = {g for p in running.placements for g in p.gpus}
    free = sorted({f"gpu{i}" for i in range(8)} - held)
    assert feed(state, _health("a-0", free[0], "healthy", "degraded")) == []
    # A repeated-error report (previous == state) is not a recovery.
    assert feed(state, _health("a-0", free[0], "healthy", "healthy")) == []
    out = feed(state, admitted("j2", gpus_per_worker=4))
    assert grants(out) == []  # only 3 usable free GPUs are left
    assert [e.data.job_id for e in out if isinstance(e.data, JobPending)] == ["j2"]
    [j3] = grants(feed(state, admitted("j3", gpus_per_worker=3)))
    # A real recovery makes the GPU usable again.
    release = AllocationReleased(job_id=JobId("j3"), allocation_id=j3.allocation_id, reason="completed")
    assert grants(feed(state, env(release))) == []  # 3 usable GPUs free: still not enough for j2
    back = grants(feed(state, _health("a-0", free[0], "degraded", "healthy")))
    assert [g.job_id for g in back] == ["j2"]


def test_a_pools_placement_places_a_job_it_learns_from_its_routing() -> None:
    """A pool's placement reads no job.admitted (it may be on another pool's partition): the job.routed on
    its partition carries the spec and the admitted time."""
    from gangline.events.jobs import JobRouted, JobSpec

    state = new_state(("a", 1, 8), gated=True)
    spec = JobSpec(queue="team-a", workers=1, gpus_per_worker=4)
    assert (
        feed(state, env(JobRouted(job_id=JobId("r1"), pool="spine-a", spec=spec, admitted_at=T0), at=5.0))
        == []
    )
    assert state.jobs[JobId("r1")].admitted_at == T0
    [grant] = grants(feed(state, env(JobQueued(job_id=JobId("r1"), queue="team-a", pool="spine-a"), at=6.0)))
    assert grant.job_id == "r1"
