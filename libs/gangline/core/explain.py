"""Explanations for jobs the search could not place: one reason per blocking constraint.

Pre-filters explain what aggregates already show; this module explains what only the search
saw: the largest feasible set versus the gang size, fragmentation at worker granularity ("24 GPUs
free, none 8 on one node") and the nodes filters rejected, counted by plugin and cause.
"""

from __future__ import annotations

from gangline.core.framework.cycle import FILTER_REJECTIONS
from gangline.core.framework.state import CycleState
from gangline.core.framework.status import Reason, ReasonCode, Status, StatusCode
from gangline.core.model import GpuMode, Job, TopologyLevel
from gangline.core.placement import SearchResult

NAME = "allocate"


def _where(level: TopologyLevel | None) -> str:
    if level is None:
        return "the cluster"
    return "one NVLink domain" if level is TopologyLevel.NVLINK else f"one {level.label}"


def explain_unplaced(state: CycleState, job: Job, result: SearchResult) -> Status:
    """Why no whole-gang candidate exists for `job` (an UNSCHEDULABLE status with reasons)."""
    snap = state.snapshot
    reasons: list[Reason] = []
    fewest = job.fewest_workers
    per = (
        f"{job.gpus_per_worker} GPU(s)"
        if job.kind is GpuMode.WHOLE
        else (f"a {job.mig_profile} slice" if job.kind is GpuMode.MIG else f"{job.gpu_milli} milli")
    )
    where = _where(result.scope)
    reasons.append(
        Reason(
            ReasonCode.GANG_SIZE,
            NAME,
            f"needs {fewest} worker(s) x {per} in {where}; at most {result.most_workers} fit",
            {"needed_workers": fewest, "largest_feasible": result.most_workers, "scope": where},
        )
    )
    if job.kind is GpuMode.WHOLE and state.models:
        g = job.gpus_per_worker
        m = max(state.models, key=lambda m: snap.total_free[m])
        free = snap.total_free[m]
        largest_node = snap.largest_free_domain(TopologyLevel.NODE, m)
        if free >= fewest * g and largest_node < g:
            reasons.append(
                Reason(
                    ReasonCode.FRAGMENTATION,
                    NAME,
                    f"{free} GPUs free, none {g} on one node (largest free: {largest_node})",
                    {"free": free, "per_worker": g, "largest_free_node": largest_node},
                )
            )
        elif free >= fewest * g:
            reasons.append(
                Reason(
                    ReasonCode.FRAGMENTATION,
                    NAME,
                    f"{free} GPUs free, but not {fewest} x {g} together in {where}",
                    {"free": free, "per_worker": g, "needed_workers": fewest},
                )
            )
    tally = state.read(FILTER_REJECTIONS) or {}
    for (plugin, code), (count, first) in sorted(tally.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
        reasons.append(Reason(code, plugin, f"{count} node(s) rejected: {first.message}", {"nodes": count}))
    return Status(StatusCode.UNSCHEDULABLE, tuple(reasons))
