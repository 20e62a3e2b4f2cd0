"""Between the wire events and the core's model (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from gangline.core.hardware import GpuOffer, NodeOffer, WorkerAsk
from gangline.core.mig import MigProfileName
from gangline.core.model import (
    Allocation,
    DomainId,
    Gpu,
    GpuMode,
    GpuModel,
    Job,
    MigSlot,
    Milli,
    Node,
    Seconds,
    TopologyConstraint,
    TopologyLevel,
    TopologyMode,
    WorkerPlacement,
)
from gangline.core.model import (
    AllocationId as CoreAllocationId,
)
from gangline.core.model import (
    GpuId as CoreGpuId,
)
from gangline.core.model import (
    JobId as CoreJobId,
)
from gangline.core.model import (
    MiB as CoreMiB,
)
from gangline.core.model import (
    NodeId as CoreNodeId,
)
from gangline.core.model import (
    QueueName as CoreQueueName,
)
from gangline.events.allocations import AllocationGranted, MigSlice, Placement
from gangline.events.jobs import JobSpec
from gangline.events.nodes import GpuInfo, NodeRegistered
from gangline.events.types import GpuId, JobId, NodeId

SEPARATOR = "/"


def core_gpu_id(node: str, gpu: str) -> CoreGpuId:
    """The core needs cluster-unique GPU ids; on the wire a GPU id is unique inside its node."""
    return CoreGpuId(f"{node}{SEPARATOR}{gpu}")


def wire_gpu_id(core_id: str) -> GpuId:
    return GpuId(core_id.split(SEPARATOR, 1)[1])


def core_node(node: NodeRegistered, *, cordoned: bool, unusable_gpus: frozenset[str]) -> Node:
    """The core's view of a registered node; `unusable_gpus` (failed or degraded) take no new work."""
    return Node(
        id=CoreNodeId(node.node),
        gpus=tuple(
            Gpu(
                id=core_gpu_id(node.node, g.id),
                index=g.index,
                model=GpuModel(g.model),
                memory_mib=CoreMiB(g.memory_mib),
                healthy=g.id not in unusable_gpus,
                mode=GpuMode.MIG if g.mig_enabled else GpuMode.WHOLE,
                mig_layout=_mig_layout(g) if g.mig_enabled else None,
            )
            for g in node.gpus
        ),
        leaf=DomainId(node.leaf),
        spine=DomainId(node.spine),
        nvlink_domain=DomainId(node.nvlink_domain),
        cordoned=cordoned,
    )


def _mig_layout(gpu: GpuInfo) -> tuple[MigSlot, ...] | None:
    """The instances carved on a MIG GPU, where the node says where they sit (None: it does not say).

    An instance whose start the node could not read cannot be told apart from the positions around
    it, so it is not handed out.
    """
    layout = tuple(
        MigSlot(
            MigProfileName(m.profile),
            m.placement_start,
            gpu_instance=m.instance_id,
            compute_instance=m.compute_instance_id,
        )
        for m in gpu.mig_instances
        if m.placement_start is not None
    )
    return layout or None


def elastic_range(spec: JobSpec) -> tuple[int, int] | None:
    """An elastic job's fewest and most workers (None: not elastic): ``min_workers`` (else the size it
    asks for) to ``max_workers`` (else that size), the core's ``min_workers`` and ``workers``."""
    if not spec.elastic:
        return None
    return (spec.min_workers or spec.workers, spec.max_workers or spec.workers)


def core_job(job_id: JobId, spec: JobSpec) -> Job:
    elastic = elastic_range(spec)
    topology = (
        TopologyConstraint(TopologyLevel.parse(spec.topology.level), TopologyMode(spec.topology.mode))
        if spec.topology is not None
        else None
    )
    return Job(
        id=CoreJobId(job_id),
        queue=CoreQueueName(spec.queue),
        workers=elastic[1] if elastic is not None else spec.workers,
        gpus_per_worker=max(1, spec.gpus_per_worker),
        gpu_type=GpuModel(spec.gpu_type) if spec.gpu_type is not None else None,
        gpu_memory_mib=CoreMiB(spec.gpu_memory_mib) if spec.gpu_memory_mib is not None else None,
        mig_profile=MigProfileName(spec.mig_profile) if spec.mig_profile is not None else None,
        gpu_milli=Milli(spec.gpu_fraction_milli) if spec.gpu_fraction_milli is not None else None,
        priority=spec.priority,
        preemptible=spec.preemptible,
        checkpoint_grace_s=Seconds(spec.checkpoint_grace_s),
        topology=topology,
        min_workers=elastic[0] if elastic is not None else None,
        duration_hint_s=Seconds(spec.duration_hint_s) if spec.duration_hint_s is not None else None,
        time_limit_s=Seconds(spec.time_limit_s) if spec.time_limit_s is not None else None,
    )


def wire_placements(allocation: Allocation) -> tuple[Placement, ...]:
    placements = []
    for p in allocation.placements:
        gpus = tuple(wire_gpu_id(g) for g in p.gpus)
        mig = None
        if p.mig is not None:
            mig = MigSlice(
                gpu=gpus[0],
                profile=p.mig.profile,
                instance_id=p.mig.gpu_instance,
                compute_instance_id=p.mig.compute_instance,
                start=p.mig.start,
            )
        placements.append(
            Placement(rank=p.rank, node=NodeId(p.node), gpus=gpus, mig=mig, gpu_fraction_milli=p.milli)
        )
    return tuple(placements)


def core_allocation(granted: AllocationGranted) -> Allocation:
    return Allocation(
        id=CoreAllocationId(granted.allocation_id),
        job_id=CoreJobId(granted.job_id),
        placements=core_placements(granted.placements),
    )


def core_placements(placements: Sequence[Placement]) -> tuple[WorkerPlacement, ...]:
    """The core's worker placements of a grant's (or a resize's) placements."""
    return tuple(
        WorkerPlacement(
            rank=p.rank,
            node=CoreNodeId(p.node),
            gpus=tuple(core_gpu_id(p.node, g) for g in p.gpus),
            mig=_core_mig(p.mig),
            milli=Milli(p.gpu_fraction_milli) if p.gpu_fraction_milli is not None else None,
        )
        for p in placements
    )


def _core_mig(mig: MigSlice | None) -> MigSlot | None:
    if mig is None:
        return None
    if mig.start is None:  # written before grants said where a slice starts: it was in instance_id
        return MigSlot(MigProfileName(mig.profile), mig.instance_id or 0)
    return MigSlot(
        MigProfileName(mig.profile),
        mig.start,
        gpu_instance=mig.instance_id,
        compute_instance=mig.compute_instance_id,
    )


def worker_ask(spec: JobSpec) -> WorkerAsk:
    """What one worker of ``spec`` needs of a GPU model, and how many workers at least."""
    return WorkerAsk(
        workers=spec.min_workers or spec.workers,
        gpus=spec.gpus_per_worker,
        memory_mib=spec.gpu_memory_mib,
        mig_profile=spec.mig_profile,
        milli=spec.gpu_fraction_milli,
        within=TopologyLevel.parse(spec.topology.level)
        if spec.topology is not None and spec.topology.mode == "required"
        else None,
    )


def node_offer(node: NodeRegistered | None, unusable_gpus: frozenset[str] = frozenset()) -> NodeOffer:
    """What a node's usable GPUs offer, as the core's hardware counts it (nothing for None: out)."""
    if node is None:
        return NodeOffer()
    offered = [
        GpuOffer(GpuModel(g.model), CoreMiB(g.memory_mib), GpuMode.MIG if g.mig_enabled else GpuMode.WHOLE)
        for g in node.gpus
        if g.id not in unusable_gpus
    ]
    return NodeOffer(tuple(sorted(offered)), node.nvlink_domain, node.leaf, node.spine)


def pool_labels(node: NodeRegistered) -> dict[str, str]:
    """The labels a pool layout may split the cluster by (gangline.core.pools): the node's own ``labels``,
    its topology (``spine``, ``leaf``, ``nvlink_domain``) its GPU model (``gpu_model``: the first GPU's)."""
    labels = {**node.labels, "spine": node.spine, "leaf": node.leaf, "nvlink_domain": node.nvlink_domain}
    if node.gpus:
        labels["gpu_model"] = node.gpus[0].model
    return labels
