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

Cost. A search sees every eligible running job (thousands on a full 1,000-node cluster), so the
candidates are held as a `VictimPool`: columns sorted once by cost, the search works on row numbers
(ordering a subset is sorting ints), and a `VictimCandidate` is made only for the victims chosen.
Callers with the jobs at hand build the rows directly (`VictimPool.whole_jobs`, the preempt path);
`find_victims` takes candidate objects and gives the same answer.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter

from gangline.core.framework.state import Candidate
from gangline.core.model import GpuMode, Job, JobId, TopologyLevel, TopologyMode
from gangline.core.snapshot import RunningJob, Snapshot

NodeGpus = tuple[tuple[int, int], ...]
"""(node index, whole GPUs) pairs."""
Rank = tuple[int | str | float, ...]
WholeJob = tuple[float, float, Rank, JobId, NodeGpus, int]
"""A whole job as a `VictimPool` row: (lost GPU-hours / max(1, freed GPUs), lost GPU-hours, rank,
job id, GPUs by node, freed GPUs); the first four are `_sort_key`, so rows sort cheapest first."""

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
    gpus_by_node: NodeGpus
    """(node index, whole GPUs it frees there), for the counting bound; MIG/shares count 0."""
    rank: Rank = ()
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


def _release(snapshot: Snapshot, job_id: JobId, keep_workers: int | None) -> None:
    if keep_workers is None:
        snapshot.release(job_id)
        return
    running = snapshot.running[job_id]
    slots = snapshot.slots_of(running.allocation)
    assert not isinstance(slots, str)
    for s in slots[keep_workers:]:
        snapshot.give_back(job_id, s)


def _restore(snapshot: Snapshot, keep_workers: int | None, running: RunningJob) -> bool:
    if keep_workers is None:
        return snapshot.grant(running.job, running.allocation).ok
    slots = snapshot.slots_of(running.allocation)
    assert not isinstance(slots, str)
    for s in slots[keep_workers:]:
        if snapshot.slot_conflict(running.job, s) is not None:
            return False
        snapshot.take(running.job, s)
    return True


def restore(snapshot: Snapshot, victim: VictimCandidate, running: RunningJob) -> bool:
    """Undo `release` for one victim (inside the same savepoint); False if it cannot be put back."""
    return _restore(snapshot, victim.keep_workers, running)


def release(snapshot: Snapshot, victim: VictimCandidate) -> None:
    """Free what the victim gives up: the whole job, or the ranks an elastic shrink drops."""
    _release(snapshot, victim.job_id, victim.keep_workers)


def _sort_key(v: VictimCandidate) -> tuple[float, float, Rank, str]:
    gpus = max(v.gpus, 1)
    return (v.lost_gpu_hours / gpus, v.lost_gpu_hours, v.rank, v.job_id)


class VictimPool:
    """Victim candidates as columns, one row each, rows in cost order (cheapest per GPU first).

    The search works on row numbers: ordering a subset is sorting ints, and a `VictimCandidate`
    is made only for the victims chosen. Build it with `of` (candidate objects at hand) or
    `whole_jobs` (one plain tuple per job: the preempt path, thousands of running jobs per search).
    Job ids must be unique.
    """

    __slots__ = ("_given", "_ranks", "gpus", "gpus_by_node", "job_ids", "keep_workers", "lost_gpu_hours")

    def __init__(
        self,
        job_ids: Sequence[JobId],
        lost_gpu_hours: Sequence[float],
        gpus_by_node: Sequence[NodeGpus],
        gpus: Sequence[int],
        keep_workers: Sequence[int | None],
        ranks: Sequence[Rank],
        given: Sequence[VictimCandidate] | None,
    ) -> None:
        self.job_ids = job_ids
        self.lost_gpu_hours = lost_gpu_hours
        self.gpus_by_node = gpus_by_node
        self.gpus = gpus
        self.keep_workers = keep_workers
        self._ranks = ranks
        self._given = given

    @classmethod
    def of(cls, candidates: Sequence[VictimCandidate]) -> VictimPool:
        """The candidates as they are; `candidate` gives back these very objects."""
        ordered = sorted(candidates, key=_sort_key)
        return cls(
            [v.job_id for v in ordered],
            [v.lost_gpu_hours for v in ordered],
            [v.gpus_by_node for v in ordered],
            [v.gpus for v in ordered],
            [v.keep_workers for v in ordered],
            [v.rank for v in ordered],
            ordered,
        )

    @classmethod
    def whole_jobs(cls, rows: list[WholeJob]) -> VictimPool:
        """Whole-job candidates given as `WholeJob` rows, no object per job; sorts ``rows`` in place."""
        if not rows:
            return cls((), (), (), (), (), (), None)
        if len({row[0] for row in rows}) == len(rows):
            rows.sort(key=itemgetter(0))  # no ties on the first field: the same order, sorted as floats
        else:
            rows.sort()  # `_sort_key` order: the job id is unique, so nothing after it is compared
        _, lost, ranks, ids, by_node, gpus = zip(*rows, strict=True)
        return cls(ids, lost, by_node, gpus, (None,) * len(rows), ranks, None)

    def __len__(self) -> int:
        return len(self.job_ids)

    def candidate(self, row: int) -> VictimCandidate:
        """Row ``row`` as a `VictimCandidate`."""
        if self._given is not None:
            return self._given[row]
        return VictimCandidate(
            self.job_ids[row],
            self.lost_gpu_hours[row],
            self.gpus_by_node[row],
            self._ranks[row],
            self.keep_workers[row],
            self.gpus[row],
        )


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


def _rows_per_scope(
    pool: VictimPool, scopes: Sequence[tuple[str, Sequence[int]]], n_nodes: int
) -> list[Sequence[int]]:
    """Each scope's rows (in cost order): those with whole GPUs on one of its nodes."""
    if len(scopes) == 1:
        return [range(len(pool))]
    scope_of = [-1] * n_nodes
    for k, (_, nodes) in enumerate(scopes):
        for i in nodes:
            scope_of[i] = k
    per_scope: list[list[int]] = [[] for _ in scopes]
    for r, by_node in enumerate(pool.gpus_by_node):
        if len(by_node) == 1:
            k = scope_of[by_node[0][0]]
            if k >= 0:
                per_scope[k].append(r)
            continue
        for k in sorted({scope_of[i] for i, _ in by_node if scope_of[i] >= 0}):
            per_scope[k].append(r)
    return list(per_scope)


def _lower_bound(pool: VictimPool, rows: Sequence[int], in_scope: set[int] | None, deficit: int) -> float:
    """Fractional-knapsack bound on the GPU-hours lost to free ``deficit`` GPUs from ``rows``.

    ``in_scope``: the scope's nodes, when ``rows`` come from `_rows_per_scope` (so a one-node
    row's node is in it); None when every row counts whole.
    """
    if deficit <= 0:
        return 0.0
    lost, gpus, by_node = pool.lost_gpu_hours, pool.gpus, pool.gpus_by_node
    cost = 0.0
    for r in rows:  # in cost order
        if in_scope is None:
            g = gpus[r]
        else:
            where = by_node[r]
            g = where[0][1] if len(where) == 1 else sum(n for i, n in where if i in in_scope)
        if g <= 0:
            continue
        take = min(g, deficit)
        cost += lost[r] * take / g
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

    def add(self, by_node: NodeGpus, sign: int) -> None:
        for i, n in by_node:
            f = self.free.get(i)
            if f is None:
                continue
            before = f // self.per_worker
            f += sign * n
            self.free[i] = f
            self.fits_now += f // self.per_worker - before


def _node_steps(bound: _Bound, pool: VictimPool, rows: Sequence[int], workers: int) -> list[int] | None:
    """Cheapest victims, node by node, until ``workers`` whole workers could fit by count."""
    per = bound.per_worker
    lost, ids, free_of = pool.lost_gpu_hours, pool.job_ids, bound.free
    on_node: dict[int, list[tuple[float, str, int, int]]] = {}
    for r in rows:
        for i, n in pool.gpus_by_node[r]:
            if n > 0 and i in free_of:
                # (cost per GPU, job id, row, GPUs): rows rise in input order, so ties keep it
                on_node.setdefault(i, []).append((lost[r] / n, ids[r], r, n))
    # Steps per node: (cost of the step, workers it adds, rows it takes).
    steps: dict[int, list[tuple[float, int, list[int]]]] = {}
    for i in sorted(on_node):
        free = free_of[i]
        cost, taken, have = 0.0, [], free // per
        out: list[tuple[float, int, list[int]]] = []
        for _, _, r, n in sorted(on_node[i]):
            free += n
            cost += lost[r]
            taken.append(r)
            if free // per > have:
                out.append((cost, free // per - have, taken))
                have, cost, taken = free // per, 0.0, []
        if out:
            steps[i] = out
    need = workers - bound.fits_now
    chosen: dict[JobId, int] = {}
    heap = [(c / k, i, 0) for i, lst in steps.items() for c, k, _ in lst[:1]]
    heapq.heapify(heap)
    while need > 0 and heap:
        _, i, k = heapq.heappop(heap)
        cost, added, taken = steps[i][k]
        for r in taken:
            chosen.setdefault(ids[r], r)
        need -= added
        if k + 1 < len(steps[i]):
            c2, a2, _ = steps[i][k + 1]
            heapq.heappush(heap, (c2 / a2, i, k + 1))
    if need > 0:
        return None
    return sorted(chosen.values())


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
    return find_victims_in(snapshot, job, VictimPool.of(candidates), place, admissible=admissible)


def find_victims_in(
    snapshot: Snapshot,
    job: Job,
    pool: VictimPool,
    place: Place,
    *,
    admissible: Admissible | None = None,
) -> VictimSet | None:
    """`find_victims` on candidates already in a `VictimPool` (same search, same result)."""
    if not len(pool):
        return None
    models = _models_for(snapshot, job)
    whole = job.kind is GpuMode.WHOLE
    workers = job.fewest_workers
    scopes = _scopes(snapshot, job, models)
    if not scopes:
        return None
    per_scope = (
        _rows_per_scope(pool, scopes, len(snapshot.nodes)) if whole else [range(len(pool))] * len(scopes)
    )
    bounded: list[tuple[float, str, Sequence[int], Sequence[int]]] = []
    free_of, cordoned = snapshot.free, snapshot.node_cordoned
    for (name, nodes), rows in zip(scopes, per_scope, strict=True):
        if not rows:
            continue
        bound = 0.0
        if whole:
            in_scope = set(nodes) if len(scopes) > 1 else None
            free = sum(free_of[m][i] for m in models for i in nodes if not cordoned[i])
            bound = _lower_bound(pool, rows, in_scope, workers * job.gpus_per_worker - free)
            if bound == float("inf"):
                continue
        bounded.append((bound, name, nodes, rows))
    bounded.sort(key=lambda t: (t[0], t[1]))
    ranked: list[tuple[float, float, str, Sequence[int], Sequence[int], list[int]]] = []
    lost = pool.lost_gpu_hours
    for bound, name, nodes, rows in bounded[: 2 * MAX_SCOPES]:
        first: list[int] = []
        if whole:
            steps = _node_steps(_Bound(snapshot, models, nodes, job.gpus_per_worker), pool, rows, workers)
            if steps is None:
                continue
            first = steps
        ranked.append((sum(lost[r] for r in first), bound, name, nodes, rows, first))
    # Best estimate first; at most MAX_SCOPES scopes are confirmed, and none whose bound cannot win.
    ranked.sort(key=lambda t: (t[0], t[1], t[2]))
    best: tuple[float, int, str, list[int], Candidate] | None = None
    for _, bound, name, nodes, rows, first in ranked[:MAX_SCOPES]:
        if best is not None and bound >= best[0]:
            continue
        found = _search_scope(snapshot, job, pool, rows, first, place, admissible, models, nodes)
        if found is None:
            continue
        chosen, placement = found
        cost = sum(lost[r] for r in chosen)
        if best is None or (cost, len(chosen), name) < best[:3]:
            best = (cost, len(chosen), name, chosen, placement)
    if best is None:
        return None
    cost, _, name, chosen, placement = best
    return VictimSet(tuple(pool.candidate(r) for r in chosen), placement, cost, name)


def _search_scope(
    snapshot: Snapshot,
    job: Job,
    pool: VictimPool,
    rows: Sequence[int],
    first: Sequence[int],
    place: Place,
    admissible: Admissible | None,
    models: Sequence[int],
    nodes: Sequence[int],
) -> tuple[list[int], Candidate] | None:
    whole = job.kind is GpuMode.WHOLE
    workers = job.fewest_workers
    bound = _Bound(snapshot, models, nodes, job.gpus_per_worker) if whole else None
    ids, lost, keep, by_node = pool.job_ids, pool.lost_gpu_hours, pool.keep_workers, pool.gpus_by_node
    held: dict[JobId, RunningJob] = {}  # what each victim held, to put it back
    chosen: list[int] = []

    def fits(chosen: Sequence[int]) -> Candidate | None:
        got = place(job)
        if (
            got is not None
            and admissible is not None
            and not admissible(frozenset(ids[r] for r in chosen), got)
        ):
            return None
        return got

    def free_up(r: int) -> None:
        was = snapshot.running.get(ids[r])
        if was is not None:
            held[ids[r]] = was
        _release(snapshot, ids[r], keep[r])
        chosen.append(r)
        if bound is not None:
            bound.add(by_node[r], +1)

    with what_if(snapshot):
        for r in first:
            free_up(r)
        placement = fits(chosen) if chosen else None
        if placement is None:
            # Counting was not enough (topology, filters, quota): add victims in cost order.
            taken = {ids[r] for r in chosen}
            for r in rows:
                if ids[r] in taken:
                    continue
                free_up(r)
                if bound is not None and bound.fits_now < workers:
                    continue
                placement = fits(chosen)
                if placement is not None:
                    break
        if placement is None:
            return None
        # Spare every victim the job can do without, the most expensive first.
        for r in sorted(chosen, key=lambda r: (-lost[r], ids[r])):
            if bound is not None:
                bound.add(by_node[r], -1)
                if bound.fits_now < workers:
                    bound.add(by_node[r], +1)
                    continue
            mark = snapshot.savepoint()
            rest = [c for c in chosen if ids[c] != ids[r]]
            got = fits(rest) if rest and _restore(snapshot, keep[r], held[ids[r]]) else None
            if got is not None:
                chosen, placement = rest, got
            else:
                snapshot.rollback_to(mark)
                if bound is not None:
                    bound.add(by_node[r], +1)
        return chosen, placement
