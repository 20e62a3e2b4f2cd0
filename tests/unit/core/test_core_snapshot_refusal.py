"""Nodes the core cannot model are left out of the snapshot with a reason; the rest is scheduled (pure).

Also: a GPU whose MIG instances are already carved hands out only those, and its placements carry
the ids NVML knows the instance by.
"""

from __future__ import annotations

from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import run_cycle
from gangline.core.mig import MigProfileName
from gangline.core.model import (
    DomainId,
    Gpu,
    GpuId,
    GpuMode,
    GpuModel,
    Job,
    JobId,
    MiB,
    MigSlot,
    Node,
    NodeId,
    QueueName,
)
from gangline.core.snapshot import Snapshot, node_problem


def node(
    name: str,
    model: str,
    *,
    count: int = 2,
    mode: GpuMode = GpuMode.WHOLE,
    memory_mib: int = 81_920,
    layout: tuple[MigSlot, ...] | None = None,
    leaf: str = "leaf-a",
    domain: str | None = None,
) -> Node:
    return Node(
        id=NodeId(name),
        gpus=tuple(
            Gpu(
                id=GpuId(f"{name}/gpu{i}"),
                index=i,
                model=GpuModel(model),
                memory_mib=MiB(memory_mib),
                mode=mode,
                mig_layout=layout,
            )
            for i in range(count)
        ),
        leaf=DomainId(leaf),
        spine=DomainId("spine-0"),
        nvlink_domain=DomainId(domain) if domain is not None else None,
    )


def mig_job(name: str, profile: str, workers: int = 1) -> Job:
    return Job(id=JobId(name), queue=QueueName("q"), workers=workers, mig_profile=MigProfileName(profile))


def whole_job(name: str, gpus: int) -> Job:
    return Job(id=JobId(name), queue=QueueName("q"), workers=1, gpus_per_worker=gpus)


def slot(profile: str, start: int, gi: int, ci: int = 0) -> MigSlot:
    return MigSlot(MigProfileName(profile), start, gpu_instance=gi, compute_instance=ci)


A30 = node("a30-0", "A30", mode=GpuMode.MIG, memory_mib=24_576)


def test_node_problem_names_the_gpu_and_its_model() -> None:
    problem = node_problem(A30)
    assert problem is not None
    assert "a30-0/gpu0" in problem and "'A30'" in problem and "no known MIG geometry" in problem


def test_models_nvml_names_are_modelled_in_mig_mode() -> None:
    named = {
        "A100-SXM4-80GB": 81_920,
        "NVIDIA H100 80GB HBM3": 81_559,
        "H100-80GB-HBM3": 81_559,
        "NVIDIA H200": 143_771,
    }
    for model, memory_mib in named.items():
        assert node_problem(node("n", model, mode=GpuMode.MIG, memory_mib=memory_mib)) is None


def test_an_unknown_model_in_whole_mode_is_fine() -> None:
    assert node_problem(node("n", "A30", memory_mib=24_576)) is None


def test_an_impossible_carved_layout_is_a_node_problem() -> None:
    bad = node("n", "A100-SXM4-80GB", mode=GpuMode.MIG, layout=(slot("3g.40gb", 2, gi=1),))
    problem = node_problem(bad)
    assert problem is not None and "cannot start at memory slice 2" in problem


def test_one_bad_node_is_left_out_and_the_others_are_scheduled() -> None:
    good = node("h100-0", "NVIDIA H100 80GB HBM3", count=8)
    snap = Snapshot([A30, good])
    assert [n.id for n in snap.nodes] == ["h100-0"]
    assert set(snap.refused) == {"a30-0"} and "no known MIG geometry" in snap.refused[NodeId("a30-0")]
    plan = run_cycle(snap, [whole_job("j1", 4)], default_profile(), cycle=1)
    placed = plan.placed_job(JobId("j1"))
    assert placed is not None and placed.allocation.nodes == ("h100-0",)


def test_conflicting_topology_leaves_the_later_node_out_instead_of_raising() -> None:
    first = node("n0", "H100-80GB", leaf="leaf-a", domain="rack-1")
    second = node("n1", "H100-80GB", leaf="leaf-b", domain="rack-1")
    snap = Snapshot([second, first])
    assert [n.id for n in snap.nodes] == ["n0"]
    assert "rack-1" in snap.refused[NodeId("n1")] and "leaf-a" in snap.refused[NodeId("n1")]


def test_a_node_registered_twice_keeps_the_first() -> None:
    snap = Snapshot([node("n0", "H100-80GB"), node("n0", "H100-80GB")])
    assert [n.id for n in snap.nodes] == ["n0"] and "twice" in snap.refused[NodeId("n0")]


def test_carved_instances_are_placed_with_their_nvml_ids() -> None:
    # GPU instance ids follow the driver, not the memory slices: 1g.10gb GI 7 sits at slice 4
    layout = (slot("1g.10gb", 4, gi=7), slot("1g.10gb", 0, gi=10, ci=0))
    carved = node("mig-0", "A100-SXM4-80GB", count=1, mode=GpuMode.MIG, layout=layout)
    snap = Snapshot([carved])
    assert snap.refused == {}
    plan = run_cycle(snap, [mig_job("m1", "1g.10gb", workers=2)], default_profile(), cycle=1)
    placed = plan.placed_job(JobId("m1"))
    assert placed is not None
    migs = sorted((p.mig.start, p.mig.gpu_instance) for p in placed.allocation.placements if p.mig)
    assert migs == [(0, 10), (4, 7)]


def test_a_profile_not_carved_is_not_offered() -> None:
    carved = node("mig-0", "A100-SXM4-80GB", count=1, mode=GpuMode.MIG, layout=(slot("1g.10gb", 4, gi=7),))
    snap = Snapshot([carved])
    plan = run_cycle(
        snap, [mig_job("big", "3g.40gb"), mig_job("two", "1g.10gb", 2)], default_profile(), cycle=1
    )
    assert plan.placed_job(JobId("big")) is None and plan.placed_job(JobId("two")) is None
    one = run_cycle(snap, [mig_job("one", "1g.10gb")], default_profile(), cycle=2).placed_job(JobId("one"))
    assert one is not None and one.allocation.placements[0].mig == MigSlot(MigProfileName("1g.10gb"), 4)


def test_without_a_carved_layout_any_position_may_be_chosen() -> None:
    dynamic = node("mig-0", "H100-80GB-HBM3", count=1, mode=GpuMode.MIG)
    plan = run_cycle(Snapshot([dynamic]), [mig_job("m", "3g.40gb")], default_profile(), cycle=1)
    placed = plan.placed_job(JobId("m"))
    assert placed is not None
    mig = placed.allocation.placements[0].mig
    assert mig is not None and mig.start in (0, 4) and mig.gpu_instance is None
