"""One scheduling cycle per batch (placement's fold_event + end_batch) and its replay cache in the shell."""

from __future__ import annotations

from svc_helpers import T0, admitted, cluster, env

from gangline.bus import RecordMeta
from gangline.core.defaults import default_profile
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import JobPending, JobPlaced
from gangline.events.types import AllocationId, JobId
from services.common.shell import Replayed
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState, decide, end_batch, fold_event

TOPICS = TopicNames()
META = RecordMeta(topic="t", partition=0, offset=0, key=None, timestamp_ms=0, headers=())


def new_state(*groups: tuple[str, int, int], max_jobs_per_cycle: int = 256) -> PlacementState:
    state = PlacementState(
        topics=TOPICS, profile=default_profile(), gated=False, max_jobs_per_cycle=max_jobs_per_cycle
    )
    for node in cluster(*groups).registrations():
        state.restore(env(node))
    state.needs_cycle = False
    return state


def placed_on(outputs: list[Envelope]) -> dict[str, tuple[str, ...]]:
    """Job id → the nodes of its grant, for every grant among the outputs."""
    return {
        e.data.job_id: tuple(p.node for p in e.data.placements)
        for e in outputs
        if isinstance(e.data, AllocationGranted)
    }


def test_a_batch_folded_then_scheduled_once_places_what_one_cycle_per_event_places() -> None:
    events = [admitted(f"j{k}", workers=1, gpus_per_worker=4) for k in range(5)]
    per_event, batched = new_state(("a", 2, 8)), new_state(("a", 2, 8))

    one_by_one = [out for e in events for _, out in decide(e, per_event, now=T0)]
    folded = [out for e in events for _, out in fold_event(e, batched, now=T0)]
    once = [out for _, out in end_batch(batched, cause=events[-1].id, now=T0)]

    assert folded == []
    assert placed_on(once) == placed_on(one_by_one)
    assert set(placed_on(once)) == {"j0", "j1", "j2", "j3"}
    assert batched.cycle == 1 and per_event.cycle == 5
    [pending] = [e.data for e in once if isinstance(e.data, JobPending)]
    assert pending.job_id == "j4"


def test_nothing_is_decided_when_no_folded_event_could_let_a_job_run() -> None:
    state = new_state(("a", 1, 8))
    for _, out in end_batch(state, cause="c0", now=T0):
        state.fold(out)
    assert end_batch(state, cause="c1", now=T0) == []
    fold_event(admitted("big", workers=1, gpus_per_worker=16), state, now=T0)
    first = end_batch(state, cause="c2", now=T0)
    assert [e.data.job_id for _, e in first if isinstance(e.data, JobPending)] == ["big"]
    assert end_batch(state, cause="c3", now=T0) == []  # no new event since: no cycle


def test_jobs_past_the_front_of_the_line_that_fit_are_placed_in_the_same_cycle() -> None:
    state = new_state(("a", 4, 8), max_jobs_per_cycle=3)
    events = [admitted(f"j{k}", workers=1, gpus_per_worker=1) for k in range(10)]
    for e in events:
        fold_event(e, state, now=T0)
    outputs = [out for _, out in end_batch(state, cause=events[-1].id, now=T0)]
    assert sorted(placed_on(outputs)) == sorted(f"j{k}" for k in range(10))
    assert state.cycle == 1
    ids = [e.id for e in outputs]
    assert len(ids) == len(set(ids))  # later cycles' events get ids of their own


def test_a_release_in_a_batch_lets_a_waiting_gang_run_at_the_end_of_the_batch() -> None:
    state = new_state(("a", 1, 8))
    fold_event(admitted("first", workers=1, gpus_per_worker=8), state, now=T0)
    for _, out in end_batch(state, cause="c1", now=T0):
        state.fold(out)
    fold_event(admitted("second", workers=1, gpus_per_worker=8), state, now=T0)
    release = env(
        AllocationReleased(job_id=JobId("first"), allocation_id=AllocationId("first.1"), reason="completed")
    )
    fold_event(release, state, now=T0)
    outputs = [out for _, out in end_batch(state, cause=release.id, now=T0)]
    assert placed_on(outputs) == {"second": ("a-0",)}


def test_a_retried_batch_publishes_the_batch_decisions_again_and_only_once() -> None:
    state = new_state(("a", 1, 8))
    replayed = Replayed(
        lambda e, m: fold_event(e, state, now=T0),
        end_batch=lambda cause: end_batch(state, cause=cause, now=T0),
    )
    batch = [admitted("x", workers=1, gpus_per_worker=2), admitted("y", workers=1, gpus_per_worker=2)]

    first = [out for e in batch for out in replayed(e, META)] + list(replayed.flush(batch))
    # The transaction aborted: the same records come again; the state already holds the grants.
    retried = [out for e in batch for out in replayed(e, META)] + list(replayed.flush(batch))

    assert placed_on([e for _, e in first]) == placed_on([e for _, e in retried])
    assert set(placed_on([e for _, e in retried])) == {"x", "y"}
    assert [e.id for _, e in first] == [e.id for _, e in retried]
    assert all(e.causationid == batch[-1].id for _, e in first)
    assert len([e for _, e in retried if isinstance(e.data, JobPlaced)]) == 2


def test_a_replay_cache_without_end_batch_flushes_nothing() -> None:
    state = new_state(("a", 1, 8))
    replayed = Replayed(lambda e, m: decide(e, state, now=T0))
    event = admitted("x", workers=1, gpus_per_worker=2)
    assert set(placed_on([e for _, e in replayed(event, META)])) == {"x"}
    assert replayed.flush([event]) == []
