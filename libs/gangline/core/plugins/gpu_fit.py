"""gpu-fit: the job's GPU type, memory and kind (whole / MIG / fractional) must exist.

pre_filter narrows `state.models` to the GPU models that match; an empty set is unresolvable
with a GPU_TYPE or MEMORY reason. filter rejects nodes without a fitting free unit.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.framework.state import CycleState
from gangline.core.framework.status import ReasonCode, Status
from gangline.core.model import FULL_GPU_MILLI, GpuMode, Job
from gangline.core.snapshot import NodeView

NAME = "gpu-fit"


class GpuFit:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def pre_filter(self, state: CycleState, job: Job) -> Status:
        """Narrow to matching models; unresolvable when none matches."""
        snap = state.snapshot
        typed = [m for m in state.models if job.gpu_type is None or snap.models[m] == job.gpu_type]
        if not typed:
            have = ", ".join(snap.models) or "none"
            return Status.unresolvable(
                f"no {job.gpu_type} GPUs in this cluster (models: {have})",
                plugin=NAME,
                code=ReasonCode.GPU_TYPE,
                details={"gpu_type": str(job.gpu_type)},
            )
        sized = [m for m in typed if job.gpu_memory_mib is None or snap.model_memory[m] >= job.gpu_memory_mib]
        if not sized:
            best = max(snap.model_memory[m] for m in typed)
            return Status.unresolvable(
                f"needs {job.gpu_memory_mib} MiB per GPU; the largest matching GPU has {best} MiB",
                plugin=NAME,
                code=ReasonCode.MEMORY,
                details={"needed_mib": int(job.gpu_memory_mib or 0), "largest_mib": best},
            )
        kind = job.kind
        if kind is GpuMode.WHOLE:
            usable = [m for m in sized if snap.capacity[m] > 0]
        elif kind is GpuMode.MIG:
            usable = [m for m in sized if snap.mig_nodes[m]]
        else:
            usable = [m for m in sized if snap.shared_nodes[m]]
        if not usable:
            return Status.unresolvable(
                f"no matching GPU is offered in {kind.value} mode",
                plugin=NAME,
                code=ReasonCode.GPU_TYPE,
                details={"mode": kind.value},
            )
        state.models = tuple(usable)
        return Status.success()

    def filter(self, state: CycleState, job: Job, node: NodeView) -> Status:
        """The node has at least one free unit of the job's kind on a matching model."""
        snap = state.snapshot
        kind = job.kind
        if kind is GpuMode.WHOLE:
            if any(snap.free[m][node.index] >= job.gpus_per_worker for m in state.models):
                return Status.success()
            return Status.unschedulable(
                f"fewer than {job.gpus_per_worker} free matching GPUs on the node",
                plugin=NAME,
                code=ReasonCode.CAPACITY,
            )
        if kind is GpuMode.SHARED:
            need = job.gpu_milli or 0
            for g in snap.node_gpus[node.index]:
                if (
                    snap.gpus[g].mode is GpuMode.SHARED
                    and snap.g_model[g] in state.models
                    and snap.g_usable[g]
                    and FULL_GPU_MILLI - snap.g_milli_used[g] >= need
                ):
                    return Status.success()
            return Status.unschedulable(
                f"no shared GPU on the node has {need} milli free", plugin=NAME, code=ReasonCode.FRACTION
            )
        return Status.success()  # MIG slots are judged by mig-packing
