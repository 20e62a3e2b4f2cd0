"""health: cordoned nodes and unhealthy GPUs are never offered; say so when they block a job.

The snapshot already leaves unusable GPUs out of every free count; this plugin makes the rule
explicit at filter time and explains pending jobs that would fit if the broken capacity were back.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.framework.state import CycleState
from gangline.core.framework.status import ReasonCode, Status
from gangline.core.model import GpuMode, Job
from gangline.core.snapshot import NodeView, most_over

NAME = "health"


class Health:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def pre_filter(self, state: CycleState, job: Job) -> Status:
        """Blocked by health when healthy free GPUs fall short but broken free ones would cover it."""
        if job.kind is not GpuMode.WHOLE:
            return Status.success()
        snap = state.snapshot
        need = job.fewest_workers * job.gpus_per_worker
        free = most_over(snap.total_free, state.models)
        if free >= need:
            return Status.success()
        broken = most_over(snap.free_unusable, state.models)
        if free + broken >= need:
            return Status.unschedulable(
                f"needs {need} GPUs, {free} free and healthy; "
                f"{broken} more are on cordoned nodes or unhealthy",
                plugin=NAME,
                code=ReasonCode.HEALTH,
                details={"needed": need, "free": free, "unusable": broken},
            )
        return Status.success()

    def filter(self, state: CycleState, job: Job, node: NodeView) -> Status:
        """Reject cordoned nodes."""
        if node.cordoned:
            return Status.unschedulable(f"node {node.id} is cordoned", plugin=NAME, code=ReasonCode.HEALTH)
        return Status.success()
