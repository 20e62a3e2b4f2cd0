"""binpack: fragmentation-aware scoring that keeps the largest free blocks intact.

A candidate scores higher when the nodes it uses end up fuller (70%) and when the leaves it uses
are already fuller (30%): small jobs fill holes in busy nodes and leaves, so empty nodes, NVLink
domains and leaves stay whole for big gangs. Shared and MIG GPUs score by how full the GPUs end
up.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.framework.state import Candidate, CycleState
from gangline.core.model import FULL_GPU_MILLI, GpuMode, Job, TopologyLevel

NAME = "binpack"


class Binpack:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        args = args or {}
        node_weight = args.get("node_weight", 70)
        if not isinstance(node_weight, int) or not 0 <= node_weight <= 100:
            raise ValueError("binpack.node_weight must be an integer in 0..100")
        self.node_weight = node_weight

    def score(self, state: CycleState, job: Job, candidate: Candidate) -> int:
        """0..100, higher for tighter packing (see module docstring)."""
        snap = state.snapshot
        kind = job.kind
        if kind is GpuMode.SHARED:
            used: dict[int, int] = {}
            for s in candidate.slots:
                g = s.gpus[0]
                used[g] = used.get(g, snap.g_milli_used[g]) + (s.milli or 0)
            return 100 * sum(used.values()) // (FULL_GPU_MILLI * len(used))
        if kind is GpuMode.MIG:
            masks: dict[int, int] = {}
            for s in candidate.slots:
                g = s.gpus[0]
                geo = snap.g_geometry[g]
                assert geo is not None and s.mig is not None
                prof = geo.profile(s.mig.profile)
                assert prof is not None
                masks[g] = masks.get(g, snap.g_mig_mask[g]) | prof.mask_at(s.mig.start)
            return 100 * sum(bin(v).count("1") for v in masks.values()) // (8 * len(masks))
        m = candidate.model
        free, cap = snap.free[m], snap.node_max_whole
        w = self.node_weight
        if len(candidate.slots) == 1:  # the common case, without the dicts
            s = candidate.slots[0]
            i, t = s.node, len(s.gpus)
            d = snap.dom_of[TopologyLevel.LEAF][i]
            lf, lc = snap.dom_free[TopologyLevel.LEAF][m][d], snap.dom_capacity[TopologyLevel.LEAF][m][d]
            return round(w * (1 - (free[i] - t) / cap[i]) + (100 - w) * (1 - (lf - t) / lc))
        taken: dict[int, int] = {}
        for s in candidate.slots:
            taken[s.node] = taken.get(s.node, 0) + len(s.gpus)
        node_term = sum(1 - (free[i] - t) / cap[i] for i, t in taken.items()) / len(taken)
        leaf_of = snap.dom_of[TopologyLevel.LEAF]
        leaf_taken: dict[int, int] = {}
        for i, t in taken.items():
            leaf_taken[leaf_of[i]] = leaf_taken.get(leaf_of[i], 0) + t
        leaf_free = snap.dom_free[TopologyLevel.LEAF][m]
        leaf_cap = snap.dom_capacity[TopologyLevel.LEAF][m]
        leaf_term = sum(1 - (leaf_free[d] - t) / leaf_cap[d] for d, t in leaf_taken.items()) / len(leaf_taken)
        return round(w * node_term + (100 - w) * leaf_term)
