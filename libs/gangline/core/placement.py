"""The gang placement search: whole-gang candidates from the snapshot's indexes.

Shared by the actions (allocate here; backfill/preempt reuse it). The search never changes the
snapshot: it reads free counts, asks the session's filters about each node it considers, and
returns candidates, each a complete gang (between the job's fewest and most workers), plus
what it learned for explanations.

Where it looks, by job:

* required topology at level L: domains of L holding >= fewest x per-worker free GPUs by
  aggregate, tightest first (best fit); each is filled from its fullest fitting node on;
* preferred topology at level L, or a multi-worker job with none: the same at L (or NODE), then
  each wider level, then the whole cluster, stopping at the first level that yields a candidate
  (so ranks stay as close as the cluster allows; an elastic gang keeps widening while a wider
  level could give it more workers, and the scores choose);
* a single worker with no required topology: the fullest fitting nodes from the free-count
  buckets, in O(candidates), whatever the cluster size.

MIG workers take the (GPU, start) that leaves the most placements possible on that GPU;
fractional workers take the tightest shared GPU that fits (best fit).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from gangline.core.framework.cycle import Session
from gangline.core.framework.state import Candidate, CycleState
from gangline.core.mig import MigProfileName
from gangline.core.model import FULL_GPU_MILLI, GpuMode, Job, MigSlot, TopologyLevel, TopologyMode
from gangline.core.snapshot import Slot, Snapshot


@dataclass(slots=True)
class SearchResult:
    """Candidates found, and the facts an explanation needs when there are none."""

    candidates: list[Candidate] = field(default_factory=list)
    most_workers: int = 0
    """The largest number of workers that fit in any one scope tried (the largest feasible set)."""
    scope: TopologyLevel | None = None
    """The last level searched (None: the whole cluster)."""
    domains_tried: int = 0


def _levels_from(start: TopologyLevel) -> list[TopologyLevel]:
    return [lvl for lvl in TopologyLevel if lvl >= start]


class Search:
    """One job's search in one session (see module docstring)."""

    def __init__(self, session: Session, state: CycleState, job: Job) -> None:
        self.session = session
        self.snap: Snapshot = session.snapshot
        self.state = state
        self.job = job
        self.limit = session.profile.settings.max_candidates
        self.result = SearchResult()

    # ------------------------------------------------------------ per node

    def node_slots(self, m: int, i: int, most: int) -> list[Slot]:
        """Up to `most` worker slots of model `m` on node `i` (none if a filter rejects it)."""
        if most <= 0 or not self.session.node_fits(self.state, self.job, i):
            return []
        kind = self.job.kind
        if kind is GpuMode.WHOLE:
            g = self.job.gpus_per_worker
            n = min(most, self.snap.free[m][i] // g)
            if n <= 0:
                return []
            free = self.snap.free_whole_gpus(i, m)
            return [Slot(i, tuple(free[k * g : (k + 1) * g])) for k in range(n)]
        if kind is GpuMode.MIG:
            assert self.job.mig_profile is not None
            return self._mig_slots(m, i, self.job.mig_profile, most)
        assert self.job.gpu_milli is not None
        return self._milli_slots(m, i, self.job.gpu_milli, most)

    def _mig_slots(self, m: int, i: int, profile: MigProfileName, most: int) -> list[Slot]:
        snap = self.snap
        out: list[Slot] = []
        masks: dict[int, tuple[int, int]] = {}
        for g in snap.node_gpus[i]:
            geo = snap.g_geometry[g]
            if geo is not None and snap.g_model[g] == m and snap.g_usable[g]:
                masks[g] = (snap.g_mig_mask[g], snap.g_mig_compute[g])
        while len(out) < most:
            best: tuple[int, int, int, int] | None = None  # (-left, -used, g, start)
            for g, (mask, compute) in masks.items():
                geo = snap.g_geometry[g]
                assert geo is not None
                prof = geo.profile(profile)
                if prof is None:
                    continue
                for s in geo.free_starts(prof, mask, compute):
                    left = geo.placeable_count(mask | prof.mask_at(s), compute + prof.compute)
                    key = (-left, -bin(mask).count("1"), g, s)
                    if best is None or key < best:
                        best = key
            if best is None:
                break
            _, _, g, s = best
            geo = snap.g_geometry[g]
            assert geo is not None
            prof = geo.profile(profile)
            assert prof is not None
            mask, compute = masks[g]
            masks[g] = (mask | prof.mask_at(s), compute + prof.compute)
            out.append(Slot(i, (g,), mig=MigSlot(profile, s)))
        return out

    def _milli_slots(self, m: int, i: int, milli: int, most: int) -> list[Slot]:
        snap = self.snap
        free: dict[int, int] = {}
        for g in snap.node_gpus[i]:
            if (
                snap.gpus[g].mode is GpuMode.SHARED
                and snap.g_model[g] == m
                and snap.g_usable[g]
                and self.job.id not in snap.g_milli.get(g, {})
            ):
                free[g] = FULL_GPU_MILLI - snap.g_milli_used[g]
        out: list[Slot] = []
        while len(out) < most:
            fits = [(f, g) for g, f in free.items() if f >= milli]
            if not fits:
                break
            _, g = min(fits)
            del free[g]  # one share per job per GPU
            out.append(Slot(i, (g,), milli=milli))
        return out

    # ------------------------------------------------------------ per scope

    def _nodes_for(self, m: int) -> Sequence[int]:
        kind = self.job.kind
        if kind is GpuMode.MIG:
            return self.snap.mig_nodes[m]
        if kind is GpuMode.SHARED:
            return self.snap.shared_nodes[m]
        return ()

    def fill(self, m: int, nodes: Sequence[int]) -> list[Slot]:
        """Slots for up to the job's workers on `nodes`, fullest fitting node first."""
        job, snap = self.job, self.snap
        want = job.workers
        if job.kind is GpuMode.WHOLE:
            g = job.gpus_per_worker
            free = snap.free[m]
            order = sorted((free[i], i) for i in nodes if free[i] >= g)
            nodes = [i for _, i in order]
        slots: list[Slot] = []
        for i in nodes:
            slots.extend(self.node_slots(m, i, want - len(slots)))
            if len(slots) >= want:
                break
        return slots

    def domains(self, level: TopologyLevel, m: int) -> Iterator[int]:
        """Domains of `level` worth opening for this job, most promising first."""
        job, snap = self.job, self.snap
        if job.kind is GpuMode.WHOLE:
            need = job.fewest_workers * job.gpus_per_worker
            if level is TopologyLevel.NODE or (level is TopologyLevel.NVLINK and snap.nvlink_is_node):
                yield from self._bucket_nodes(m, need, as_level=level)
            else:
                yield from snap.domains_with_free(level, m, need)
            return
        seen: dict[int, None] = {}
        for i in self._nodes_for(m):
            seen.setdefault(snap.domain_of(level, i), None)
        yield from seen

    def _bucket_nodes(self, m: int, need: int, as_level: TopologyLevel) -> Iterator[int]:
        snap = self.snap
        buckets = snap.buckets[m]
        for k in range(max(need, 1), len(buckets)):
            for i in buckets[k]:  # the search never mutates the snapshot, so no copy
                yield i if as_level is TopologyLevel.NODE else snap.dom_of[as_level][i]

    def in_domains(self, level: TopologyLevel) -> None:
        """Try domains of one level for every eligible model, until `limit` candidates."""
        res, snap, job = self.result, self.snap, self.job
        res.scope = level
        for m in self.state.models:
            for d in self.domains(level, m):
                res.domains_tried += 1
                members = snap.members(level, d)
                if job.kind is not GpuMode.WHOLE:
                    allowed = set(self._nodes_for(m))
                    members = [i for i in members if i in allowed]
                slots = self.fill(m, members)
                res.most_workers = max(res.most_workers, len(slots))
                if len(slots) >= job.fewest_workers:
                    res.candidates.append(Candidate(m, tuple(slots), level, d))
                    if len(res.candidates) >= self.limit:
                        return

    def single_worker(self) -> None:
        """One worker, no required domain: the fullest fitting nodes, from the buckets."""
        res, job = self.result, self.job
        res.scope = None
        for m in self.state.models:
            if job.kind is GpuMode.WHOLE:
                nodes: Iterator[int] | Sequence[int] = self._bucket_nodes(
                    m, job.gpus_per_worker, TopologyLevel.NODE
                )
            else:
                nodes = self._nodes_for(m)
            for i in nodes:
                res.domains_tried += 1
                slots = self.node_slots(m, i, 1)
                if slots:
                    res.most_workers = 1
                    res.candidates.append(Candidate(m, tuple(slots)))
                    if len(res.candidates) >= self.limit:
                        return

    def whole_cluster(self) -> None:
        """Greedy best fit over every node, for gangs that no single domain can hold."""
        res, snap, job = self.result, self.snap, self.job
        res.scope = None
        for m in self.state.models:
            if job.kind is GpuMode.WHOLE:
                order: list[int] = []
                b = snap.buckets[m]
                for k in range(job.gpus_per_worker, len(b)):
                    order.extend(b[k])
                slots: list[Slot] = []
                for i in order:
                    slots.extend(self.node_slots(m, i, job.workers - len(slots)))
                    if len(slots) >= job.workers:
                        break
            else:
                slots = self.fill(m, self._nodes_for(m))
            res.most_workers = max(res.most_workers, len(slots))
            if len(slots) >= job.fewest_workers:
                res.candidates.append(Candidate(m, tuple(slots)))
                if len(res.candidates) >= self.limit:
                    return

    def run(self) -> SearchResult:
        """Search by the job's topology (see module docstring)."""
        job, state = self.job, self.state
        if state.scope is not None:
            self.in_domains(state.scope)
            return self.result
        topo = job.topology
        if job.workers == 1 and (topo is None or topo.mode is TopologyMode.PREFERRED):
            self.single_worker()
            return self.result
        start = topo.level if topo is not None else TopologyLevel.NODE
        for level in _levels_from(start):
            if level is TopologyLevel.NVLINK and self.snap.nvlink_is_node and start < level:
                continue  # the same domains as NODE, already tried
            self.in_domains(level)
            if any(len(c.slots) == job.workers for c in self.result.candidates):
                return self.result  # an elastic job keeps widening while it could grow
            if len(self.result.candidates) >= self.limit:
                return self.result
        self.whole_cluster()
        return self.result


def whole_workers_fit(snap: Snapshot, models: Sequence[int], per_worker: int) -> int:
    """At most this many workers of `per_worker` whole GPUs fit the free GPUs of `models` (each
    worker on one node): a bound no search can beat, so a gang of more workers has no candidate."""
    if per_worker <= 0:
        return 1 << 30
    n = 0
    for m in models:
        buckets = snap.buckets[m]
        for k in range(per_worker, len(buckets)):
            if buckets[k]:
                n += (k // per_worker) * len(buckets[k])
    return n


def search(session: Session, state: CycleState, job: Job) -> SearchResult:
    """Whole-gang candidates for `job` in the session's working snapshot."""
    return Search(session, state, job).run()
