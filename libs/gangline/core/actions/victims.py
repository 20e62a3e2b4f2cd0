"""Victim search: the cheapest set of running jobs whose GPUs, once freed, let a job be placed.

Shared by the preempt, reclaim, reserve and elastic-shrink actions. The actions decide *who may*
be a victim (priority, quota, preemptible, minimum runtime); this module decides *who is*:

* the placement must really fit the preemptor — gang, topology, GPU type, MIG — so every
  candidate set is confirmed by the placement search itself (``place``) on the snapshot with the
  victims released, never by counting GPUs alone;
* among sets that fit, the fewest GPU-hours lost since each victim's last checkpoint;
* never more victims than needed: the set is *minimal*, no victim can be spared.

How. When the job needs one topology domain, each domain at that level is a separate search scope;
otherwise the whole cluster is one. In a scope, for whole-GPU workers, each node offers steps
"free k more workers here for this many GPU-hours" (its victims cheapest per GPU first); the
cheapest steps per worker are taken until the gang could fit by count. The ``2 x MAX_SCOPES``
scopes with the best lower bound (fractional knapsack on lost GPU-hours per freed GPU) get that
estimate; the best ``MAX_SCOPES`` estimates are confirmed, skipping any whose lower bound cannot
beat the best set found — so "fewest GPU-hours" is a good heuristic, not a proven optimum. To
confirm, inside one snapshot savepoint: the chosen victims are released, ``place`` confirms (more
victims are added in cost order if it does not), and each victim, most expensive first, is put
back if the job still fits without it. Each step is one grant or release and at most one
placement search, so a 64-GPU gang on a full 1,000-node cluster costs a few dozen searches, not
thousands.

Everything is rolled back before returning: the snapshot is left exactly as it was.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from gangline.core.framework.state import Candidate
from gangline.core.model import GpuMode, Job, JobId, TopologyLevel, TopologyMode
from gangline.core.snapshot import RunningJob, Snapshot

MAX_SCOPES = 4
"""Topology domains whose victim sets are confirmed by placement per search (best estimates first)."""

Place = Callable[[Job], Candidate | None]
"""Find a whole-gang placement for the job on the snapshot as it is now (None when none fits)."""
Admissible = Callable[[frozenset[JobId], Candidate], bool]
"""Extra check on a victim set and the placement it allows, e.g. "the preemptor's queue admits it
once these are released". Called while the victims are released in the snapshot: read what they
hold from a copy of ``snapshot.running`` taken before the search."""


@dataclass(frozen=True, slots=True)
class VictimCandidate:
    """A running job that may be preempted, and what preempting it costs."""

    job_id: JobId
    lost_gpu_hours: float
    """GPU-hours of work since its last checkpoint (or start) that preemption throws away."""
    gpus_by_node: tuple[tuple[int, int], ...]
    """(node index, whole GPUs it frees there), for the counting bound; MIG/shares count 0."""
    rank: tuple[int | str | float, ...] = ()
    """Tie-break after cost (e.g. lower priority first); the job id breaks the last tie."""
    keep_workers: int | None = None
    """An elastic shrink: ranks from this one on are released, the others keep running."""
    gpus: int = -1
    """Whole GPUs it frees, over all nodes; computed from ``gpus_by_node`` when not given."""

    def __post_init__(self) -> None:
        if self.gpus < 0:
            object.__setattr__(self, "gpus", sum(n for _, n in self.gpus_by_node))


@dataclass(frozen=True, slots=True)
class VictimSet:
    """A minimal set of victims and the placement the job gets once they are gone."""

    victims: tuple[VictimCandidate, ...]
    placement: Candidate
    lost_gpu_hours: float
    scope: str
    """Which domain the search settled in ("cluster" when the job needs none)."""


@contextmanager
def what_if(snapshot: Snapshot) -> Iterator[Snapshot]:
    """Changes made inside are undone on exit, whether or not a cycle transaction is open."""
    if snapshot.in_transaction:
        mark = snapshot.savepoint()
        try:
            yield snapshot
        finally:
            snapshot.rollback_to(mark)
    else:
        with snapshot.transaction() as snap:
            yield snap


def restore(snapshot: Snapshot, victim: VictimCandidate, running: RunningJob) -> bool:
    """Undo `release` for one victim (inside the same savepoint); False if it cannot be put back."""
    if victim.keep_workers is None:
        return snapshot.grant(running.job, running.allocation).ok
    slots = snapshot.slots_of(running.allocation)
    assert not isinstance(slots, str)
    for s in slots[victim.keep_workers :]:
        if snapshot.slot_conflict(running.job, s) is not None:
            return False
        snapshot.take(running.job, s)
    return True


def release(snapshot: Snapshot, victim: VictimCandidate) -> None:
    """Free what the victim gives up: the whole job, or the ranks an elastic shrink drops."""
    if victim.keep_workers is None:
        snapshot.release(victim.job_id)
        return
    running = snapshot.running[victim.job_id]
    slots = snapshot.slots_of(running.allocation)
    assert not isinstance(slots, str)
    for s in slots[victim.keep_workers :]:
        snapshot.give_back(victim.job_id, s)


def _sort_key(v: VictimCandidate) -> tuple[float, float, tuple[int | str | float, ...], str]:
    gpus = max(v.gpus, 1)
    return (v.lost_gpu_hours / gpus, v.lost_gpu_hours, v.rank, v.job_id)


def _models_for(snapshot: Snapshot, job: Job) -> list[int]:
    if job.gpu_type is None:
        return list(range(len(snapshot.models)))
    m = snapshot.model_pos.get(job.gpu_type)
    return [] if m is None else [m]


def _scopes(snapshot: Snapshot, job: Job, models: Sequence[int]) -> list[tuple[str, Sequence[int]]]:
    topo = job.topology
    if topo is None or topo.mode is not TopologyMode.REQUIRED:
        return [("cluster", range(len(snapshot.nodes)))]
    level = topo.level
    if level is TopologyLevel.NVLINK and snapshot.nvlink_is_node:
        level = TopologyLevel.NODE
    need = job.fewest_workers * job.gpus_per_worker if job.kind is GpuMode.WHOLE else 0
    out: list[tuple[str, Sequence[int]]] = []
    for d in range(snapshot.domain_count(level)):
        if need and max((snapshot.capacity_of_domain(level, m, d) for m in models), default=0) < need:
            continue
        out.append((f"{level.label} {snapshot.domain_name(level, d)}", snapshot.members(level, d)))
    return out


def _lower_bound(victims: Sequence[VictimCandidate], in_scope: set[int] | None, deficit: int) -> float:
    """Fractional-knapsack bound on the GPU-hours lost to free ``deficit`` GPUs from ``victims``."""
    if deficit <= 0:
        return 0.0
    cost = 0.0
    for v in victims:  # sorted by cost per GPU
        g = v.gpus if in_scope is None else sum(n for i, n in v.gpus_by_node if i in in_scope)
        if g <= 0:
            continue
        take = min(g, deficit)
        cost += v.lost_gpu_hours * take / g
        deficit -= take
        if deficit <= 0:
            return cost
    return float("inf")


class _Bound:
    """How many workers of ``per_worker`` GPUs the scope's nodes could host if victims were freed."""

    def __init__(
        self, snapshot: Snapshot, models: Sequence[int], nodes: Sequence[int], per_worker: int
    ) -> None:
        self.per_worker = per_worker
        self.free: dict[int, int] = {}
        self.fits_now = 0
        for i in nodes:
            if snapshot.node_cordoned[i]:
                continue
            f = sum(snapshot.free[m][i] for m in models)
            self.free[i] = f
            self.fits_now += f // per_worker

    def add(self, v: VictimCandidate, sign: int) -> None:
        for i, n in v.gpus_by_node:
            f = self.free.get(i)
            if f is None:
                continue
            before = f // self.per_worker
            f += sign * n
            self.free[i] = f
            self.fits_now += f // self.per_worker - before


def _node_steps(bound: _Bound, vs: Sequence[VictimCandidate], workers: int) -> list[VictimCandidate] | None:
    """Cheapest victims, node by node, until ``workers`` whole workers could fit by count."""
    per = bound.per_worker
    on_node: dict[int, list[tuple[float, str, int, VictimCandidate]]] = {}
    for v in vs:
        for i, n in v.gpus_by_node:
            if i in bound.free and n > 0:
                on_node.setdefault(i, []).append((v.lost_gpu_hours / n, v.job_id, n, v))
    # Steps per node: (cost of the step, workers it adds, victims it takes).
    steps: dict[int, list[tuple[float, int, list[VictimCandidate]]]] = {}
    for i in sorted(on_node):
        free = bound.free[i]
        cost, taken, have = 0.0, [], free // per
        out: list[tuple[float, int, list[VictimCandidate]]] = []
        for _, _, n, v in sorted(on_node[i], key=lambda t: (t[0], t[1])):
            free += n
            cost += v.lost_gpu_hours
            taken.append(v)
            if free // per > have:
                out.append((cost, free // per - have, taken))
                have, cost, taken = free // per, 0.0, []
        if out:
            steps[i] = out
    need = workers - bound.fits_now
    chosen: dict[JobId, VictimCandidate] = {}
    heap = [(c / k, i, 0) for i, lst in steps.items() for c, k, _ in lst[:1]]
    heapq.heapify(heap)
    while need > 0 and heap:
        _, i, k = heapq.heappop(heap)
        cost, added, taken = steps[i][k]
        for v in taken:
            chosen.setdefault(v.job_id, v)
        need -= added
        if k + 1 < len(steps[i]):
            c2, a2, _ = steps[i][k + 1]
            heapq.heappush(heap, (c2 / a2, i, k + 1))
    if need > 0:
        return None
    return sorted(chosen.values(), key=_sort_key)


def find_victims(
    snapshot: Snapshot,
    job: Job,
    candidates: Sequence[VictimCandidate],
    place: Place,
    *,
    admissible: Admissible | None = None,
) -> VictimSet | None:
    """The cheapest minimal victim set that lets ``job`` be placed, or None when no set does.

    ``candidates`` must already be filtered to jobs that may be preempted for ``job``. The snapshot
    is left exactly as it was.
    """
    if not candidates:
        return None
    models = _models_for(snapshot, job)
    whole = job.kind is GpuMode.WHOLE
    workers = job.fewest_workers
    scopes = _scopes(snapshot, job, models)
    ordered = sorted(candidates, key=_sort_key)
    per_scope: list[list[VictimCandidate]] = [[] for _ in scopes]
    if len(scopes) == 1 or not whole:
        per_scope = [list(ordered) for _ in scopes]
    else:
        scope_of: dict[int, int] = {i: k for k, (_, nodes) in enumerate(scopes) for i in nodes}
        for v in ordered:
            hit = {scope_of[i] for i, _ in v.gpus_by_node if i in scope_of}
            for k in sorted(hit):
                per_scope[k].append(v)
    bounded: list[tuple[float, str, Sequence[int], list[VictimCandidate]]] = []
    for (name, nodes), vs in zip(scopes, per_scope, strict=True):
        if not vs:
            continue
        bound = 0.0
        if whole:
            in_scope = set(nodes) if len(scopes) > 1 else None
            free = sum(snapshot.free[m][i] for m in models for i in nodes if not snapshot.node_cordoned[i])
            bound = _lower_bound(vs, in_scope, workers * job.gpus_per_worker - free)
            if bound == float("inf"):
                continue
        bounded.append((bound, name, nodes, vs))
    bounded.sort(key=lambda t: (t[0], t[1]))
    ranked: list[tuple[float, float, str, Sequence[int], list[VictimCandidate], list[VictimCandidate]]] = []
    for bound, name, nodes, vs in bounded[: 2 * MAX_SCOPES]:
        first: list[VictimCandidate] = []
        if whole:
            steps = _node_steps(_Bound(snapshot, models, nodes, job.gpus_per_worker), vs, workers)
            if steps is None:
                continue
            first = steps
        ranked.append((sum(v.lost_gpu_hours for v in first), bound, name, nodes, vs, first))
    # Best estimate first; at most MAX_SCOPES scopes are confirmed, and none whose bound cannot win.
    ranked.sort(key=lambda t: (t[0], t[1], t[2]))
    running = dict(snapshot.running)
    best: VictimSet | None = None
    for _, bound, name, nodes, vs, first in ranked[:MAX_SCOPES]:
        if best is not None and bound >= best.lost_gpu_hours:
            continue
        found = _search_scope(snapshot, job, vs, first, place, admissible, models, nodes, running)
        if found is None:
            continue
        chosen, placement = found
        lost = sum(v.lost_gpu_hours for v in chosen)
        if best is None or (lost, len(chosen), name) < (best.lost_gpu_hours, len(best.victims), best.scope):
            best = VictimSet(tuple(chosen), placement, lost, name)
    return best


def _search_scope(
    snapshot: Snapshot,
    job: Job,
    vs: Sequence[VictimCandidate],
    first: Sequence[VictimCandidate],
    place: Place,
    admissible: Admissible | None,
    models: Sequence[int],
    nodes: Sequence[int],
    running: dict[JobId, RunningJob],
) -> tuple[list[VictimCandidate], Candidate] | None:
    whole = job.kind is GpuMode.WHOLE
    workers = job.fewest_workers
    bound = _Bound(snapshot, models, nodes, job.gpus_per_worker) if whole else None

    def fits(chosen: Sequence[VictimCandidate]) -> Candidate | None:
        got = place(job)
        if (
            got is not None
            and admissible is not None
            and not admissible(frozenset(v.job_id for v in chosen), got)
        ):
            return None
        return got

    with what_if(snapshot):
        chosen: list[VictimCandidate] = []
        for v in first:
            release(snapshot, v)
            chosen.append(v)
            if bound is not None:
                bound.add(v, +1)
        placement = fits(chosen) if chosen else None
        if placement is None:
            # Counting was not enough (topology, filters, quota): add victims in cost order.
            taken = {v.job_id for v in chosen}
            for v in vs:
                if v.job_id in taken:
                    continue
                release(snapshot, v)
                chosen.append(v)
                if bound is not None:
                    bound.add(v, +1)
                    if bound.fits_now < workers:
                        continue
                placement = fits(chosen)
                if placement is not None:
                    break
        if placement is None:
            return None
        # Spare every victim the job can do without, the most expensive first.
        for v in sorted(chosen, key=lambda v: (-v.lost_gpu_hours, v.job_id)):
            if bound is not None:
                bound.add(v, -1)
                if bound.fits_now < workers:
                    bound.add(v, +1)
                    continue
            mark = snapshot.savepoint()
            rest = [c for c in chosen if c.job_id != v.job_id]
            got = fits(rest) if rest and restore(snapshot, v, running[v.job_id]) else None
            if got is not None:
                chosen, placement = rest, got
            else:
                snapshot.rollback_to(mark)
                if bound is not None:
                    bound.add(v, +1)
        return chosen, placement
