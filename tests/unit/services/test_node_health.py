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


def new_state() -> NodeHealthState:
    state = NodeHealthState(
        topics=TOPICS, silence=timedelta(seconds=10), check_every=timedelta(seconds=1), started=T0
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


def test_after_an_outage_in_which_no_node_was_heard_silence_counts_from_the_first_beat_after_it() -> None:
    # The broker was down from t=2 to t=30: no node's heartbeat got into the log meanwhile.
    state = new_state()
    state.restore(env(grant("g", "a-0")))
    for node in ("a-0", "a-1", "a-2"):
        decide(beat(node, 1, 2), state, now=T0 + timedelta(seconds=2))  # type: ignore[arg-type]
    # a-2's first beat after the outage is read before a-0's and a-1's: they are not silent for that.
    assert decide(beat("a-2", 2, 30), state, now=T0 + timedelta(seconds=30.1)) == []  # type: ignore[arg-type]
    decide(beat("a-1", 2, 30.5), state, now=T0 + timedelta(seconds=30.6))  # type: ignore[arg-type]
    for k, at in enumerate((34, 38), start=3):
        for node in ("a-1", "a-2"):
            assert decide(beat(node, k, at), state, now=T0 + timedelta(seconds=at)) == []  # type: ignore[arg-type]
    # a-0 never spoke again: 10 s after the outage ended it is silent, and fails.
    out = decide(beat("a-1", 5, 41), state, now=T0 + timedelta(seconds=41))  # type: ignore[arg-type]
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
