"""topology: required keeps every rank in one domain of the level; preferred scores closeness.

pre_filter (required): sets `state.scope` and checks, by aggregate, that some domain of the level
could hold the gang: never (UNRESOLVABLE, TOPOLOGY), not now though enough GPUs are free
elsewhere (FRAGMENTATION: "24 GPUs free, none 8 in one nvlink domain"), or not now.
score: 100 when all ranks share a node, 85 an NVLink domain, 60 a leaf, 30 a spine, else 0.
permit (required): every rank really is inside one domain of the level.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.framework.state import Candidate, CycleState
from gangline.core.framework.status import ReasonCode, Status
from gangline.core.model import GpuMode, Job, TopologyLevel, TopologyMode

NAME = "topology"

CLOSENESS: dict[TopologyLevel | None, int] = {
    TopologyLevel.NODE: 100,
    TopologyLevel.NVLINK: 85,
    TopologyLevel.LEAF: 60,
    TopologyLevel.SPINE: 30,
    None: 0,
}


def tightest_level(state: CycleState, candidate: Candidate) -> TopologyLevel | None:
    """The smallest level with one domain holding every rank of the candidate."""
    if len(candidate.slots) == 1:
        return TopologyLevel.NODE
    snap = state.snapshot
    nodes = candidate.nodes
    for level in TopologyLevel:
        first = snap.domain_of(level, nodes[0])
        if all(snap.domain_of(level, i) == first for i in nodes):
            return level
    return None


class Topology:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def pre_filter(self, state: CycleState, job: Job) -> Status:
        """Set the required scope and check domain aggregates."""
        topo = job.topology
        if topo is None or topo.mode is not TopologyMode.REQUIRED:
            return Status.success()
        state.scope = topo.level
        if job.kind is not GpuMode.WHOLE:
            return Status.success()
        snap, level = state.snapshot, topo.level
        need = job.fewest_workers * job.gpus_per_worker
        best_largest = best_capacity = best_free = 0
        for m in state.models:
            largest = snap.largest_free_domain(level, m)
            if largest >= need:
                return Status.success()
            best_largest = max(best_largest, largest)
            best_free = max(best_free, snap.total_free[m])
            n = snap.domain_count(level)
            best_capacity = max(
                best_capacity, max((snap.capacity_of_domain(level, m, d) for d in range(n)), default=0)
            )
        where = level.label if level is not TopologyLevel.NVLINK else "NVLink domain"
        details: dict[str, int | str] = {
            "level": level.label,
            "needed": need,
            "largest_free_domain": best_largest,
            "free": best_free,
        }
        if best_capacity < need:
            details["largest_domain"] = best_capacity
            return Status.unresolvable(
                f"needs {need} GPUs in one {where}; the largest {where} has {best_capacity}",
                plugin=NAME,
                code=ReasonCode.TOPOLOGY,
                details=details,
            )
        if best_free >= need:
            return Status.unschedulable(
                f"{best_free} GPUs free, none {need} in one {where} (largest free: {best_largest})",
                plugin=NAME,
                code=ReasonCode.FRAGMENTATION,
                details=details,
            )
        return Status.unschedulable(
            f"needs {need} GPUs in one {where}; the most free in one is {best_largest}",
            plugin=NAME,
            code=ReasonCode.TOPOLOGY,
            details=details,
        )

    def score(self, state: CycleState, job: Job, candidate: Candidate) -> int:
        """Closeness of the ranks (see module docstring)."""
        return CLOSENESS[tightest_level(state, candidate)]

    def permit(self, state: CycleState, job: Job, candidate: Candidate) -> Status:
        """A required topology really holds."""
        topo = job.topology
        if topo is None or topo.mode is not TopologyMode.REQUIRED:
            return Status.success()
        level = tightest_level(state, candidate)
        if level is not None and level <= topo.level:
            return Status.success()
        return Status.unschedulable(
            f"ranks span more than one {topo.level.label}", plugin=NAME, code=ReasonCode.TOPOLOGY
        )
