"""The chaos race: placement reads a failed node's release and requeue before the failure itself and puts
the job back onto that node; node_health must release that grant too (driven through both handlers)."""

from __future__ import annotations

from datetime import timedelta

from svc_helpers import T0, admitted, cluster, env

from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import JobCompleted, JobRequeued
from gangline.events.nodes import GpuHealthChanged, HealthCause, NodeFailed, NodeHeartbeat
from gangline.events.types import AllocationId, GpuId, JobId, NodeId
from services.common.topics import TopicNames
from services.node_health import handlers as node_health
from services.placement import handlers as placement

TOPICS = TopicNames()
NODES = ("a", 2, 8)


def health_state() -> node_health.NodeHealthState:
    state = node_health.NodeHealthState(
        topics=TOPICS, silence=timedelta(seconds=10), check_every=timedelta(seconds=1), started=T0
    )
    for node in cluster(NODES).registrations():
        state.restore(env(node))
    return state


def placement_state() -> placement.PlacementState:
    state = placement.PlacementState(topics=TOPICS, gated=False)
    for node in cluster(NODES).registrations():
        state.restore(env(node))
    state.needs_cycle = False
    return state


def place(state: placement.PlacementState, envelope: Envelope, at: float) -> list[Envelope]:
    outputs = placement.decide(envelope, state, now=T0 + timedelta(seconds=at))
    for _, out in outputs:
        state.fold(out)
    return [e for _, e in outputs]


def grants(outputs: list[Envelope]) -> list[AllocationGranted]:
    return [e.data for e in outputs if isinstance(e.data, AllocationGranted)]


def of_type(outputs: list[Envelope], kind: type) -> list[Envelope]:
    return [e for e in outputs if isinstance(e.data, kind)]


def running_on_both_nodes() -> tuple[placement.PlacementState, node_health.NodeHealthState, str]:
    """Two 8-GPU jobs, one per node; the node that holds ``g`` is returned."""
    place_, health = placement_state(), health_state()
    for job in ("g", "filler"):
        for granted in of_type(place(place_, admitted(job, gpus_per_worker=8), 1), AllocationGranted):
            health.restore(granted)
            assert node_health.decide(granted, health, now=T0 + timedelta(seconds=1)) == []
    node = next(p.node for p in place_.jobs["g"].grants["g.1"].placements)  # type: ignore[index]
    return place_, health, node


def test_a_job_put_back_on_its_silent_node_before_placement_read_the_failure_is_released_again() -> None:
    place_, health, node = running_on_both_nodes()
    other = next(n for n in ("a-0", "a-1") if n != node)
    # node goes silent; the other node beats on until node_health declares it failed.
    failure: list[Envelope] = []
    for k in range(1, 25):
        beat = env(NodeHeartbeat(node=NodeId(other), seq=k), at=k / 2)
        failure += [e for _, e in node_health.decide(beat, health, now=T0 + timedelta(seconds=k / 2))]
    [failed] = of_type(failure, NodeFailed)
    [released] = of_type(failure, AllocationReleased)
    [requeued] = of_type(failure, JobRequeued)
    assert (failed.data.node, released.data.allocation_id) == (node, "g.1")

    # Placement reads the release and the requeue (jobs.events, allocations.log) before node.failed
    # (nodes.health): the only 8 free GPUs are the failed node's, and g goes back there.
    assert place(place_, released, 13) == []
    [again] = grants(place(place_, requeued, 13))
    assert {p.node for p in again.placements} == {node}

    # node_health reads that grant after its failure: released and requeued once more, with ids of its own.
    regrant = env(again, at=13)
    out = [e for _, e in node_health.decide(regrant, health, now=T0 + timedelta(seconds=13))]
    assert [(e.data.allocation_id, e.data.reason) for e in of_type(out, AllocationReleased)] == [
        ("g.2", "node_failed")
    ]
    [requeued_again] = of_type(out, JobRequeued)
    assert (requeued_again.data.attempt, requeued_again.data.reason) == (3, "node_failed")
    assert "g.2" not in health.live
    # Read again (a retried batch, a restart's redelivery): nothing more.
    assert node_health.decide(regrant, health, now=T0 + timedelta(seconds=14)) == []

    # Once placement has read the failure, g goes nowhere near that node.
    place(place_, failed, 14)
    assert place(place_, out[0], 14) == []
    assert grants(place(place_, requeued_again, 14)) == []
    assert place_.waiting.keys() == {"g"}


def test_a_grant_of_a_failed_gpu_read_after_its_failure_is_released_and_requeued() -> None:
    place_, health, node = running_on_both_nodes()
    xid = GpuHealthChanged(
        node=NodeId(node),
        gpu=GpuId("gpu0"),
        previous="healthy",
        state="failed",
        cause=HealthCause(kind="xid", message="XID 79", xid=79),
    )
    out = [e for _, e in node_health.decide(env(xid, at=5), health, now=T0 + timedelta(seconds=5))]
    [released] = of_type(out, AllocationReleased)
    [requeued] = of_type(out, JobRequeued)
    place(place_, released, 6)
    [again] = grants(place(place_, requeued, 6))  # the failed GPU is not read yet: back on all 8
    assert GpuId("gpu0") in next(p.gpus for p in again.placements if p.node == node)

    out = [e for _, e in node_health.decide(env(again, at=6), health, now=T0 + timedelta(seconds=6))]
    [requeued_again] = of_type(out, JobRequeued)
    assert requeued_again.data.reason == "gpu_failed"
    assert [e.data.allocation_id for e in of_type(out, AllocationReleased)] == ["g.2"]


def test_a_grant_beside_a_failed_gpu_is_left_alone() -> None:
    place_, health, node = running_on_both_nodes()
    xid = env(
        GpuHealthChanged(
            node=NodeId(node),
            gpu=GpuId("gpu0"),
            previous="healthy",
            state="failed",
            cause=HealthCause(kind="xid", message="XID 79", xid=79),
        ),
        at=5,
    )
    out = [e for _, e in node_health.decide(xid, health, now=T0 + timedelta(seconds=5))]
    for envelope in (xid, *out):
        place(place_, envelope, 6)
    # Placement read the failed GPU: g waits (7 GPUs left there); a 7-GPU job takes the rest of the node.
    assert place_.waiting.keys() == {"g"}
    [beside] = grants(place(place_, admitted("beside", gpus_per_worker=7), 7))
    assert {p.node for p in beside.placements} == {node}
    assert node_health.decide(env(beside, at=7), health, now=T0 + timedelta(seconds=7)) == []
    assert beside.allocation_id in health.live


def test_a_job_that_completed_on_a_node_before_it_failed_is_left_to_placement() -> None:
    """Its end was read: placement releases it (completed); a release and requeue here too would write
    a second release and restart a finished job."""
    _, health, node = running_on_both_nodes()
    done = env(JobCompleted(job_id=JobId("g"), allocation_id=AllocationId("g.1")), at=2)
    assert node_health.decide(done, health, now=T0 + timedelta(seconds=2)) == []
    failed = env(NodeFailed(node=NodeId(node), code="operator", reason="down"), at=3)
    assert node_health.decide(failed, health, now=T0 + timedelta(seconds=3)) == []
    assert "g.1" in health.live  # until placement's release is read
