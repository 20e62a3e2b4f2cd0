"""Declarative scheduling scenarios: clusters in, jobs in, decisions out (STYLE.md habit 10).

    scenario(nodes={"n0": gpus(8)}, jobs=[job("j1", gpus=4)]).expect(placed={"j1": "n0"})

* `gpus(n, ...)` describes one node (model, memory, mode, topology labels, health);
* `fabric(spines=, leaves_per_spine=, nodes_per_leaf=, ...)` a regular cluster of such nodes;
* `job(...)` a job; `held(job, {"n0": 4})` a job already running on those nodes;
* `scenario(...)` runs one cycle lazily with the default profile (or `profile=`) and offers
  `.expect(placed=..., pending=...)`, `.nodes_of(job)`, `.reasons(job)`, `.plan`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import run_cycle
from gangline.core.framework.plan import Plan
from gangline.core.framework.profile import Profile
from gangline.core.framework.status import Reason, ReasonCode
from gangline.core.mig import MigProfileName
from gangline.core.model import (
    Allocation,
    AllocationId,
    DomainId,
    Gpu,
    GpuId,
    GpuMode,
    GpuModel,
    Job,
    JobId,
    MiB,
    Milli,
    Node,
    NodeId,
    QueueName,
    TopologyConstraint,
    TopologyLevel,
    TopologyMode,
    WorkerPlacement,
)
from gangline.core.snapshot import Snapshot

MEMORY = {"A100-40GB": 40960, "A100-80GB": 81920, "H100-80GB": 81920, "H200-141GB": 144384}


@dataclass(frozen=True)
class NodeSpec:
    """One node before it has an id."""

    count: int
    model: str = "H100-80GB"
    memory_mib: int | None = None
    mode: GpuMode = GpuMode.WHOLE
    unhealthy: tuple[int, ...] = ()
    leaf: str = "leaf0"
    spine: str = "spine0"
    nvlink: str | None = None
    cordoned: bool = False

    def build(self, node_id: str) -> Node:
        """The model node."""
        mem = self.memory_mib or MEMORY.get(self.model, 81920)
        return Node(
            id=NodeId(node_id),
            gpus=tuple(
                Gpu(
                    id=GpuId(f"{node_id}-g{i}"),
                    index=i,
                    model=GpuModel(self.model),
                    memory_mib=MiB(mem),
                    healthy=i not in self.unhealthy,
                    mode=self.mode,
                )
                for i in range(self.count)
            ),
            leaf=DomainId(self.leaf),
            spine=DomainId(self.spine),
            nvlink_domain=DomainId(self.nvlink) if self.nvlink else None,
            cordoned=self.cordoned,
        )


def gpus(
    count: int,
    *,
    model: str = "H100-80GB",
    memory_mib: int | None = None,
    mode: str = "whole",
    unhealthy: Iterable[int] = (),
    leaf: str = "leaf0",
    spine: str = "spine0",
    nvlink: str | None = None,
    cordoned: bool = False,
) -> NodeSpec:
    """A node with `count` GPUs (see NodeSpec)."""
    return NodeSpec(count, model, memory_mib, GpuMode(mode), tuple(unhealthy), leaf, spine, nvlink, cordoned)


def fabric(
    *,
    spines: int = 1,
    leaves_per_spine: int = 1,
    nodes_per_leaf: int = 4,
    gpus_per_node: int = 8,
    model: str = "H100-80GB",
    prefix: str = "n",
) -> dict[str, NodeSpec]:
    """A regular fat tree: node ids `n<spine>-<leaf>-<k>`, leaves `s<spine>l<leaf>`."""
    out: dict[str, NodeSpec] = {}
    for s in range(spines):
        for lf in range(leaves_per_spine):
            for k in range(nodes_per_leaf):
                out[f"{prefix}{s}-{lf}-{k}"] = gpus(
                    gpus_per_node, model=model, leaf=f"s{s}l{lf}", spine=f"s{s}"
                )
    return out


def job(
    job_id: str,
    gpus: int = 1,
    workers: int = 1,
    *,
    gpu_type: str | None = None,
    memory_mib: int | None = None,
    mig: str | None = None,
    milli: int | None = None,
    topology: str | None = None,
    min_workers: int | None = None,
    priority: int = 0,
    queue: str = "default",
    preemptible: bool = False,
) -> Job:
    """A job; `topology` is `"<level>"` (required) or `"<level>:preferred"`."""
    topo = None
    if topology is not None:
        level, _, mode = topology.partition(":")
        topo = TopologyConstraint(TopologyLevel.parse(level), TopologyMode(mode or "required"))
    return Job(
        id=JobId(job_id),
        queue=QueueName(queue),
        workers=workers,
        gpus_per_worker=gpus,
        gpu_type=GpuModel(gpu_type) if gpu_type else None,
        gpu_memory_mib=MiB(memory_mib) if memory_mib else None,
        mig_profile=MigProfileName(mig) if mig else None,
        gpu_milli=Milli(milli) if milli else None,
        priority=priority,
        preemptible=preemptible,
        topology=topo,
        min_workers=min_workers,
    )


@dataclass(frozen=True)
class Held:
    """A job already running: `on` maps node id → GPU indexes (or a count of the first free)."""

    job: Job
    on: Mapping[str, Sequence[int] | int]


def held(j: Job, on: Mapping[str, Sequence[int] | int]) -> Held:
    """`j` running with one worker per listed node."""
    return Held(j, on)


def build_snapshot(nodes: Mapping[str, NodeSpec], running: Sequence[Held] = ()) -> Snapshot:
    """A snapshot of the described cluster with the held jobs granted."""
    snap = Snapshot.build([spec.build(nid) for nid, spec in nodes.items()])
    for h in running:
        placements = []
        for rank, (nid, gs) in enumerate(h.on.items()):
            if isinstance(gs, int):
                i = snap.node_pos[NodeId(nid)]
                gs = [snap.gpus[g].index for g in snap.node_gpus[i] if snap.g_owner[g] is None][:gs]
            placements.append(WorkerPlacement(rank, NodeId(nid), tuple(GpuId(f"{nid}-g{k}") for k in gs)))
        st = snap.grant(h.job, Allocation(AllocationId(f"{h.job.id}.c0"), h.job.id, tuple(placements)))
        assert st.ok, st.message
    return snap


@dataclass
class Scenario:
    """A cluster, jobs and a profile; the plan is computed on first use."""

    snapshot: Snapshot
    jobs: Sequence[Job]
    profile: Profile
    cycle: int = 1
    _plan: Plan | None = field(default=None, init=False)

    @property
    def plan(self) -> Plan:
        """The plan of one cycle (computed once)."""
        if self._plan is None:
            self._plan = run_cycle(self.snapshot, self.jobs, self.profile, cycle=self.cycle)
        return self._plan

    def nodes_of(self, job_id: str) -> list[str]:
        """Node of each rank of a placed job."""
        p = self.plan.placed_job(JobId(job_id))
        assert p is not None, f"{job_id} not placed: {self.reasons(job_id)}"
        return [w.node for w in p.allocation.placements]

    def reasons(self, job_id: str) -> list[Reason]:
        """Reasons a job is pending (empty if placed)."""
        p = self.plan.pending_job(JobId(job_id))
        return list(p.reasons) if p else []

    def codes(self, job_id: str) -> set[ReasonCode]:
        """Reason codes a job is pending for."""
        return {r.code for r in self.reasons(job_id)}

    def expect(
        self,
        *,
        placed: Mapping[str, str | Sequence[str] | set[str]] | Iterable[str] = (),
        pending: Iterable[str] = (),
    ) -> Scenario:
        """Assert placements (job → node, rank-ordered node list, or set of nodes) and pendings."""
        items = placed.items() if isinstance(placed, Mapping) else [(j, None) for j in placed]
        for job_id, where in items:
            nodes = self.nodes_of(job_id)
            if isinstance(where, str):
                assert set(nodes) == {where}, f"{job_id} on {nodes}, expected {where}"
            elif isinstance(where, set):
                assert set(nodes) == where, f"{job_id} on {sorted(set(nodes))}, expected {sorted(where)}"
            elif where is not None:
                assert nodes == list(where), f"{job_id} on {nodes}, expected {list(where)}"
        for job_id in pending:
            assert self.plan.placed_job(JobId(job_id)) is None, f"{job_id} was placed"
            assert self.plan.pending_job(JobId(job_id)) is not None, f"{job_id} has no pending record"
        return self


def scenario(
    *,
    nodes: Mapping[str, NodeSpec],
    jobs: Sequence[Job],
    running: Sequence[Held] = (),
    profile: Profile | None = None,
    cycle: int = 1,
) -> Scenario:
    """A scenario over a fresh snapshot (see module docstring)."""
    return Scenario(build_snapshot(nodes, running), jobs, profile or default_profile(), cycle)
