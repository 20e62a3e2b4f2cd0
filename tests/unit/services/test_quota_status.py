"""Quota's queue.status: its own fair-share figure, published when a tree's charged usage changed, only for
the queues whose figures changed, at most once per interval of event time, and the same after a restart."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from svc_helpers import T0, env

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.core.queues import QueueName, Resource
from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope
from gangline.events.jobs import JobAdmitted, JobQueued, JobSpec
from gangline.events.queues import QueueResource, QueueStatus
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.queues import QueuesFile, queues_of
from services.common.topics import TopicNames
from services.quota.handlers import QuotaState, decide
from services.quota.status import (
    SOURCE,
    StatusBoard,
    figures_now,
    figures_of,
    held_back,
    same_figures,
    status_of,
    tick,
    trees,
)
from services.quota.wiring import Quiet, tick_when_quiet

TOPICS = TopicNames(prefix="t.")
H100 = "H100-SXM5-80GB"
LAB = {
    "cohorts": [{"name": "lab"}],
    "queues": [
        # team-a lends nothing: what it uses never changes team-b's figures.
        {"name": "team-a", "cohort": "lab", "quotas": {H100: {"nominal": 8, "lending_limit": 0}}},
        {"name": "team-b", "cohort": "lab", "quotas": {H100: {"nominal": 8}}, "weight": 2},
        {"name": "solo", "quotas": {H100: {"nominal": 4}}},
        {"name": "default", "unlimited": True},
    ],
}
WALL = T0 + timedelta(days=3)
"""``now``: the wall clock, far from the event times; it only stamps envelopes."""


def quota(*, interval_s: float | None = 5.0, half_life_s: float = 0.0) -> QuotaState:
    return QuotaState(
        topics=TOPICS,
        queues=queues_of(QueuesFile.model_validate(LAB)),
        half_life_s=half_life_s,
        status=StatusBoard(interval_s=interval_s),
    )


def admit(job: str, queue: str, gpus: int, *, at: float) -> Envelope:
    spec = JobSpec(queue=queue, workers=1, gpus_per_worker=gpus)
    return env(JobAdmitted(job_id=JobId(job), spec=spec), at=at, event_id=f"admit-{job}")


def grant(job: str, queue: str, *, at: float) -> Envelope:
    event = AllocationGranted(
        job_id=JobId(job),
        allocation_id=AllocationId(f"{job}.1"),
        queue=queue,
        placements=(Placement(rank=0, node=NodeId("n0"), gpus=("g0",)),),
    )
    return env(event, at=at, event_id=f"grant-{job}")


def release(job: str, *, at: float) -> Envelope:
    event = AllocationReleased(job_id=JobId(job), allocation_id=AllocationId(f"{job}.1"), reason="completed")
    return env(event, at=at, event_id=f"release-{job}")


def feed(state: QuotaState, envelope: Envelope, *, now: datetime = WALL) -> list[tuple[str, Envelope]]:
    outputs = decide(envelope, state, now=now)
    for _, out in outputs:
        state.restore(out)  # read back from the log, as the live service reads its own job.queued
    return outputs


def statuses(outputs: list[tuple[str, Envelope]]) -> dict[str, QueueStatus]:
    found: dict[str, QueueStatus] = {}
    for topic, out in outputs:
        if isinstance(out.data, QueueStatus):
            assert topic == TOPICS.queue_status and out.subject == out.data.queue and out.source == SOURCE
            found[out.data.queue] = out.data
    return found


def reported(state: QuotaState) -> QuotaState:
    """``state`` once its first event (a tick a minute before T0) has reported every limited queue."""
    first = statuses(feed(state, tick("lab", at=T0 - timedelta(seconds=60), event_id="tick-0")))
    assert set(first) == {"team-a", "team-b", "solo"}
    return state


def test_every_limited_queue_is_reported_at_quotas_first_event_with_no_job_at_all() -> None:
    state = quota(interval_s=5.0)
    assert held_back(state) == ["lab", "solo"]  # nothing read yet: a quiet start ticks for each tree
    group = NodeGroup(name="h", count=1, gpu_model=H100, gpus_per_node=8, memory_mib=81920, leaf="leaf-a")
    nodes = env(ClusterSpec(groups=(group,)).registrations()[0], at=0)
    first = statuses(feed(state, nodes))
    assert set(first) == {"team-a", "team-b", "solo"}  # "default" is unlimited: no status
    assert first["solo"].resources == {H100: QueueResource(used=0, nominal=4, borrowed=0, lendable=0)}
    assert {(s.position, s.of, s.as_of, s.dominant_share) for q, s in first.items() if q != "solo"} == {
        (1, 2, T0, 0.0),
        (2, 2, T0, 0.0),
    }
    assert held_back(state) == []
    assert statuses(feed(state, nodes.model_copy(update={"time": T0 + timedelta(seconds=30)}))) == {}


def test_a_usage_change_publishes_every_queue_of_that_tree_with_quotas_figure() -> None:
    state = reported(quota(half_life_s=600.0))
    out = feed(state, admit("a1", "team-a", 2, at=0))
    assert [e.data.job_id for _, e in out if isinstance(e.data, JobQueued)] == ["a1"]
    published = statuses(out)
    assert set(published) == {"team-a", "team-b"}  # the lab tree; solo's usage did not move
    fair = state.fair_share((True, "lab"), T0)
    a = published["team-a"]
    assert a.dominant_share == round(fair.share(QueueName("team-a")), 6) > 0
    assert (a.dominant_resource, a.cohort, a.weight, a.as_of) == (H100, "lab", 1.0, T0)
    assert (a.position, a.of) == fair.position(QueueName("team-a")) == (2, 2)
    assert a.resources == {H100: QueueResource(used=2, nominal=8, borrowed=0, lendable=8)}
    b = published["team-b"]
    assert (b.dominant_share, b.dominant_resource, b.position, b.weight) == (0.0, None, 1, 2.0)
    assert b.resources == {H100: QueueResource(used=0, nominal=8, borrowed=0, lendable=0)}


def test_the_throttle_counts_event_time_and_a_held_back_change_goes_out_with_a_later_event() -> None:
    state = quota(interval_s=5.0)
    assert statuses(feed(state, admit("a1", "team-a", 1, at=0)))["team-a"].resources[H100].used == 1
    assert statuses(feed(state, admit("a2", "team-a", 1, at=4))) == {}  # 4 s of event time later: held
    assert statuses(feed(state, grant("a1", "team-a", at=4.5))) == {}  # nothing moved, still inside 5 s
    late = statuses(feed(state, grant("a2", "team-a", at=5)))  # changes nothing itself; the interval is up
    assert set(late) == {"team-a"}  # team-b's figures are what it was last told
    assert (late["team-a"].resources[H100].used, late["team-a"].as_of) == (2, T0 + timedelta(seconds=5))
    assert statuses(feed(state, grant("a2", "team-a", at=60))) == {}  # published: nothing is due


def test_a_change_held_back_when_the_cluster_goes_quiet_is_published_by_quotas_tick() -> None:
    state = quota(interval_s=5.0)
    assert statuses(feed(state, admit("a1", "team-a", 1, at=0)))["team-a"].resources[H100].used == 1
    assert statuses(feed(state, admit("a2", "team-a", 2, at=1))) == {}  # held: 1 s after the last one
    assert held_back(state) == ["lab"]  # and no event comes: the status says 1 while 3 are charged
    ticked = tick("lab", at=T0 + timedelta(seconds=9), event_id="tick-1")
    assert ticked.data.subject() == "lab" and ticked.source == SOURCE
    late = statuses(feed(state, ticked))
    assert (late["team-a"].resources[H100].used, late["team-a"].as_of) == (3, T0 + timedelta(seconds=9))
    assert held_back(state) == []
    assert statuses(feed(state, tick("lab", at=T0 + timedelta(seconds=30), event_id="tick-2"))) == {}


def test_a_tick_inside_the_interval_publishes_nothing_yet() -> None:
    state = quota(interval_s=5.0)
    feed(state, admit("a1", "team-a", 1, at=0))
    feed(state, admit("a2", "team-a", 2, at=1))
    assert statuses(feed(state, tick("lab", at=T0 + timedelta(seconds=3), event_id="tick-1"))) == {}
    assert held_back(state) == ["lab"]  # still due: the next quiet spell ticks again


async def test_quota_ticks_once_per_held_back_tree_after_a_quiet_interval_and_only_when_ready() -> None:
    state = quota(interval_s=5.0)  # of event time; the loop waits 0.05 s of quiet (live: the same setting)
    feed(state, admit("a1", "team-a", 1, at=0))
    feed(state, admit("s1", "solo", 1, at=0))
    feed(state, admit("a2", "team-a", 2, at=1))  # held back: lab's status says 1 of 3
    feed(state, admit("s2", "solo", 1, at=1))  # and solo's 1 of 2
    sent: list[tuple[str, Envelope]] = []
    ready = False

    async def send(topic: str, envelope: Envelope) -> None:
        sent.append((topic, envelope))

    quiet = Quiet()
    ticking = asyncio.create_task(tick_when_quiet(state, quiet, send, interval_s=0.05, ready=lambda: ready))
    try:
        await asyncio.sleep(0.3)
        assert sent == []  # not restored yet (a standby, a restore under way): nothing
        ready = True
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(sent) >= 2:
                break
        await asyncio.sleep(0.02)  # the ticks count as heard: no second pair before they are read
        assert sorted(e.data.subject() for _, e in sent) == ["lab", "solo"]
        assert {t for t, _ in sent} == {TOPICS.quota_ticks}
        for _, envelope in sent:
            feed(state, envelope)  # read back (its time, the clock's, is far past the interval)
        assert held_back(state) == []
        quiet.heard_at -= 1.0
        await asyncio.sleep(0.2)
        assert len(sent) == 2
    finally:
        ticking.cancel()


def test_a_change_and_its_undoing_inside_the_interval_is_no_news() -> None:
    state = quota(interval_s=5.0)
    feed(state, admit("a1", "team-a", 1, at=0))
    feed(state, admit("a2", "team-a", 3, at=1))
    feed(state, release("a2", at=2))  # back to what was published
    assert statuses(feed(state, grant("a1", "team-a", at=30))) == {}


def test_only_the_tree_whose_usage_moved_is_published() -> None:
    state = quota(interval_s=0.0)
    feed(state, admit("a1", "team-a", 1, at=0))
    assert set(statuses(feed(state, admit("s1", "solo", 2, at=1)))) == {"solo"}
    assert set(statuses(feed(state, admit("a2", "team-a", 1, at=2)))) == {"team-a"}


def test_a_queue_of_an_unlimited_queue_has_no_status_and_a_bare_state_publishes_nothing() -> None:
    state = reported(quota(interval_s=0.0))
    assert statuses(feed(state, admit("d1", "default", 8, at=0))) == {}
    bare = quota(interval_s=None)
    assert statuses(feed(bare, admit("a1", "team-a", 1, at=0))) == {}


def test_borrowing_shows_in_the_borrowers_status_and_in_what_its_cohort_can_lend() -> None:
    state = quota(interval_s=0.0)
    feed(state, admit("a1", "team-a", 8, at=0))
    published = statuses(feed(state, admit("a2", "team-a", 2, at=1)))  # 2 of team-b's idle 8
    assert published["team-a"].resources[H100] == QueueResource(used=10, nominal=8, borrowed=2, lendable=6)
    assert "team-b" not in published  # team-a lends nothing, so team-b's figures did not move


STORY: list[Any] = [
    ("admit", "a1", "team-a", 2, 0.0),
    ("admit", "b1", "team-b", 4, 1.0),
    ("grant", "a1", "team-a", 0, 2.0),
    ("admit", "a2", "team-a", 8, 3.0),  # borrows 2 of team-b's
    ("admit", "a3", "team-a", 8, 3.5),  # does not fit: pending
    ("admit", "s1", "solo", 4, 4.0),
    ("grant", "b1", "team-b", 0, 6.0),
    ("release", "a2", "", 0, 7.0),  # lets a3 through
    ("admit", "b2", "team-b", 2, 9.0),
    ("release", "b1", "", 0, 12.0),
    ("grant", "s1", "solo", 0, 13.0),
    ("release", "s1", "", 0, 19.0),
    ("grant", "b2", "team-b", 0, 26.0),
]


def story() -> list[Envelope]:
    out = []
    for kind, job, queue, gpus, at in STORY:
        if kind == "admit":
            out.append(admit(job, queue, gpus, at=at))
        elif kind == "grant":
            out.append(grant(job, queue, at=at))
        else:
            out.append(release(job, at=at))
    return out


def test_a_restart_at_any_point_neither_repeats_nor_skips_a_status() -> None:
    # Decided at the events' own times: a restore folds quota's job.queued at its envelope's time.
    events = story()
    live = quota(interval_s=5.0, half_life_s=30.0)
    decided = [feed(live, e, now=e.time) for e in events]
    assert sum(len(statuses(d)) for d in decided) >= 6
    for cut in range(1, len(events)):
        restarted = quota(interval_s=5.0, half_life_s=30.0)
        for e, outputs in zip(events[:cut], decided[:cut], strict=True):
            restarted.restore(e)
            for _, out in outputs:
                restarted.restore(out)
        for e, expected in zip(events[cut:], decided[cut:], strict=True):
            assert feed(restarted, e, now=e.time) == expected, f"restarted after event {cut}, at {e.id}"


def test_only_quotas_own_statuses_are_restored() -> None:
    board = StatusBoard(interval_s=5.0)
    status = QueueStatus(
        queue=QueueName("team-a"),
        cohort="lab",
        weight=1.0,
        dominant_share=0.5,
        position=1,
        of=2,
        resources={Resource(H100): QueueResource(used=1, nominal=8, borrowed=0, lendable=0)},
        as_of=T0,
    )
    forged = env(status, at=0)  # source "test"
    assert board.restore(forged) and board.published == {}
    ours = forged.model_copy(update={"source": SOURCE})
    older = ours.model_copy(update={"data": status.model_copy(update={"as_of": T0 - timedelta(seconds=9)})})
    assert board.restore(ours) and board.restore(older)
    assert board.published == {"team-a": status} and board.published_at == {"lab": T0}
    assert not board.due("lab", T0 + timedelta(seconds=4.9)) and board.due("lab", T0 + timedelta(seconds=5))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "grant", "release"]),
            st.integers(0, 7),
            st.sampled_from(["team-a", "team-b", "solo"]),
            st.integers(1, 12),
            st.floats(0.0, 9.0),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([0.0, 30.0]),
)
def test_the_figures_read_without_building_a_status_are_those_of_the_status_built_and_of_the_last_sent(
    ops: list[tuple[str, int, str, int, float]], half_life_s: float
) -> None:
    # Quota compares what a status would say (figures_now) with what the last one said (the board's
    # figures, worked out once per status) before it builds one: both must be what a fresh read of
    # the built status gives, whatever happened.
    state = quota(half_life_s=half_life_s)
    clock = 0.0
    for kind, k, queue, gpus, step in ops:
        clock += step
        job = f"j{k}"
        if kind == "admit":
            feed(state, admit(job, queue, gpus, at=clock))
        elif kind == "grant":
            feed(state, grant(job, queue, at=clock))
        else:
            feed(state, release(job, at=clock))
        at = T0 + timedelta(seconds=clock)
        for cohort, queues in trees(state).items():
            fair = state.fair_share((True, cohort), at)
            for q in queues:
                built = status_of(state, fair, q, cohort, at)
                assert figures_now(state, fair, q, cohort) == figures_of(built)
                last = state.status.published.get(QueueName(q))
                assert state.status.figures(QueueName(q)) == (figures_of(last) if last else None)
                if last is not None:  # equal figures: the same status, as_of aside
                    assert (figures_of(last) == figures_of(built)) == same_figures(last, built)
                    said = {r: v.used for r, v in last.resources.items() if v.used}
                    assert state.status.used(QueueName(q)) == said
                assert dict(state.charged().get(QueueName(q), {})) == state.ledger.usage_vector(QueueName(q))
