"""mig-packing: MIG slices only where the geometry allows, placed to keep big profiles placeable.

pre_filter narrows `state.models` to GPUs whose geometry offers the profile (else unresolvable).
filter rejects nodes with no free valid start for the profile. score: the share of weighted
placements (bigger profiles weigh more) the GPUs keep after the candidate's slices, so a 1g slice
goes to slice 6 of a fresh A100 (keeping 4g.20gb placeable), not to slice 0.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.framework.state import Candidate, CycleState
from gangline.core.framework.status import ReasonCode, Status
from gangline.core.mig import mig_geometry
from gangline.core.model import GpuMode, Job
from gangline.core.snapshot import NodeView

NAME = "mig-packing"


class MigPacking:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def pre_filter(self, state: CycleState, job: Job) -> Status:
        """Only GPU models whose MIG geometry offers the profile."""
        if job.kind is not GpuMode.MIG:
            return Status.success()
        snap = state.snapshot
        ok: list[int] = []
        offered: set[str] = set()
        for m in state.models:
            geo = mig_geometry(snap.models[m], snap.model_memory[m])
            if geo is None or not snap.mig_nodes[m]:
                continue
            offered.update(p.name for p in geo.profiles)
            if geo.profile(str(job.mig_profile)) is not None:
                ok.append(m)
        if not ok:
            have = ", ".join(sorted(offered)) or "none"
            return Status.unresolvable(
                f"no MIG GPU offers profile {job.mig_profile} (offered: {have})",
                plugin=NAME,
                code=ReasonCode.MIG_PROFILE,
                details={"profile": str(job.mig_profile)},
            )
        state.models = tuple(ok)
        return Status.success()

    def filter(self, state: CycleState, job: Job, node: NodeView) -> Status:
        """The node has a usable MIG GPU with a free valid start for the profile."""
        if job.kind is not GpuMode.MIG:
            return Status.success()
        snap = state.snapshot
        for g in snap.node_gpus[node.index]:
            geo = snap.g_geometry[g]
            if geo is None or not snap.g_usable[g] or snap.g_model[g] not in state.models:
                continue
            prof = geo.profile(str(job.mig_profile))
            if prof is not None and geo.free_starts(prof, snap.g_mig_mask[g], snap.g_mig_compute[g]):
                return Status.success()
        return Status.unschedulable(
            f"no free valid position for {job.mig_profile} on node {node.id}",
            plugin=NAME,
            code=ReasonCode.MIG_PROFILE,
        )

    def score(self, state: CycleState, job: Job, candidate: Candidate) -> int:
        """Share of weighted MIG placements kept on the GPUs used (100 for non-MIG jobs)."""
        if job.kind is not GpuMode.MIG:
            return 100
        snap = state.snapshot
        after: dict[int, tuple[int, int]] = {}
        for s in candidate.slots:
            g = s.gpus[0]
            geo = snap.g_geometry[g]
            assert geo is not None and s.mig is not None
            prof = geo.profile(s.mig.profile)
            assert prof is not None
            mask, compute = after.get(g, (snap.g_mig_mask[g], snap.g_mig_compute[g]))
            after[g] = (mask | prof.mask_at(s.mig.start), compute + prof.compute)
        kept = total = 0
        for g, (mask, compute) in after.items():
            geo = snap.g_geometry[g]
            assert geo is not None
            kept += geo.placeable_count(mask, compute)
            total += geo.placeable_count(0, 0)
        return 100 * kept // total if total else 0
