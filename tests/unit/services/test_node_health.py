from __future__ import annotations

from datetime import timedelta

from svc_helpers import T0, cluster, env

from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.jobs import JobRequeued
from gangline.events.nodes import GpuHealthChanged, HealthCause, NodeFailed, NodeHeartbeat
from gangline.events.types import AllocationId, GpuId, JobId, NodeId, QueueName
from services.common.topics import TopicNames
from services.node_health.handlers import NodeHealthState, decide

TOPICS = TopicNames()


def new_state(*, outage_gap: float | None = 10) -> NodeHealthState:
    """Most of these clusters beat sparsely (pauses of up to 10 s in every node's beats): only a longer
    pause is an outage of the bus here, unless ``outage_gap`` says otherwise (None: the default)."""
    state = NodeHealthState(
        topics=TOPICS,
        silence=timedelta(seconds=10),
        check_every=timedelta(seconds=1),
        started=T0,
        outage_gap=timedelta(seconds=outage_gap) if outage_gap is not None else None,
    )
    for node in cluster(("a", 3, 8)).registrations():
        state.restore(env(node))
    return state


def grant(job: str, *nodes: str) -> AllocationGranted:
    return AllocationGranted(
        job_id=JobId(job),
        allocation_id=AllocationId(f"{job}.1"),
        queue=QueueName("default"),
        placements=tuple(
            Placement(rank=r, node=NodeId(n), gpus=(GpuId("gpu0"), GpuId("gpu1")))
            for r, n in enumerate(nodes)
        ),
    )


def beat(node: str, seq: int, at: float) -> object:
    return env(NodeHeartbeat(node=NodeId(node), seq=seq), at=at)


def test_a_silent_node_fails_and_its_gangs_are_released_and_requeued() -> None:
    state = new_state()
    state.restore(env(grant("g", "a-0", "a-1")))
    state.restore(env(grant("other", "a-2")))
    assert decide(beat("a-0", 1, 1), state, now=T0 + timedelta(seconds=1)) == []  # type: ignore[arg-type]
    decide(beat("a-1", 1, 5), state, now=T0 + timedelta(seconds=5))  # type: ignore[arg-type]
    decide(beat("a-2", 1, 5), state, now=T0 + timedelta(seconds=5))  # type: ignore[arg-type]
    # a-0 has been silent for 12 s at t=13; the others spoke at t=5 and t=13.
    out = decide(beat("a-2", 2, 13), state, now=T0 + timedelta(seconds=13))  # type: ignore[arg-type]
    kinds = [(topic, e.data) for topic, e in out]
    failed = [d for _, d in kinds if isinstance(d, NodeFailed)]
    assert [(f.node, f.code, f.last_seq) for f in failed] == [("a-0", "heartbeat_timeout", 1)]
    releases = [d for _, d in kinds if isinstance(d, AllocationReleased)]
    assert [(r.job_id, r.reason) for r in releases] == [("g", "node_failed")]
    [requeued] = [d for _, d in kinds if isinstance(d, JobRequeued)]
    assert (requeued.job_id, requeued.attempt, requeued.reason) == ("g", 2, "node_failed")
    # Declared once only.
    assert decide(env(failed[0]), state, now=T0 + timedelta(seconds=14)) == []


def test_silence_is_not_judged_while_node_health_lags_behind_the_heartbeats() -> None:
    state = new_state()
    state.restore(env(grant("g", "a-0")))
    for node in ("a-0", "a-1", "a-2"):
        decide(beat(node, 1, 1), state, now=T0 + timedelta(seconds=1))  # type: ignore[arg-type]
    # Consumed at t=30 but sent at t=20: the beats from a-0 and a-1 sent meanwhile are not read yet.
    late = decide(beat("a-2", 2, 20), state, now=T0 + timedelta(seconds=30))  # type: ignore[arg-type]
    assert late == []
    # Caught up: a-0 and a-1 spoke again, so nothing is failed.
    decide(beat("a-0", 2, 29), state, now=T0 + timedelta(seconds=30.5))  # type: ignore[arg-type]
    decide(beat("a-1", 2, 29), state, now=T0 + timedelta(seconds=30.6))  # type: ignore[arg-type]
    assert decide(beat("a-2", 3, 31), state, now=T0 + timedelta(seconds=31)) == []  # type: ignore[arg-type]
    # Caught up and a-0 really silent: it fails.
    out = decide(beat("a-1", 3, 41), state, now=T0 + timedelta(seconds=41))  # type: ignore[arg-type]
    assert [e.data.node for _, e in out if isinstance(e.data, NodeFailed)] == ["a-0"]


def test_a_failed_gpu_releases_only_the_jobs_that_use_it() -> None:
    state = new_state()
    state.restore(env(grant("uses-gpu0", "a-0")))
    other = AllocationGranted(
        job_id=JobId("elsewhere"),
        allocation_id=AllocationId("elsewhere.1"),
        queue=QueueName("default"),
        placements=(Placement(rank=0, node=NodeId("a-0"), gpus=(GpuId("gpu5"),)),),
    )
    state.restore(env(other))
    xid = GpuHealthChanged(
        node=NodeId("a-0"),
        gpu=GpuId("gpu0"),
        previous="healthy",
        state="failed",
        cause=HealthCause(kind="xid", message="XID 79", xid=79),
    )
    out = decide(env(xid), state, now=T0)
    released = [e.data.job_id for _, e in out if isinstance(e.data, AllocationReleased)]
    assert released == ["uses-gpu0"]
    [requeued] = [e.data for _, e in out if isinstance(e.data, JobRequeued)]
    assert requeued.reason == "gpu_failed"


def test_restore_counts_silence_from_the_service_start() -> None:
    state = new_state()
    state.restore(beat("a-0", 7, -3600))  # type: ignore[arg-type]
    assert decide(beat("a-1", 1, 1), state, now=T0 + timedelta(seconds=1)) == []  # type: ignore[arg-type]


def test_a_registration_read_again_neither_rewinds_heartbeats_nor_revives_a_failed_node() -> None:
    state = new_state()
    registrations = list(cluster(("a", 3, 8)).registrations())
    for k, node in enumerate(("a-0", "a-1", "a-2")):
        decide(beat(node, 1, 8), state, now=T0 + timedelta(seconds=8 + k / 10))  # type: ignore[arg-type]
    # The live poll reads the registrations (of t=0) again after the restore did.
    for node in registrations:
        assert decide(env(node), state, now=T0 + timedelta(seconds=9)) == []
    # At t=12 every node spoke 4 s ago: none is silent for 10 s (the old registration did not count).
    assert decide(beat("a-1", 2, 12), state, now=T0 + timedelta(seconds=12)) == []  # type: ignore[arg-type]
    # a-0 fails for silence; its registration read again does not bring it back.
    out = decide(beat("a-1", 3, 19), state, now=T0 + timedelta(seconds=19))  # type: ignore[arg-type]
    assert [e.data.node for _, e in out if isinstance(e.data, NodeFailed)] == ["a-0", "a-2"]
    decide(env(registrations[0]), state, now=T0 + timedelta(seconds=20))
    assert "a-0" in state.failed


def test_after_an_outage_in_which_no_node_was_heard_its_time_counts_toward_no_silence() -> None:
    # The broker was down from t=2 to t=30: no node's heartbeat got into the log meanwhile. The outage gap
    # is the default, half the silence: the stream was heard for 5 s after the last beats before it.
    state = new_state(outage_gap=None)
    state.restore(env(grant("g", "a-0")))
    for node in ("a-0", "a-1", "a-2"):
        decide(beat(node, 1, 2), state, now=T0 + timedelta(seconds=2))  # type: ignore[arg-type]
    # a-2's first beat after the outage is read before a-0's and a-1's: they are not silent for that.
    assert decide(beat("a-2", 2, 30), state, now=T0 + timedelta(seconds=30.1)) == []  # type: ignore[arg-type]
    decide(beat("a-1", 2, 30.5), state, now=T0 + timedelta(seconds=30.6))  # type: ignore[arg-type]
    for node in ("a-1", "a-2"):
        assert decide(beat(node, 3, 34), state, now=T0 + timedelta(seconds=34)) == []  # type: ignore[arg-type]
    # a-0 never spoke again: at t=38 the bus was heard for 5 + 8 s since its last beat, and it fails.
    out = decide(beat("a-1", 4, 38), state, now=T0 + timedelta(seconds=38))  # type: ignore[arg-type]
    assert [e.data.node for _, e in out if isinstance(e.data, NodeFailed)] == ["a-0"]


def test_a_node_failure_older_than_the_nodes_latest_registration_releases_nothing() -> None:
    """node_health folds nodes with the one lifecycle fold, as placement does: a failure read after a
    newer registration of the node (another topic, a restore) is history, not news."""
    state = new_state()
    [again] = [r for r in cluster(("a", 3, 8)).registrations() if r.node == "a-0"]
    decide(env(again, at=10), state, now=T0 + timedelta(seconds=10))
    state.restore(env(grant("g", "a-0")))
    stale = NodeFailed(node=NodeId("a-0"), code="operator", reason="reported before the re-registration")

    assert decide(env(stale, at=5), state, now=T0 + timedelta(seconds=11)) == []
    assert "a-0" not in state.failed and "g.1" in state.live

    fresh = NodeFailed(node=NodeId("a-0"), code="operator", reason="down again")
    out = decide(env(fresh, at=12), state, now=T0 + timedelta(seconds=12))
    assert [(e.data.job_id, e.data.reason) for _, e in out if isinstance(e.data, AllocationReleased)] == [
        ("g", "node_failed")
    ]


def beats_every_half_second(state: NodeHealthState, nodes: tuple[str, ...], start: float, end: float) -> None:
    for k in range(int((end - start) * 2) + 1):
        t = start + k / 2
        for node in nodes:
            assert decide(beat(node, int(t * 2), t), state, now=T0 + timedelta(seconds=t)) == []  # type: ignore[arg-type]


def test_after_an_outage_shorter_than_the_silence_nodes_heard_late_are_not_failed() -> None:
    """The chaos run's case: the broker down for 9 s of a 10 s silence, then node_health (restarted, 2 s
    behind) reads one node's beat before the others' come back; none of them is failed for that."""
    state = new_state(outage_gap=None)
    state.restore(env(grant("g", "a-1")))
    beats_every_half_second(state, ("a-0", "a-1", "a-2"), 0, 5)
    # Down from t=5 to t=14. a-0's first beat after it is read at t=16; a-1 and a-2 are heard 3 s later.
    assert decide(beat("a-0", 100, 14), state, now=T0 + timedelta(seconds=16)) == []  # type: ignore[arg-type]
    assert decide(beat("a-0", 101, 16), state, now=T0 + timedelta(seconds=16.1)) == []  # type: ignore[arg-type]
    beats_every_half_second(state, ("a-0",), 16.5, 17)
    beats_every_half_second(state, ("a-0", "a-1", "a-2"), 17, 19)
    assert state.failed == frozenset()
    # The same cluster judged by wall time: a-1 and a-2 had not been heard for 12 s at t=17.
    # a-2 goes silent for good: failed once the bus was heard for 10 s since its last beat.
    beats_every_half_second(state, ("a-0", "a-1"), 19.5, 29.5)
    out = decide(beat("a-0", 200, 30), state, now=T0 + timedelta(seconds=30))  # type: ignore[arg-type]
    assert [e.data.node for _, e in out if isinstance(e.data, NodeFailed)] == ["a-2"]


def test_beats_stamped_during_an_outage_and_sent_after_it_do_not_hide_it() -> None:
    """An agent queues its beats while the broker is down and sends them when it is back: their own times
    fill the outage, their records' times (when the bus heard them) do not."""

    def run(*, with_record_times: bool) -> list[str]:
        state = new_state(outage_gap=None)
        beats_every_half_second(state, ("a-0", "a-1", "a-2"), 0, 5)
        out = []
        for k in range(23):  # a-0's backlog, stamped t=5..16, all handed to the broker at t=16
            stamped = 5 + k / 2
            heard = T0 + timedelta(seconds=16) if with_record_times else None
            out += decide(beat("a-0", 50 + k, stamped), state, now=T0 + timedelta(seconds=16), heard_at=heard)  # type: ignore[arg-type]
        # The others' beats come back a little later than a-0's: at t=17 a-0 beats again, they not yet.
        heard = T0 + timedelta(seconds=17) if with_record_times else None
        out += decide(beat("a-0", 80, 17), state, now=T0 + timedelta(seconds=17), heard_at=heard)  # type: ignore[arg-type]
        return [e.data.node for _, e in out if isinstance(e.data, NodeFailed)]

    assert run(with_record_times=True) == []
    assert run(with_record_times=False) == ["a-1", "a-2"]  # what the beats' own times alone would say
