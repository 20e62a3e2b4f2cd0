"""Quota with pools: each job it lets through, and each job of an unlimited queue, is routed to one pool
that can hold it whole; the job.queued names the pool and carries the spec; a job keeps its pool."""

from __future__ import annotations

from svc_helpers import env
from test_quota import TOPICS, admit, feed, grant, release, requeue

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.core.pools import PoolLayout
from gangline.events.jobs import JobCompleted, JobPending, JobQueued
from gangline.events.nodes import NodeRegistered
from gangline.events.types import AllocationId, JobId
from services.common.queues import QueuesFile, queues_of
from services.quota.handlers import QuotaState
from services.quota.wiring import pool_partition

H100 = "H100-SXM5-80GB"
LAYOUT = PoolLayout("spine", ("spine-a", "spine-b"))
TEAMS = {
    "queues": [
        {"name": "team-a", "quotas": {H100: {"nominal": 64}}},
        {"name": "default", "unlimited": True},
    ]
}


def spines(nodes_per_spine: int = 2) -> list[NodeRegistered]:
    groups = tuple(
        NodeGroup(
            name=f"n{s}",
            count=nodes_per_spine,
            gpu_model=H100,
            gpus_per_node=8,
            memory_mib=81920,
            leaf=f"leaf-{s}",
            spine=f"spine-{s}",
        )
        for s in "ab"
    )
    return ClusterSpec(groups=groups).registrations()


def pooled_quota(doc: dict[str, object] = TEAMS) -> QuotaState:
    state = QuotaState(
        topics=TOPICS, queues=queues_of(QueuesFile.model_validate(doc)), half_life_s=0, pools=LAYOUT
    )
    for node in spines():
        assert feed(state, env(node)) == []
    return state


def routed(outputs: list) -> JobQueued:  # type: ignore[type-arg]
    [queued] = [e.data for e in outputs if isinstance(e.data, JobQueued)]
    return queued


def test_jobs_are_routed_to_the_pool_with_the_most_room_and_the_event_carries_what_the_pool_needs() -> None:
    state = pooled_quota()
    first = routed(feed(state, admit("j1", gpus_per_worker=8)))
    second = routed(feed(state, admit("j2", gpus_per_worker=8)))
    third = routed(feed(state, admit("j3", gpus_per_worker=4)))
    assert (first.pool, second.pool, third.pool) == ("spine-a", "spine-b", "spine-a")
    assert first.spec is not None and first.spec.gpus_per_worker == 8
    assert first.admitted_at is not None
    assert state.routed_gpus == {"spine-a": 12, "spine-b": 8}


def test_the_routing_event_goes_to_its_pools_partition() -> None:
    state = pooled_quota()
    [queued] = feed(state, admit("j1"))
    assert pool_partition(LAYOUT)(queued) == 0
    assert (
        pool_partition(LAYOUT)(env(JobCompleted(job_id=JobId("j1"), allocation_id=AllocationId("j1.1"))))
        is None
    )


def test_a_gang_no_pool_holds_whole_waits_even_when_the_cluster_could_hold_it() -> None:
    state = pooled_quota()  # 2 nodes of 8 per spine: 32 GPUs, 16 a pool
    [held] = feed(state, admit("big", workers=3, gpus_per_worker=8))
    assert isinstance(held.data, JobPending)
    assert "a gang never spans pools" in held.data.reasons[0].message


def test_a_finished_job_frees_its_pools_room_and_a_requeued_one_keeps_its_pool() -> None:
    state = pooled_quota()
    assert routed(feed(state, admit("j1", gpus_per_worker=8))).pool == "spine-a"
    feed(state, grant("j1"))
    feed(state, release("j1", "preempted"))
    # Requeued: spine-b has more room now, but the job's records and allocation ids live in spine-a.
    assert routed(feed(state, requeue("j1"))).pool == "spine-a"
    feed(state, release("j1", "completed", attempt=2))
    assert state.routed_gpus == {"spine-a": 0}


def test_a_job_of_an_unlimited_queue_is_routed_once_and_charged_nothing() -> None:
    state = pooled_quota()
    admitted = admit("u1", queue="default", gpus_per_worker=2)
    queued = routed(feed(state, admitted))
    assert (queued.pool, queued.gpu_type, queued.queue) == ("spine-a", None, "default")
    assert feed(state, admitted) == []  # read again (a restart's re-read): not routed twice
    assert state.routed_gpus == {"spine-a": 2}


def test_without_pools_nothing_is_routed() -> None:
    state = QuotaState(topics=TOPICS, queues=queues_of(QueuesFile.model_validate(TEAMS)), half_life_s=0)
    for node in spines():
        feed(state, env(node))
    queued = routed(feed(state, admit("j1")))
    assert (queued.pool, queued.spec, queued.admitted_at) == (None, None, None)
    assert feed(state, admit("u1", queue="default")) == []
