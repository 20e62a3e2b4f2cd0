"""Carrying out an elastic resize in the core: when a grow falls back to the job's old placements (pure).

Two nodes of 2 GPUs; the elastic job runs one GPU a worker, 1..3 workers, on ``a/gpu0``.
"""

from __future__ import annotations

from gangline.core.actions.queueing import Resize
from gangline.core.model import (
    Allocation,
    AllocationId,
    DomainId,
    Gpu,
    GpuId,
    GpuModel,
    Job,
    JobId,
    MiB,
    Node,
    NodeId,
    QueueName,
    WorkerPlacement,
)
from gangline.core.resize import apply_resize, grow_falls_back
from gangline.core.snapshot import Snapshot

JOB = Job(id=JobId("el"), queue=QueueName("q"), workers=3, min_workers=1)
CURRENT = Allocation(AllocationId("el.1"), JOB.id, (WorkerPlacement(0, NodeId("a"), (GpuId("a/gpu0"),)),))


def node(name: str) -> Node:
    gpus = tuple(Gpu(GpuId(f"{name}/gpu{i}"), i, GpuModel("H100"), MiB(81_920)) for i in range(2))
    return Node(NodeId(name), gpus, leaf=DomainId("leaf"), spine=DomainId("spine"))


def cluster() -> Snapshot:
    snap = Snapshot([node("a"), node("b")])
    assert snap.grant(JOB, CURRENT).ok
    return snap


def placed(*gpus: str) -> tuple[WorkerPlacement, ...]:
    return tuple(WorkerPlacement(r, NodeId(g.split("/")[0]), (GpuId(g),)) for r, g in enumerate(gpus))


GROW = placed("a/gpu0", "a/gpu1", "b/gpu0")


def test_a_grow_onto_usable_gpus_goes_ahead() -> None:
    assert not grow_falls_back(cluster(), CURRENT, GROW)


def test_a_grow_one_of_whose_added_gpus_failed_falls_back() -> None:
    snap = cluster()
    snap.set_gpu_health(GpuId("b/gpu0"), False)
    assert grow_falls_back(snap, CURRENT, GROW)


def test_a_grow_onto_a_cordoned_node_falls_back() -> None:
    snap = cluster()
    snap.cordon(NodeId("b"))
    assert grow_falls_back(snap, CURRENT, GROW)
    assert not grow_falls_back(snap, CURRENT, placed("a/gpu0", "a/gpu1"))  # only b is cordoned


def test_a_gpu_the_job_holds_already_does_not_make_it_fall_back() -> None:
    snap = cluster()
    snap.cordon(NodeId("a"))  # its running work stays: what it holds is not what the grow adds
    snap.set_gpu_health(GpuId("a/gpu0"), False)
    assert not grow_falls_back(snap, CURRENT, placed("a/gpu0", "b/gpu0", "b/gpu1"))
    assert not grow_falls_back(snap, CURRENT, CURRENT.placements)  # a shrink (or no change) adds none


def test_a_grow_onto_a_gpu_not_in_the_cluster_falls_back() -> None:
    assert grow_falls_back(cluster(), CURRENT, placed("a/gpu0", "c/gpu0"))


def test_apply_resize_grants_a_grow_that_falls_back_at_the_old_placements() -> None:
    snap = cluster()
    snap.set_gpu_health(GpuId("b/gpu0"), False)
    resize = Resize(JOB.id, from_workers=1, to_workers=3, placements=GROW, checkpoint_deadline=0.0)
    allocation = apply_resize(snap, resize, AllocationId("el.2"))
    assert allocation == Allocation(AllocationId("el.2"), JOB.id, CURRENT.placements)
    assert snap.running[JOB.id].allocation == allocation
    assert snap.g_owner[snap.gpu_pos[GpuId("a/gpu1")]] is None  # nothing of the grow is held
    assert snap.check_invariants() == []


def test_apply_resize_grows_onto_usable_gpus() -> None:
    snap = cluster()
    resize = Resize(JOB.id, from_workers=1, to_workers=3, placements=GROW, checkpoint_deadline=0.0)
    allocation = apply_resize(snap, resize, AllocationId("el.2"))
    assert allocation is not None and allocation.placements == GROW
    assert snap.running[JOB.id].allocation == allocation
