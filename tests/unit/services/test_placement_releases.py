"""Placement releases the allocation of a job that ended: the agents only report the end (DESIGN §3:
allocations.log is written by placement, preemption and node_health). Once per allocation, whatever
is re-delivered, raced or restored."""

from __future__ import annotations

from svc_helpers import T0, admitted, cluster, env
from test_placement import TOPICS, feed, grants, new_state

from gangline.core.defaults import default_profile
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.ids import derived_id
from gangline.events.jobs import (
    JobCancelRequested,
    JobCompleted,
    JobFailed,
    JobRequeued,
)
from gangline.events.nodes import NodeHeartbeat
from gangline.events.types import AllocationId, JobId, NodeId, Seconds
from services.placement.handlers import PlacementState, decide, end_batch, fold_event


def releases(outputs: list[Envelope]) -> list[AllocationReleased]:
    return [e.data for e in outputs if isinstance(e.data, AllocationReleased)]


def completed(job: str, allocation_id: str, gpu_seconds: int | None = None) -> Envelope:
    gs = Seconds(gpu_seconds) if gpu_seconds is not None else None
    return env(JobCompleted(job_id=JobId(job), allocation_id=AllocationId(allocation_id), gpu_seconds=gs))


def running(state: PlacementState, job: str, gpus: int = 8) -> tuple[Envelope, AllocationGranted]:
    """Admit ``job`` and let it be placed; its admission and its grant."""
    admission = admitted(job, gpus_per_worker=gpus)
    [grant] = grants(feed(state, admission))
    return admission, grant


def test_a_completion_releases_the_allocation_once_and_its_gpus_go_to_the_next_job() -> None:
    state = new_state(("a", 1, 8))
    _, grant = running(state, "j1")
    assert grants(feed(state, admitted("j2", gpus_per_worker=8))) == []  # waits for j1's GPUs

    out = feed(state, completed("j1", grant.allocation_id, gpu_seconds=4_000))

    [released] = releases(out)
    assert (released.job_id, released.allocation_id, released.reason, released.gpu_seconds) == (
        "j1",
        grant.allocation_id,
        "completed",
        4_000,
    )
    [envelope] = [e for e in out if isinstance(e.data, AllocationReleased)]
    assert envelope.id == derived_id(grant.allocation_id, "released-ended", "j1")
    assert envelope.source == "gangline/placement"
    # Released before the batch's cycle, which places the waiting job on the freed GPUs.
    assert out.index(envelope) < next(i for i, e in enumerate(out) if isinstance(e.data, AllocationGranted))
    assert [g.job_id for g in grants(out)] == ["j2"]
    assert "j1" in state.retired and "j1" not in state.jobs


def test_a_failure_releases_with_reason_failed_and_its_gpu_seconds() -> None:
    state = new_state(("a", 1, 8))
    _, grant = running(state, "j1")
    failed = JobFailed(
        job_id=JobId("j1"),
        allocation_id=grant.allocation_id,
        code="restarts_exhausted",
        reason="rank 0 exited 3 twice",
        gpu_seconds=Seconds(96),
    )
    [released] = releases(feed(state, env(failed)))
    assert (released.reason, released.gpu_seconds) == ("failed", 96)


def test_a_redelivered_completion_releases_nothing_more() -> None:
    state = new_state(("a", 1, 8))
    _, grant = running(state, "j1")
    completion = completed("j1", grant.allocation_id)
    assert len(releases(feed(state, completion))) == 1

    assert feed(state, completion) == []
    # The same end told again under another id (an agent re-run) is no news either.
    assert feed(state, completed("j1", grant.allocation_id)) == []


def test_a_completion_of_an_allocation_already_released_releases_nothing() -> None:
    for reason in ("preempted", "node_failed"):
        state = new_state(("a", 1, 8))
        _, grant = running(state, "j1")
        other = AllocationReleased(job_id=JobId("j1"), allocation_id=grant.allocation_id, reason=reason)
        feed(state, env(other))

        assert releases(feed(state, completed("j1", grant.allocation_id))) == [], reason
        assert state.to_release == set()


def test_a_release_read_in_the_same_batch_as_the_completion_wins() -> None:
    # Preemption (or node_health) released it while the job was ending: the batch sees both, releases none.
    state = new_state(("a", 1, 8))
    _, grant = running(state, "j1")
    preempted = AllocationReleased(job_id=JobId("j1"), allocation_id=grant.allocation_id, reason="preempted")
    out = fold_event(completed("j1", grant.allocation_id), state, now=T0)
    out += fold_event(env(preempted), state, now=T0)
    out += end_batch(state, cause="batch", now=T0)
    assert releases([e for _, e in out]) == []


def test_the_end_of_an_earlier_allocation_does_not_release_the_current_one() -> None:
    state = new_state(("a", 2, 8))
    _, first = running(state, "j1")
    feed(
        state,
        env(AllocationReleased(job_id=JobId("j1"), allocation_id=first.allocation_id, reason="preempted")),
    )
    [second] = grants(feed(state, env(JobRequeued(job_id=JobId("j1"), reason="preempted", attempt=2))))

    assert releases(feed(state, completed("j1", first.allocation_id))) == []
    assert state.jobs[JobId("j1")].live() == second
    [released] = releases(feed(state, completed("j1", second.allocation_id)))
    assert released.allocation_id == second.allocation_id


def test_a_cancelled_job_reported_failed_is_not_released_twice() -> None:
    state = new_state(("a", 1, 8))
    _, grant = running(state, "j1")
    out = feed(state, env(JobCancelRequested(job_id=JobId("j1"), reason="not needed")))
    assert [r.reason for r in releases(out)] == ["cancelled"]
    late = JobFailed(
        job_id=JobId("j1"), allocation_id=grant.allocation_id, code="worker_exit", reason="killed"
    )
    assert releases(feed(state, env(late))) == []


def heartbeat() -> Envelope:
    return env(NodeHeartbeat(node=NodeId("a-0"), seq=1, gpus=()))


def restored(log: list[Envelope]) -> PlacementState:
    """A fresh placement restored from ``log`` (read topic by topic, as the shell does)."""
    state = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    for envelope in log:
        state.restore(envelope)
    return state


def test_restore_releases_a_job_that_ended_while_placement_was_down() -> None:
    live = new_state(("a", 1, 8))
    admission, grant = running(live, "j1")
    ended = completed("j1", grant.allocation_id, gpu_seconds=10)
    waiting = admitted("j2", gpus_per_worker=8)
    nodes = [env(n) for n in cluster(("a", 1, 8)).registrations()]
    # The log as a restart reads it: nodes, then jobs.events (the end before its grant), then allocations.log.
    state = restored([*nodes, admission, ended, waiting, env(grant)])
    assert state.jobs[JobId("j1")].live() == grant

    out = [e for _, e in decide(heartbeat(), state, now=T0)]  # the first batch after the restore

    [released] = releases(out)
    assert (released.allocation_id, released.reason, released.gpu_seconds) == (
        grant.allocation_id,
        "completed",
        10,
    )
    envelope = next(e for e in out if isinstance(e.data, AllocationReleased))
    # The id a live placement would have given it: read back, it is the same decision.
    assert envelope.id == derived_id(grant.allocation_id, "released-ended", "j1")
    assert [g.job_id for g in grants(out)] == ["j2"]
    assert feed(state, heartbeat()) == []


def test_restore_keeps_an_ended_job_whose_grant_comes_after_an_earlier_release() -> None:
    # Attempt 1 was preempted; attempt 2 ended while placement was down. Read jobs.events first: the
    # job looks finished and fully released until attempt 2's grant is read, and must not be retired.
    first = AllocationId("j1.1")
    second = AllocationId("j1.2")
    live = new_state(("a", 1, 8))
    admission, grant1 = running(live, "j1")
    assert grant1.allocation_id == first
    preempted = env(AllocationReleased(job_id=JobId("j1"), allocation_id=first, reason="preempted"))
    feed(live, preempted)
    requeued = env(JobRequeued(job_id=JobId("j1"), reason="preempted", attempt=2))
    [grant2] = grants(feed(live, requeued))
    assert grant2.allocation_id == second
    nodes = [env(n) for n in cluster(("a", 1, 8)).registrations()]

    state = restored(
        [*nodes, admission, requeued, completed("j1", second), env(grant1), preempted, env(grant2)]
    )
    [released] = releases([e for _, e in decide(heartbeat(), state, now=T0)])
    assert (released.allocation_id, released.reason) == (second, "completed")
    assert state.retired == {"j1": (first, second)}


def test_a_restored_release_already_written_is_not_written_again() -> None:
    live = new_state(("a", 1, 8))
    admission, grant = running(live, "j1")
    ended = completed("j1", grant.allocation_id)
    written = [e for _, e in decide(ended, live, now=T0) if isinstance(e.data, AllocationReleased)]
    assert len(written) == 1
    nodes = [env(n) for n in cluster(("a", 1, 8)).registrations()]

    state = restored([*nodes, admission, ended, env(grant), *written])

    assert releases([e for _, e in decide(heartbeat(), state, now=T0)]) == []
    assert "j1" in state.retired
