"""Quota with pools: each admitted job, of a limited or an unlimited queue, is routed to one pool that can
hold it whole (job.routed, with the spec); its job.queued names the pool; a job keeps its pool."""

from __future__ import annotations

from svc_helpers import env
from test_quota import TOPICS, admit, feed, grant, release, requeue

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.core.pools import PoolLayout
from gangline.events.jobs import JobCompleted, JobPending, JobQueued, JobRouted
from gangline.events.nodes import NodeRegistered
from gangline.events.types import AllocationId, JobId
from services.common.queues import QueuesFile, queues_of
from services.quota.handlers import QuotaState
from services.quota.wiring import pool_partitions

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


def routed(outputs: list) -> JobRouted:  # type: ignore[type-arg]
    [event] = [e.data for e in outputs if isinstance(e.data, JobRouted)]
    return event


def queued(outputs: list) -> JobQueued:  # type: ignore[type-arg]
    [event] = [e.data for e in outputs if isinstance(e.data, JobQueued)]
    return event


def test_jobs_are_routed_to_the_pool_with_the_most_room_and_the_event_carries_what_the_pool_needs() -> None:
    state = pooled_quota()
    out = feed(state, admit("j1", gpus_per_worker=8))
    first = routed(out)
    assert queued(out).pool == "spine-a"  # let through at once, in its pool
    second = routed(feed(state, admit("j2", gpus_per_worker=8)))
    third = routed(feed(state, admit("j3", gpus_per_worker=4)))
    assert (first.pool, second.pool, third.pool) == ("spine-a", "spine-b", "spine-a")
    assert first.spec.gpus_per_worker == 8
    assert first.admitted_at == admit("j1").time
    assert state.routed_gpus == {"spine-a": 12, "spine-b": 8}


def test_what_quota_writes_about_a_routed_job_goes_to_its_pools_partition() -> None:
    state = pooled_quota()
    partition_of = pool_partitions(state)
    feed(state, admit("j0", gpus_per_worker=8))  # to spine-a: j1 goes to spine-b
    out = feed(state, admit("j1"))
    assert [partition_of(TOPICS.events, e) for e in out] == [1, 1]  # job.routed, job.queued
    assert partition_of(TOPICS.queue_status, out[0]) is None  # not a pooled topic
    other = env(JobCompleted(job_id=JobId("j9"), allocation_id=AllocationId("j9.1")))
    assert partition_of(TOPICS.events, other) is None  # not routed: by key


def test_a_gang_no_pool_holds_whole_waits_even_when_the_cluster_could_hold_it() -> None:
    state = pooled_quota()  # 2 nodes of 8 per spine: 32 GPUs, 16 a pool
    went, held = feed(state, admit("big", workers=3, gpus_per_worker=8))
    assert isinstance(went.data, JobRouted) and isinstance(held.data, JobPending)
    assert "in pool spine-a (a gang never spans pools)" in held.data.reasons[0].message


def test_a_finished_job_frees_its_pools_room_and_a_requeued_one_keeps_its_pool() -> None:
    state = pooled_quota()
    assert routed(feed(state, admit("j1", gpus_per_worker=8))).pool == "spine-a"
    feed(state, grant("j1"))
    feed(state, release("j1", "preempted"))
    # Requeued: the job's records and allocation ids live in spine-a, where it is queued again.
    assert queued(feed(state, requeue("j1"))).pool == "spine-a"
    feed(state, release("j1", "completed", attempt=2))
    assert state.routed_gpus == {"spine-a": 0}


def test_a_job_of_an_unlimited_queue_is_routed_once_and_charged_nothing() -> None:
    state = pooled_quota()
    admitted = admit("u1", queue="default", gpus_per_worker=2)
    [out] = feed(state, admitted)
    assert isinstance(out.data, JobRouted) and out.data.pool == "spine-a"  # and no job.queued: no charge
    assert feed(state, admitted) == []  # read again (a restart's re-read): not routed twice
    assert state.routed_gpus == {"spine-a": 2}
    feed(state, env(JobCompleted(job_id=JobId("u1"), allocation_id=AllocationId("u1.1"))))
    assert state.routed_gpus == {"spine-a": 0}
    assert "u1" in state.retired  # ended: its records are skipped again


def test_without_pools_nothing_is_routed() -> None:
    state = QuotaState(topics=TOPICS, queues=queues_of(QueuesFile.model_validate(TEAMS)), half_life_s=0)
    for node in spines():
        feed(state, env(node))
    [out] = feed(state, admit("j1"))
    assert isinstance(out.data, JobQueued) and out.data.pool is None
    assert feed(state, admit("u1", queue="default")) == []
