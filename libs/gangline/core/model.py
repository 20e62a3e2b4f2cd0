"""The cluster and job model the scheduling core works on (pure data, frozen, no I/O).

Cluster: a `Node` has `Gpu`s and topology labels: its NVLink domain (the node's own GPUs by
default, or a multi-node NVLink rack such as an NVL72), its leaf switch and the spine/block above
the leaf. The levels nest: node ⊆ NVLink domain ⊆ leaf ⊆ spine ⊆ cluster. A GPU is used in one of
three modes: whole (the default), MIG (carved into profiles at the positions its geometry allows)
or shared (offering 1000 milli-GPU for fractional jobs, as in the Alibaba 2023 trace's gpu_milli).

Job: W workers each asking for G whole GPUs, or one MIG profile, or a fraction of one GPU;
optional GPU type and minimum memory; priority, queue, preemption facts, a topology constraint,
elastic bounds, a duration hint and a time limit.

Allocation: what a granted job holds, one `WorkerPlacement` per rank.

Invalid *construction* (negative counts, two request kinds at once) is a programming error and
raises `ValueError`; everything the scheduler decides is returned as values elsewhere.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType

from gangline.core.mig import MigGeometry, MigProfileName, mig_geometry

NodeId = NewType("NodeId", str)
GpuId = NewType("GpuId", str)
JobId = NewType("JobId", str)
QueueName = NewType("QueueName", str)
AllocationId = NewType("AllocationId", str)
DomainId = NewType("DomainId", str)
"""A topology domain at some level: an NVLink domain, a leaf switch or a spine/block."""
GpuModel = NewType("GpuModel", str)
MiB = NewType("MiB", int)
Milli = NewType("Milli", int)
"""Thousandths of one GPU (a shared GPU offers 1000)."""
Seconds = NewType("Seconds", int)

FULL_GPU_MILLI = Milli(1000)


class TopologyLevel(enum.IntEnum):
    """Topology levels from the closest to the widest; the levels nest in this order."""

    NODE = 0
    NVLINK = 1
    LEAF = 2
    SPINE = 3

    @property
    def label(self) -> str:
        """The wire name (`node`, `nvlink`, `leaf`, `spine`)."""
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> TopologyLevel:
        """The level called `text` (as on the wire)."""
        return cls[text.upper()]


class TopologyMode(enum.StrEnum):
    """`required` keeps every rank in one domain; `preferred` only scores closeness."""

    REQUIRED = "required"
    PREFERRED = "preferred"


class GpuMode(enum.StrEnum):
    """How a GPU is offered: as a whole device, carved by MIG, or shared by milli fractions."""

    WHOLE = "whole"
    MIG = "mig"
    SHARED = "shared"


@dataclass(frozen=True, slots=True, order=True)
class MigSlot:
    """A MIG instance: `profile` starting at memory slice `start`.

    `gpu_instance` / `compute_instance` are the ids NVML gave an instance already carved there (its
    GPU-instance id is not its start); they name it to the node and take no part in comparisons.
    """

    profile: MigProfileName
    start: int
    gpu_instance: int | None = field(default=None, compare=False)
    compute_instance: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU on a node.

    `id` is the stable device id (the UUID NVML reports); `index` its position on the node.
    `mode` MIG needs a model with a known geometry (see `gangline.core.mig`); a GPU whose model has
    none is still constructed, and `node_problem` (`gangline.core.snapshot`) says why it cannot
    be scheduled. `mig_layout` lists the MIG instances already carved on it, when the node reported
    them: only those are handed out. None: any layout the geometry allows may be carved.
    """

    id: GpuId
    index: int
    model: GpuModel
    memory_mib: MiB
    healthy: bool = True
    mode: GpuMode = GpuMode.WHOLE
    mig_layout: tuple[MigSlot, ...] | None = None

    def __post_init__(self) -> None:
        if self.index < 0 or self.memory_mib <= 0:
            raise ValueError(f"gpu {self.id}: index must be >= 0 and memory > 0")

    @property
    def mig(self) -> MigGeometry | None:
        """The MIG layout when this GPU is in MIG mode (narrowed to `mig_layout` when given)."""
        if self.mode is not GpuMode.MIG:
            return None
        geo = mig_geometry(self.model, self.memory_mib)
        if geo is None or self.mig_layout is None:
            return geo
        return geo.carved((s.profile, s.start) for s in self.mig_layout)

    def mig_problem(self) -> str | None:
        """Why this GPU's MIG mode cannot be modelled (unknown model, impossible layout), or None."""
        if self.mode is not GpuMode.MIG:
            return None
        geo = mig_geometry(self.model, self.memory_mib)
        if geo is None:
            return f"GPU {self.id}: MIG is on, but model {self.model!r} has no known MIG geometry"
        if self.mig_layout is not None:
            why = geo.layout_problem((s.profile, s.start) for s in self.mig_layout)
            if why is not None:
                return f"GPU {self.id}: {why}"
        return None


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU node with its topology labels.

    `nvlink_domain` defaults to the node itself (a node's GPUs share NVLink/NVSwitch); set it to a
    rack id for multi-node NVLink domains. All nodes of one NVLink domain must share a leaf, and
    all nodes of one leaf must share a spine.
    """

    id: NodeId
    gpus: tuple[Gpu, ...]
    leaf: DomainId
    spine: DomainId
    nvlink_domain: DomainId | None = None
    cordoned: bool = False

    def __post_init__(self) -> None:
        ids = [g.id for g in self.gpus]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node {self.id}: duplicate GPU ids")

    @property
    def domain(self) -> DomainId:
        """The node's NVLink domain (itself when not in a multi-node domain)."""
        return self.nvlink_domain if self.nvlink_domain is not None else DomainId(self.id)


@dataclass(frozen=True, slots=True)
class TopologyConstraint:
    """Where a job's ranks must (`required`) or should (`preferred`) stay together."""

    level: TopologyLevel
    mode: TopologyMode = TopologyMode.REQUIRED


@dataclass(frozen=True, slots=True)
class Job:
    """A gang job: `workers` x (`gpus_per_worker` whole GPUs | one `mig_profile` | `gpu_milli`).

    Elastic jobs set `min_workers` < `workers`: the gang is placed whole with any worker count in
    [min_workers, workers], preferring more. A worker never spans nodes.
    """

    id: JobId
    queue: QueueName
    workers: int
    gpus_per_worker: int = 1
    gpu_type: GpuModel | None = None
    gpu_memory_mib: MiB | None = None
    mig_profile: MigProfileName | None = None
    gpu_milli: Milli | None = None
    priority: int = 0
    preemptible: bool = False
    checkpoint_grace_s: Seconds = Seconds(0)
    topology: TopologyConstraint | None = None
    min_workers: int | None = None
    duration_hint_s: Seconds | None = None
    """The submitter's estimate of one run's length."""
    time_limit_s: Seconds | None = None
    """One run's wall-clock limit: the agent stops the job there (``job.failed`` code time_limit)."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"job {self.id}: workers must be >= 1")
        if self.min_workers is not None and not 1 <= self.min_workers <= self.workers:
            raise ValueError(f"job {self.id}: min_workers must be in [1, workers]")
        if self.mig_profile is not None and self.gpu_milli is not None:
            raise ValueError(f"job {self.id}: ask for a MIG profile or a GPU fraction, not both")
        if (self.mig_profile is not None or self.gpu_milli is not None) and self.gpus_per_worker != 1:
            raise ValueError(f"job {self.id}: a MIG or fractional worker takes exactly one GPU")
        if self.gpus_per_worker < 1:
            raise ValueError(f"job {self.id}: gpus_per_worker must be >= 1")
        if self.gpu_milli is not None and not 0 < self.gpu_milli <= FULL_GPU_MILLI:
            raise ValueError(f"job {self.id}: gpu_milli must be in (0, 1000]")

    @property
    def kind(self) -> GpuMode:
        """Which kind of GPU capacity the job consumes."""
        if self.mig_profile is not None:
            return GpuMode.MIG
        if self.gpu_milli is not None:
            return GpuMode.SHARED
        return GpuMode.WHOLE

    @property
    def run_bound_s(self) -> Seconds | None:
        """How long backfill and reservations count on one run lasting: ``min(limit, hint)`` of those
        given. A limit is a bound the job cannot exceed (it is stopped there), so with no hint, or a
        larger one, the limit is the end to plan with; a smaller hint is the better estimate (a job
        ending earlier only frees its GPUs sooner). None: no known end."""
        hint, limit = self.duration_hint_s, self.time_limit_s
        if limit is None or (hint is not None and hint <= limit):
            return hint
        return limit

    @property
    def fewest_workers(self) -> int:
        """The smallest acceptable gang (== workers unless elastic)."""
        return self.min_workers if self.min_workers is not None else self.workers

    @property
    def total_gpus(self) -> int:
        """Whole GPUs at the full worker count (MIG/fractional workers count one device each)."""
        return self.workers * self.gpus_per_worker


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    """Where one rank runs: a node and its GPUs, plus the MIG slot or milli share if any."""

    rank: int
    node: NodeId
    gpus: tuple[GpuId, ...]
    mig: MigSlot | None = None
    milli: Milli | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    """The GPUs a job holds, one placement per rank (ranks 0..n-1)."""

    id: AllocationId
    job_id: JobId
    placements: tuple[WorkerPlacement, ...] = field(default_factory=tuple)

    @property
    def nodes(self) -> tuple[NodeId, ...]:
        """Distinct nodes in rank order."""
        return tuple(dict.fromkeys(p.node for p in self.placements))
