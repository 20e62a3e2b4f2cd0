"""Which GPU models can hold a job's workers: node shapes per model, whole GPUs, memory, MIG, fractions."""

from __future__ import annotations

from gangline.core.framework.status import ReasonCode
from gangline.core.hardware import GpuOffer, Hardware, NodeOffer, WorkerAsk, instances_per_gpu
from gangline.core.mig import MigProfileName, mig_geometry
from gangline.core.model import (
    GpuMode,
    GpuModel,
    Job,
    JobId,
    MiB,
    QueueName,
    TopologyConstraint,
    TopologyLevel,
    TopologyMode,
)

H100 = GpuModel("H100-SXM5-80GB")
GB200 = GpuModel("GB200")
A100 = GpuModel("A100-80GB")


def node(
    model: GpuModel,
    gpus: int,
    *,
    memory: int = 81920,
    mode: GpuMode = GpuMode.WHOLE,
    nvlink: str = "",
    leaf: str = "leaf-0",
) -> NodeOffer:
    return NodeOffer(tuple(GpuOffer(model, MiB(memory), mode) for _ in range(gpus)), nvlink, leaf, "spine-0")


def test_a_worker_of_eight_fits_only_the_model_whose_nodes_offer_eight() -> None:
    hw = Hardware([node(H100, 8), node(H100, 8), node(GB200, 4), node(GB200, 4)])
    ask = WorkerAsk(workers=1, gpus=8)

    assert hw.holds(H100, ask).ok
    no = hw.holds(GB200, ask)
    assert not no.ok
    [reason] = no.reasons
    assert reason.code is ReasonCode.GANG_SIZE
    assert reason.details["largest_node"] == 4 and reason.details["gpu_type"] == GB200
    assert "the largest GB200 node offers 4" in reason.message
    assert [m for m in (GB200, H100) if hw.holds(m, WorkerAsk(workers=2, gpus=4)).ok] == [GB200, H100]


def test_a_gang_needs_enough_nodes_of_one_model_to_hold_all_its_workers_at_once() -> None:
    hw = Hardware([node(H100, 8), node(H100, 6)])

    assert hw.holds(H100, WorkerAsk(workers=3, gpus=4)).ok  # 8 // 4 + 6 // 4
    status = hw.holds(H100, WorkerAsk(workers=4, gpus=4))
    assert not status.ok and status.reasons[0].details["room"] == 3
    assert status.reasons[0].code is ReasonCode.GANG_SIZE


def test_unhealthy_gpus_are_not_offered_and_a_removed_node_counts_no_more() -> None:
    full, degraded = node(H100, 8), node(H100, 7)
    hw = Hardware([full])
    assert hw.largest_node(H100) == 8
    hw.remove(full)
    hw.add(degraded)  # one GPU failed: the node offers 7
    assert hw.largest_node(H100) == 7
    assert not hw.holds(H100, WorkerAsk(workers=1, gpus=8)).ok
    hw.remove(degraded)
    assert hw.models() == []
    reason = hw.holds(H100, WorkerAsk(workers=1, gpus=1)).reasons[0]
    assert reason.code is ReasonCode.GPU_TYPE and reason.details["largest_node"] == 0


def test_memory_counts_per_gpu_and_per_node() -> None:
    hw = Hardware([node(A100, 8, memory=40960), node(A100, 2, memory=81920)])

    assert hw.holds(A100, WorkerAsk(workers=1, gpus=8, memory_mib=40000)).ok
    big = hw.holds(A100, WorkerAsk(workers=1, gpus=8, memory_mib=80000))
    assert not big.ok and big.reasons[0].code is ReasonCode.GANG_SIZE
    assert big.reasons[0].details["largest_node"] == 2
    assert hw.largest_node(A100, 80000) == 2
    too_much = hw.holds(A100, WorkerAsk(workers=1, gpus=1, memory_mib=100_000))
    assert too_much.reasons[0].code is ReasonCode.MEMORY
    assert too_much.reasons[0].details["largest_mib"] == 81920


def test_mig_workers_need_the_profile_and_fit_as_many_per_gpu_as_the_geometry_allows() -> None:
    a100 = GpuModel("A100-80GB")
    hw = Hardware([node(a100, 1, mode=GpuMode.MIG), node(H100, 8)])
    geometry = mig_geometry(a100)
    assert geometry is not None
    small = geometry.profile("1g.10gb")
    half = geometry.profile("3g.40gb")
    assert small is not None and half is not None
    assert (instances_per_gpu(geometry, small), instances_per_gpu(geometry, half)) == (7, 2)

    assert hw.holds(a100, WorkerAsk(workers=7, mig_profile="1g.10gb")).ok
    assert not hw.holds(a100, WorkerAsk(workers=8, mig_profile="1g.10gb")).ok
    unknown = hw.holds(a100, WorkerAsk(workers=1, mig_profile="1g.5gb")).reasons[0]
    assert unknown.code is ReasonCode.MIG_PROFILE and "1g.10gb" in unknown.message
    whole_only = hw.holds(H100, WorkerAsk(workers=1, mig_profile="1g.10gb")).reasons[0]
    assert whole_only.code is ReasonCode.GPU_TYPE
    # A MIG-mode GPU of a model the core has no geometry for offers no profile, and is no whole GPU.
    odd = Hardware([node(GpuModel("X1"), 1, mode=GpuMode.MIG)])
    assert not odd.holds(GpuModel("X1"), WorkerAsk(workers=1, mig_profile="1g.10gb")).ok
    assert not odd.holds(GpuModel("X1"), WorkerAsk(workers=1, gpus=1)).ok


def test_fractional_workers_need_shared_gpus() -> None:
    hw = Hardware([node(H100, 2, mode=GpuMode.SHARED), node(GB200, 4)])

    assert hw.holds(H100, WorkerAsk(workers=8, milli=250)).ok
    assert not hw.holds(H100, WorkerAsk(workers=9, milli=250)).ok
    reason = hw.holds(GB200, WorkerAsk(workers=1, milli=250)).reasons[0]
    assert reason.code is ReasonCode.FRACTION


def test_the_ask_of_a_core_job_is_its_fewest_workers() -> None:
    job = Job(
        id=JobId("j"),
        queue=QueueName("q"),
        workers=4,
        min_workers=2,
        gpus_per_worker=8,
        mig_profile=None,
    )
    hw = Hardware([node(H100, 8), node(H100, 8)])
    assert WorkerAsk.of(job) == WorkerAsk(workers=2, gpus=8)
    assert hw.holds(H100, WorkerAsk.of(job)).ok
    sliced = Job(id=JobId("s"), queue=QueueName("q"), workers=1, mig_profile=MigProfileName("1g.10gb"))
    assert WorkerAsk.of(sliced).mig_profile == "1g.10gb"


def test_a_required_topology_needs_one_domain_of_the_model_to_hold_every_worker() -> None:
    racks = [node(GB200, 4, nvlink=f"nvl{k // 18}", leaf="leaf-gb") for k in range(36)]  # two NVL72
    boxes = [node(H100, 8, nvlink=f"h{k}", leaf=f"leaf-h{k // 2}") for k in range(4)]
    hw = Hardware([*racks, *boxes])

    in_nvlink = WorkerAsk(workers=2, gpus=8, within=TopologyLevel.NVLINK)
    no = hw.holds(H100, in_nvlink)
    assert not no.ok and no.reasons[0].code is ReasonCode.TOPOLOGY
    assert no.reasons[0].details["room"] == 1 and no.reasons[0].details["level"] == "nvlink"
    assert not hw.holds(GB200, in_nvlink).ok  # a worker of 8 never fits a 4-GPU tray
    assert hw.holds(GB200, WorkerAsk(workers=18, gpus=4, within=TopologyLevel.NVLINK)).ok
    assert not hw.holds(GB200, WorkerAsk(workers=19, gpus=4, within=TopologyLevel.NVLINK)).ok
    assert hw.holds(H100, WorkerAsk(workers=2, gpus=8, within=TopologyLevel.LEAF)).ok
    assert not hw.holds(H100, WorkerAsk(workers=3, gpus=8, within=TopologyLevel.LEAF)).ok
    assert hw.holds(H100, WorkerAsk(workers=4, gpus=8, within=TopologyLevel.SPINE)).ok
    assert hw.holds(H100, WorkerAsk(workers=2, gpus=4, within=TopologyLevel.NODE)).ok
    assert not hw.holds(H100, WorkerAsk(workers=3, gpus=4, within=TopologyLevel.NODE)).ok
    # The counts follow the nodes: one rack loses a tray, the other still holds 18.
    hw.remove(racks[0])
    assert hw.roomiest_domain(GB200, TopologyLevel.NVLINK, 4, None) == 18
    hw.remove(racks[18])
    assert hw.roomiest_domain(GB200, TopologyLevel.NVLINK, 4, None) == 17


def test_the_ask_of_a_job_with_a_required_topology_keeps_its_level_and_a_preferred_one_does_not() -> None:
    required = Job(
        id=JobId("r"),
        queue=QueueName("q"),
        workers=2,
        gpus_per_worker=8,
        topology=TopologyConstraint(TopologyLevel.NVLINK),
    )
    preferred = Job(
        id=JobId("p"),
        queue=QueueName("q"),
        workers=2,
        gpus_per_worker=8,
        topology=TopologyConstraint(TopologyLevel.NVLINK, TopologyMode.PREFERRED),
    )
    assert WorkerAsk.of(required).within is TopologyLevel.NVLINK
    assert WorkerAsk.of(preferred).within is None
