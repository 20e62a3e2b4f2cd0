"""The scheduling policies the simulator compares: three baselines, and the core under a profile.

`gangline simulate` runs Gangline's profiles as the services decide them (`gangline.sim.gated`: the
quota gate charging at let-through, then placement's cycle), and `easy-backfill` on placement's cycle
too (`gangline.sim.gated.GatedEasyBackfill`: no gate, no fair share); `CorePolicy` here is the core's
cycle `fifo-gang-best-fit` is built from, and `EasyBackfill` the same EASY rule on it (the reference
the placement-cycle run is tested against: the same starts when each instant has one input).

* `CorePolicy` runs Gangline's own core, unchanged: each cycle is `run_cycle` (or, when the
  cluster has queues, `run_queue_cycle` with the quota ledger and fair shares) over the pending
  jobs in submit order, and the plan is committed with `apply_plan`. Profiles decide the rest.
* `fifo-gang-best-fit` is `CorePolicy` with a bare profile (health, gpu-fit, gang; no scores, one
  candidate): whole gangs in submit order, each on the fullest nodes that fit it, no quotas.
* `EasyBackfill` (`easy-backfill`) is priority FIFO with EASY backfill, as Slurm users know it
  (priority/multifactor without fair share, backfill scheduler): jobs in priority order, then
  submit order; the first job that cannot start (the head) holds a reservation at its earliest
  start, found from the running jobs' expected ends (start + time limit); later jobs start only
  if they fit now and either their time limit ends before the head's reservation or they do not
  touch its GPUs. Whole gangs, no quotas, no preemption. It is `CorePolicy` with the core's own
  reserve / allocate / backfill (`EASY_BACKFILL_YAML`), an unlimited quota tree and a fair share
  with no capacity (every share 0, so the core's fair order is priority, then submit time). Its
  duration hint is the job's time limit: the trace's `time_limit_s` where it gives one, else one
  default limit for every job (Slurm's partition DefaultTime), never the job's real run time.
* `PodFirstFit` (`k8s-first-fit`) is what plain Kubernetes does with GPU pods: every pod on its
  own, in submit order, on the first node (lowest index) that fits it; a job starts only when all
  its pods are bound, and bound pods hold their GPUs meanwhile. It is not the core, on purpose.

A policy owns a `Snapshot` of the cluster, so metrics read free GPUs the same way for all.

Under contention all three keep cycles proportional to what can change, not to what waits, and
decide exactly what the plain loops decide (`tests/unit/core/test_waiting.py` and
`test_easy_backfill.py` compare them job by job):
`CorePolicy` hands the core only the waiting jobs that could be placed or charged
(`gangline.core.waiting`; for a profile with reservations, also the front of the line),
`EasyBackfill` those and the first blocked job of each group;
`PodFirstFit` walks its waiting jobs by pod shape and stops a shape at its first failure.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Protocol

from gangline.core.actions.backfill import Reserve
from gangline.core.actions.queueing import (
    EarliestStart,
    QueueContext,
    QueueDecisions,
    Reservation,
    RunFacts,
    open_context,
    request_for_order,
    run_queue_cycle,
)
from gangline.core.actions.reclaim import NAME as RECLAIM
from gangline.core.defaults import placement_registry
from gangline.core.fairshare import FairShare
from gangline.core.framework.cycle import apply_plan, run_cycle
from gangline.core.framework.plan import Plan
from gangline.core.framework.profile import Profile, load_profile
from gangline.core.framework.registry import Registry
from gangline.core.model import (
    FULL_GPU_MILLI,
    Allocation,
    AllocationId,
    GpuMode,
    GpuModel,
    Job,
    JobId,
    Milli,
    Node,
    QueueName,
    Seconds,
    WorkerPlacement,
)
from gangline.core.queues import (
    CohortSpec,
    QueueSpec,
    QuotaLedger,
    QuotaTree,
    Resource,
    ResourceQuota,
    job_request,
)
from gangline.core.snapshot import Snapshot
from gangline.core.waiting import (
    FRONT_OF_LINE,
    GroupKey,
    LineKey,
    WaitingIndex,
    group_key,
    group_key_with_hint,
)

NON_EVICTING_ACTIONS = frozenset({"allocate", "reserve", "backfill"})
"""Actions that only take GPUs (reserve evicts only preemptible work, checked separately)."""

FIFO_GANG_BEST_FIT_YAML = """\
name: fifo-gang-best-fit
actions: [allocate]
plugins: [health, gpu-fit, gang]
settings: {max_candidates: 1}
"""
"""Whole gangs, submit order, the search's first (fullest-node, best-fit) candidate, no quotas."""

EASY_BACKFILL_YAML = """\
name: easy-backfill
actions:
  - name: reserve
    args: {max_reservations: 1, min_gpus: 1, start_ahead: true}
  - allocate
  - backfill
plugins: [priority, health, gpu-fit, gang]
settings: {max_candidates: 1}
"""
"""EASY backfill from the core's actions: one reservation, for the first job (of any size) that
cannot start once the jobs ahead of it have; later jobs on the GPUs it does not hold, or on the
ones it does when they end before it starts."""

DEFAULT_TIME_LIMIT_S = 86400.0
"""`easy-backfill`'s time limit for jobs whose trace gives none (one day, like a partition's
DefaultTime)."""

UNLIMITED = 1 << 40
"""A quota no request reaches: what an unlimited queue is given for every resource."""


def unlimited_tree(
    queues: Iterable[QueueName],
    resources: Iterable[Resource],
    *,
    specs: Sequence[QueueSpec] = (),
    cohorts: Sequence[CohortSpec] = (),
) -> QuotaTree:
    """The tree of `specs` and `cohorts`, with each of `queues` they do not name in it, outside
    any cohort, free to use any amount of each of `resources`."""
    quotas = {r: ResourceQuota(UNLIMITED) for r in sorted(set(resources))}
    named = {q.name for q in specs}
    free = [QueueSpec(q, quotas) for q in sorted(set(queues) - named)]
    return QuotaTree([*specs, *free], cohorts)


def charged_resources(jobs: Iterable[Job], nodes: Sequence[Node]) -> set[Resource]:
    """Every quota resource one of `jobs` could be charged on the GPU models of `nodes`."""
    models = sorted({g.model for n in nodes for g in n.gpus})
    out: set[Resource] = set()
    for job in jobs:
        for m in [job.gpu_type] if job.gpu_type is not None else models:
            out.update(job_request(job, m))
    return out


@dataclass(frozen=True, slots=True)
class CycleOutcome:
    """What one cycle changed: jobs that started, jobs evicted, and jobs holding part of a gang."""

    started: tuple[JobId, ...] = ()
    evicted: tuple[JobId, ...] = ()
    partial: tuple[JobId, ...] = ()
    """Jobs that hold GPUs for some but not all of their workers after the cycle."""
    problems: tuple[str, ...] = ()
    resized: tuple[JobId, ...] = ()
    """Elastic jobs whose allocation was replaced at another size (a shrink frees GPUs)."""
    reclaimed: tuple[JobId, ...] = ()
    """Those of ``evicted`` stopped by a reclaim (their cohort took back quota they borrowed), not for
    priority: what the preemption service's ``job.preempting`` says (``preemption_reason``)."""


def reclaimed_by(plan: Plan) -> list[JobId]:
    """The plan's evictions the core's ``reclaim`` action made (its reason names the plugin)."""
    return [e.job_id for e in plan.evicted if any(r.plugin == RECLAIM for r in e.reasons)]


class Policy(Protocol):
    """What the simulator drives. All calls are synchronous; time is given, never read."""

    name: str
    snapshot: Snapshot

    def submit(self, job: Job, now: float) -> None:
        """A job arrives (or returns after preemption)."""

    def finish(self, job_id: JobId, now: float) -> None:
        """A running job ends: free its GPUs."""

    def cycle(self, now: float, new: Sequence[JobId] | None = None) -> CycleOutcome:
        """Decide what starts now.

        `new` (when given) says that nothing was released since the last cycle and only these jobs
        arrived: a policy whose decisions are monotone (a job that did not fit still does not fit
        once GPUs are only taken) may then try only them, with the same outcome as trying all.
        """

    def pending(self) -> Sequence[Job]:
        """Jobs waiting, in submit order."""

    def held_gpus(self) -> float:
        """GPU-equivalents held, including by jobs that have not started (partial gangs)."""


def job_gpus(job: Job) -> float:
    """GPU-equivalents a job holds at its full size."""
    if job.gpu_milli is not None:
        return job.workers * job.gpu_milli / FULL_GPU_MILLI
    return float(job.workers * job.gpus_per_worker)


@dataclass
class QueueSetup:
    """Queues for the core policy: the quota tree, capacity per resource, and the fair-share half-life."""

    tree: QuotaTree
    capacity: Mapping[Resource, int]
    half_life_s: float = 0.0


@dataclass
class CorePolicy:
    """Gangline's core under `profile` (see module docstring)."""

    name: str
    profile: Profile
    nodes: Sequence[Node]
    queues: QueueSetup | None = None
    prune: bool = True
    """Hand each cycle only the waiting jobs that could change its outcome (`gangline.core.waiting`);
    False runs the core over every waiting job (the reference the pruned runs are tested against)."""
    snapshot: Snapshot = field(init=False)
    _pending: dict[JobId, Job] = field(init=False, default_factory=dict)
    _waiting: WaitingIndex = field(init=False, default_factory=WaitingIndex)
    _seq: int = field(init=False, default=0)
    _available: dict[tuple[QueueName, Resource], int] = field(init=False, default_factory=dict)
    """What quota could still admit per (queue, resource), until the ledger changes."""
    _weights: dict[QueueName, float] | None = field(init=False, default=None)
    """The quota tree's fair-share weights (it does not change)."""
    _queue_waiting: dict[QueueName, int] = field(init=False, default_factory=dict)
    """How many jobs wait per queue."""
    _admits: dict[JobId, int] = field(init=False, default_factory=dict)
    """`_admissible` per job asked, until the ledger changes."""
    _order_requests: dict[JobId, dict[Resource, int]] = field(init=False, default_factory=dict)
    """Each waiting job's request as fair order reads it (dropped when it starts)."""
    _submitted: dict[JobId, float] = field(init=False, default_factory=dict)
    _requests: dict[JobId, dict[Resource, int]] = field(init=False, default_factory=dict)
    _usage: dict[QueueName, dict[Resource, float]] = field(init=False, default_factory=dict)
    _facts: dict[JobId, RunFacts] = field(init=False, default_factory=dict)
    _held: float = field(init=False, default=0.0)
    _cycle: int = field(init=False, default=0)
    _ledger: QuotaLedger | None = field(init=False, default=None)
    _preemptible_seen: bool = field(init=False, default=False)
    _pruned_heads: bool = field(init=False, default=False)
    """Whether this cycle's jobs are `_fits_and_heads` (backfill may then need `_backfill_extras`)."""
    _starts: dict[tuple[object, ...], EarliestStart] = field(init=False, default_factory=dict)
    """Reserve's earliest starts while the snapshot and the running jobs stay as they are
    (`QueueContext.start_memo`): emptied by every release and every committed plan that changes them."""
    _holders: tuple[JobId, ...] = field(init=False, default=())
    """The jobs that held reservations after the last cycle."""

    def __post_init__(self) -> None:
        settings = self.profile.settings
        if (
            settings.starvation_s is not None
            or settings.short_first_weight is not None
            or any(getattr(a, "horizon_s", None) is not None for a in self.profile.actions)
        ):
            # The waiting-job pruning assumes fair order and the first blocked gang decide, each group
            # of like requests in submit order; the starvation bound, the reservation horizon and
            # shortest-first (which orders a group by run time) break that, so every waiting job is handed.
            self.prune = False
        self.snapshot = Snapshot(self.nodes)
        if self.queues is not None:
            self._ledger = QuotaLedger(self.queues.tree)

    def submit(self, job: Job, now: float) -> None:
        self._submitted.setdefault(job.id, now)
        self._preemptible_seen = self._preemptible_seen or job.preemptible
        self._wait(job)

    def _wait(self, job: Job) -> None:
        """Put `job` in line: last in submit order, or by submit time in its queue's line."""
        if job.id in self._pending:
            return
        self._pending[job.id] = job
        self._queue_waiting[job.queue] = self._queue_waiting.get(job.queue, 0) + 1
        self._seq += 1
        line = float(self._seq) if self.queues is None else self._submitted[job.id]
        self._waiting.add(job, (line, job.id))

    def finish(self, job_id: JobId, now: float) -> None:
        r = self.snapshot.release(job_id)
        if r is None:
            return
        self._starts.clear()
        self._held -= job_gpus(r.job)
        self._facts.pop(job_id, None)
        self._uncharge(r.job)

    def pending(self) -> Sequence[Job]:
        return list(self._pending.values())

    def held_gpus(self) -> float:
        return self._held

    def _model_of(self, allocation: Allocation) -> GpuModel:
        snap = self.snapshot
        g = snap.gpu_pos[allocation.placements[0].gpus[0]]
        return snap.models[snap.g_model[g]]

    def _charge(self, job: Job, allocation: Allocation) -> None:
        if self._ledger is None:
            return
        req = job_request(job, self._model_of(allocation), len(allocation.placements))
        self._requests[job.id] = req
        self._ledger.admit(job.queue, req)
        self._available.clear()
        self._admits.clear()
        use = self._usage.setdefault(job.queue, {})
        for r, n in req.items():
            use[r] = use.get(r, 0.0) + n

    def _uncharge(self, job: Job) -> None:
        req = self._requests.pop(job.id, None)
        if req is None or self._ledger is None:
            return
        self._ledger.release(job.queue, req)
        self._available.clear()
        self._admits.clear()
        use = self._usage[job.queue]
        for r, n in req.items():
            use[r] -= n

    def _monotone(self, new: Sequence[JobId]) -> bool:
        """Whether trying only `new` decides exactly what a full cycle would (see `Policy.cycle`).

        True for profiles that only take GPUs (allocate, reserve, backfill): earlier pending jobs
        failed on a state with at least as much free, so they fail again and change nothing; the
        jobs holding reservations are tried with the new ones (`_holders`). With queues, fair order
        also depends on the others (it decides who holds the reservation too), so only a single new
        job of an allocate-only profile is certain to be decided the same way.
        """
        if self.queues is not None:
            return self._allocate_only() and len(new) == 1
        # Reserve and backfill only take GPUs too; the cycle then also sees the reservation holders,
        # so the new jobs are measured against the same held GPUs a full cycle would hold. Their
        # fair order charges every job it meets (no quota refuses any), so the jobs left out would
        # move the others unless all wait in one queue (one line: priority, then submit time).
        return self._allocate_only() or (not self._evicts() and self._one_queue())

    def _one_queue(self) -> bool:
        """Whether every waiting job is in the same queue."""
        return len(self._queue_waiting) <= 1

    def _allocate_only(self) -> bool:
        """Whether cycles only take GPUs (no action evicts), which pruning and `new` rely on."""
        return all(a.name == "allocate" for a in self.profile.actions)

    def _evicts(self) -> bool:
        """Whether an action may free GPUs inside a cycle (then every waiting job is a candidate):
        an evicting action, or reserve with preemptible work about (it checkpoints that for a gang)."""
        return self._preemptible_seen or any(a.name not in NON_EVICTING_ACTIONS for a in self.profile.actions)

    def _reserve_heads(self) -> tuple[int, int] | None:
        """(how many blocked jobs per group a cycle may reserve for, the fewest GPUs reserve takes)
        when the profile's reservations can be pruned exactly (see `_fits_and_heads`), else None."""
        reserves = [a for a in self.profile.actions if a.name == "reserve"]
        if not all(isinstance(a, Reserve) and not a.start_ahead for a in reserves):
            return None
        held = sum(a.max_reservations for a in reserves if isinstance(a, Reserve))
        fewest = min((a.min_gpus for a in reserves if isinstance(a, Reserve)), default=0)
        return held, fewest

    def _fits_and_heads(self, held: int, fewest: int) -> list[Job]:
        """Every waiting job the free GPUs could hold or quota could charge, and of each group of
        identical requests the first `held` left out that reserve could pick (exact, unlike `FRONT_OF_LINE`).

        Reserve (without `start_ahead`) walks the cycle's jobs in fair order before anything is
        placed and gives its reservations to the first whole-GPU gangs of at least `fewest` GPUs
        that quota admits but the free GPUs cannot place now. Jobs of one group are alike to it
        and come in line order in fair order, so of those left out only a group's first `held` can
        be picked (each reservation held only takes GPUs; a job the free GPUs could hold is kept
        anyway). The ones left out are past what quota could charge, so fair order skips them and
        handing them over does not move the others (`gangline.core.waiting`).
        """
        blocked: list[tuple[LineKey, Job]] = []
        admit = self._admit_limit if self._ledger is not None else None
        lined = self._waiting.candidates(self.snapshot, admit, blocked=blocked, blocked_each=held)
        for entry in blocked:
            job = entry[1]
            if (
                job.kind is GpuMode.WHOLE
                and job.fewest_workers * job.gpus_per_worker >= fewest
                and (admit is None or admit(job, 1) > 0)
            ):
                lined.append(entry)
        lined.sort(key=lambda e: e[0])
        return [j for _, j in lined]

    def _front_and_fits(self) -> list[Job]:
        """The first `FRONT_OF_LINE` waiting jobs in line, then every later one the free GPUs could hold or,
        with queues, quota could charge (fair order charges those; see `gangline.core.waiting`)."""
        if self._ledger is None and not self._one_queue():
            # Without quotas fair order charges every waiting job, so any one left out could move
            # the others (`_monotone`): all of them, unless they wait in a single queue.
            return list(self._pending.values())
        heads = self._reserve_heads()
        if heads is not None:
            self._pruned_heads = True
            return self._fits_and_heads(*heads)
        front = list(islice(self._pending.values(), FRONT_OF_LINE))
        seen = {j.id for j in front}
        lined = [(self._waiting.line_of(j.id), j) for j in front]
        admit = self._admit_limit if self._ledger is not None else None
        lined += [e for e in self._waiting.candidates(self.snapshot, admit) if e[1].id not in seen]
        lined.sort(key=lambda e: e[0])
        return [j for _, j in lined]

    def _admit_limit(self, job: Job, size: int) -> int:
        """How many of `size` jobs like `job` its queue's quota could admit now (at most `size`).

        `QuotaLedger.fits` checks each resource on its own (`n <= available`), so k copies fit
        exactly when k * n <= available for every resource of the request. The request is kept
        per job, what quota makes available per (queue, resource) until the ledger changes.
        """
        n = self._admits.get(job.id)
        if n is None:
            n = self._admits[job.id] = self._admissible(job)
        return n if n < size else size

    def _admissible(self, job: Job) -> int:
        """How many copies of `job`'s request quota could admit now (`UNLIMITED` for an empty one)."""
        assert self._ledger is not None
        if not self._ledger.tree.has_queue(job.queue):
            return 0
        req = self._order_requests.get(job.id)
        if req is None:
            req = self._order_requests[job.id] = request_for_order(job, self.snapshot)
        n = UNLIMITED
        for r, need in req.items():
            if need > 0:
                avail = self._available.get((job.queue, r))
                if avail is None:
                    avail = self._available[(job.queue, r)] = self._quota_left(job.queue, r)
                n = min(n, avail // need)
        return n

    def _quota_left(self, queue: QueueName, resource: Resource) -> int:
        """What quota could still admit to `queue` (a queue of the tree) of `resource`."""
        assert self._ledger is not None
        return max(0, self._ledger.available(queue, resource))

    def _cycle_jobs(self, new: Sequence[JobId] | None) -> list[Job]:
        """The waiting jobs to hand the core this cycle (all, or those that could change it)."""
        if new is not None and self._monotone(new):
            ids = [j for j in new if j in self._pending]
            ids += [h for h in self._holders if h in self._pending and h not in ids]
            ids.sort(key=self._waiting.line_of)
            return [self._pending[j] for j in ids]
        if self.prune and self._allocate_only():
            admit = self._admit_limit if self._ledger is not None else None
            lined = self._waiting.candidates(self.snapshot, admit)
            lined.sort(key=lambda e: e[0])
            return [j for _, j in lined]
        if self.prune and not self._evicts():
            return self._front_and_fits()
        return list(self._pending.values())

    def _open_cycle(self, jobs: Sequence[Job], now: float) -> tuple[Plan, QueueDecisions]:
        """`run_queue_cycle` with no quotas (`open_context`), for the queue-aware actions."""
        ctx = open_context(self.snapshot, jobs, now=now, submit_time=self._submitted, run_facts=self._facts)
        return run_queue_cycle(self.snapshot, jobs, self.profile, ctx, cycle=self._cycle)

    def _queue_cycle(self, jobs: Sequence[Job], now: float) -> tuple[Plan, QueueDecisions]:
        """`run_queue_cycle` with the quota ledger and fair shares as they stand (working copies)."""
        assert self.queues is not None and self._ledger is not None
        if self._weights is None:
            self._weights = {q: self.queues.tree.weight(q) for q in self.queues.tree.queue_names()}
        fair = FairShare(capacity=self.queues.capacity, weights=self._weights, allocation=self._usage)
        ctx = QueueContext(
            now=now,
            ledger=self._ledger.copy(),
            fair=fair,
            submit_time=self._submitted,
            run_facts=self._facts,
            explain=False,
            start_memo=self._starts,
        )
        return run_queue_cycle(self.snapshot, jobs, self.profile, ctx, cycle=self._cycle)

    def _keep_starts(self, placed: Sequence[Job], now: float) -> None:
        """Keep the earliest starts that `placed` (started now, committed) cannot change: those after
        all of them are expected to end.

        Released in expected-end order, every step before such a start now has the GPUs it had,
        less the ones `placed` still hold, so the gang fits at none of them (GPUs only taken); at
        the start itself every one of `placed` has ended, and the GPUs are exactly as before.
        """
        ends = [now + j.duration_hint_s if j.duration_hint_s is not None else math.inf for j in placed]
        latest, soonest = max(ends), min(ends)
        version = self.snapshot.version  # called once `placed` are committed: the entries hold on it
        for key, e in list(self._starts.items()):
            if latest < e.start:
                self._starts[key] = replace(e, valid_until=min(e.valid_until, soonest), version=version)
            else:
                del self._starts[key]

    def _backfill_extras(
        self, jobs: Sequence[Job], reservations: Sequence[Reservation], now: float
    ) -> list[Job] | None:
        """`jobs` and the waiting jobs backfill could have started this cycle that they lack, in
        line order; None when they lack none (then the cycle on `jobs` decided what a full one does).

        Backfill starts only jobs that end before the first reservation starts, on GPUs free at the
        start of the cycle, so of each group the first ones in line short enough, as many as the free
        GPUs hold (`WaitingIndex.short_candidates`). The horizon is a second longer than the wait,
        so rounding in `now + hint <= start` cannot leave one out (an extra job changes nothing).
        """
        starts = [r.start for r in reservations]
        if not starts or not math.isfinite(min(starts)):
            return None
        have = {j.id for j in jobs}
        short = self._waiting.short_candidates(self.snapshot, min(starts) - now + 1.0)
        extra = [e for e in short if e[1].id not in have]
        if not extra:
            return None
        lined = [(self._waiting.line_of(j.id), j) for j in jobs] + extra
        lined.sort(key=lambda e: e[0])
        return [j for _, j in lined]

    def cycle(self, now: float, new: Sequence[JobId] | None = None) -> CycleOutcome:
        self._cycle += 1
        self._pruned_heads = False
        jobs = self._cycle_jobs(new)
        if not jobs:
            return CycleOutcome()
        if self.queues is None and not self._allocate_only():
            # Queue-aware actions (reserve, backfill, ...) read a QueueContext: no quotas here.
            plan, decisions = self._open_cycle(jobs, now)
            if self._pruned_heads and any(a.name == "backfill" for a in self.profile.actions):
                more = self._backfill_extras(jobs, decisions.reservations, now)
                if more:
                    plan, decisions = self._open_cycle(more, now)
            self._holders = tuple(r.job_id for r in decisions.reservations)
        elif self.queues is not None and self._ledger is not None:
            plan, decisions = self._queue_cycle(jobs, now)
            if self._pruned_heads and any(a.name == "backfill" for a in self.profile.actions):
                more = self._backfill_extras(jobs, decisions.reservations, now)
                if more:
                    plan, decisions = self._queue_cycle(more, now)
            self._holders = tuple(r.job_id for r in decisions.reservations)
        else:
            plan = run_cycle(self.snapshot, jobs, self.profile, cycle=self._cycle)
        evicted: list[JobId] = []
        for e in plan.evicted:
            r = self.snapshot.running.get(e.job_id)
            if r is not None:
                self.finish(e.job_id, now)
                self._wait(r.job)
                evicted.append(e.job_id)
        problems = [s.message for s in apply_plan(self.snapshot, plan) if not s.ok]
        if plan.evicted:
            self._starts.clear()
        elif plan.placed:
            self._keep_starts([p.job for p in plan.placed], now)
        started: list[JobId] = []
        partial: list[JobId] = []
        for p in plan.placed:
            if p.job.id not in self.snapshot.running or p.job.id not in self._pending:
                continue
            del self._pending[p.job.id]
            left = self._queue_waiting[p.job.queue] - 1
            if left:
                self._queue_waiting[p.job.queue] = left
            else:
                del self._queue_waiting[p.job.queue]
            self._waiting.remove(p.job.id)
            self._order_requests.pop(p.job.id, None)
            self._admits.pop(p.job.id, None)
            started.append(p.job.id)
            if len(p.allocation.placements) < p.job.fewest_workers:
                partial.append(p.job.id)
            self._held += job_gpus(p.job) * len(p.allocation.placements) / p.job.workers
            self._facts[p.job.id] = RunFacts(started_at=now)
            self._charge(p.job, p.allocation)
        reclaimed = set(reclaimed_by(plan))
        return CycleOutcome(
            tuple(started),
            tuple(evicted),
            tuple(partial),
            tuple(problems),
            reclaimed=tuple(j for j in evicted if j in reclaimed),
        )


class EasyBackfill(CorePolicy):
    """`easy-backfill`: priority FIFO with EASY backfill (see module docstring)."""

    def __init__(
        self,
        name: str,
        nodes: Sequence[Node],
        tree: QuotaTree,
        *,
        registry: Registry | None = None,
        time_limits: Mapping[JobId, float] | None = None,
        default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
        prune: bool = True,
    ) -> None:
        profile = load_profile(EASY_BACKFILL_YAML, registry or placement_registry())
        super().__init__(name, profile, nodes, QueueSetup(tree, capacity={}), prune=prune)
        self._waiting = WaitingIndex(group_key_with_hint)
        self._idle_profile = load_profile(FIFO_GANG_BEST_FIT_YAML, registry or placement_registry())
        self._idle_fit: dict[GroupKey, bool] = {}
        self._limits = dict(time_limits or {})
        self.default_time_limit_s = default_time_limit_s

    def time_limit(self, job_id: JobId) -> float:
        """The time limit `job_id` runs under: its trace's, or the default."""
        return self._limits.get(job_id, self.default_time_limit_s)

    def submit(self, job: Job, now: float) -> None:
        """In line with its time limit as its duration hint; nothing is preemptible without preemption."""
        hint = Seconds(max(1, math.ceil(self.time_limit(job.id))))
        super().submit(replace(job, duration_hint_s=hint, preemptible=False), now)

    def _cycle_jobs(self, new: Sequence[JobId] | None) -> list[Job]:
        """The jobs that could start, and the first blocked job that could ever start (the head).

        A cycle only takes GPUs free at its start (the reservation holds and gives back only
        those), so of a group of identical jobs (time limit included) the ones past what the free
        GPUs hold never start (`gangline.sim.waiting`). The head the reservation goes to is the
        first job in line that cannot start but would on an idle cluster: among those left out,
        it is the first such in (priority, submit) order; the core skips blocked jobs before it
        (they never fit) and leaves the ones after it waiting, so handing it the rest changes
        nothing. Every running job has a known end (its time limit), so only a job that does not
        fit an idle cluster gets no reservation.
        """
        del new
        if not self.prune:
            return list(self._pending.values())
        blocked: list[tuple[LineKey, Job]] = []
        lined = self._waiting.candidates(self.snapshot, blocked=blocked)
        blocked.sort(key=lambda e: (-e[1].priority, e[0]))
        for entry in blocked:
            lined.append(entry)
            if self._fits_idle(entry[1]):
                break
        lined.sort(key=lambda e: e[0])
        return [j for _, j in lined]

    def _fits_idle(self, job: Job) -> bool:
        """Whether `job` could be placed on the cluster with nothing running (cached per shape)."""
        key = group_key(job)
        fits = self._idle_fit.get(key)
        if fits is None:
            plan = run_cycle(Snapshot(self.nodes), [job], self._idle_profile, cycle=0)
            fits = self._idle_fit[key] = bool(plan.placed)
        return fits


@dataclass
class _PodJob:
    job: Job
    pods: int
    bound: list[Allocation] = field(default_factory=list)


class PodFirstFit:
    """`k8s-first-fit`: pods placed one by one, first fit, no gang semantics (see module docstring)."""

    def __init__(
        self, name: str, nodes: Sequence[Node], pod_workers: Mapping[JobId, int] | None = None
    ) -> None:
        self.name = name
        self.snapshot = Snapshot(nodes)
        self._pod_workers = dict(pod_workers or {})
        self._waiting: dict[JobId, _PodJob] = {}
        self._running: dict[JobId, _PodJob] = {}
        self._held = 0.0
        self._seq = 0
        self._lines: dict[tuple[object, ...], list[tuple[int, JobId]]] = {}
        """Waiting jobs by pod shape (kind, GPU type, workers per pod, size), in submit order."""
        self._line_of: dict[JobId, tuple[tuple[object, ...], int]] = {}
        self._size_of: dict[tuple[object, ...], int] = {}
        self._partly_bound: dict[JobId, None] = {}
        """Waiting jobs holding some of their pods, in the order they first bound one."""

    def submit(self, job: Job, now: float) -> None:
        per = self._pod_workers.get(job.id, 1)
        if job.workers % per:
            raise ValueError(f"job {job.id}: {job.workers} workers do not split into pods of {per}")
        self._waiting[job.id] = _PodJob(job, job.workers // per)
        size = job.gpus_per_worker if job.kind is GpuMode.WHOLE else (job.gpu_milli or 0)
        shape = (job.kind, job.gpu_type, per, size)
        self._seq += 1
        self._lines.setdefault(shape, []).append((self._seq, job.id))
        self._size_of[shape] = size
        self._line_of[job.id] = (shape, self._seq)

    def _unline(self, job_id: JobId) -> None:
        shape, seq = self._line_of.pop(job_id)
        line = self._lines[shape]
        del line[bisect_left(line, (seq,))]
        if not line:
            del self._lines[shape]
        self._partly_bound.pop(job_id, None)

    def finish(self, job_id: JobId, now: float) -> None:
        pj = self._running.pop(job_id, None)
        if pj is None:
            return
        for a in pj.bound:
            self.snapshot.release(a.job_id)
        self._held -= job_gpus(pj.job)

    def pending(self) -> Sequence[Job]:
        return [pj.job for pj in self._waiting.values()]

    def held_gpus(self) -> float:
        return self._held

    def _models(self, job: Job) -> list[int]:
        snap = self.snapshot
        if job.gpu_type is not None:
            m = snap.model_pos.get(job.gpu_type)
            return [] if m is None else [m]
        return list(range(len(snap.models)))

    def _first_fit(self, job: Job, per: int) -> tuple[int, list[int]] | None:
        """The lowest-index node (any allowed model) fitting one pod of `per` workers, and its GPUs."""
        snap = self.snapshot
        best: tuple[int, list[int]] | None = None
        for m in self._models(job):
            if job.kind is GpuMode.WHOLE:
                need = per * job.gpus_per_worker
                b = snap.buckets[m]
                first = min((b[k][0] for k in range(max(need, 1), len(b)) if b[k]), default=None)
                if first is not None and (best is None or first < best[0]):
                    best = (first, snap.free_whole_gpus(first, m)[:need])
            else:
                assert job.gpu_milli is not None
                milli = job.gpu_milli
                for i in snap.shared_nodes[m]:
                    if best is not None and i >= best[0]:
                        break
                    if snap.node_cordoned[i]:
                        continue
                    gs = [
                        g
                        for g in snap.node_gpus[i]
                        if snap.g_model[g] == m
                        and snap.g_usable[g]
                        and snap.gpus[g].mode is GpuMode.SHARED
                        and snap.g_milli_used[g] + milli <= FULL_GPU_MILLI
                    ]
                    if len(gs) >= per:
                        best = (i, gs[:per])
                        break
        return best

    def cycle(self, now: float, new: Sequence[JobId] | None = None) -> CycleOutcome:
        """First fit in submit order; monotone, so `new` alone is tried when given.

        A pod shape that found no room stops every later pod of that shape and at least that size
        this cycle (the GPUs only get fewer), so the waiting jobs are walked shape line by shape
        line, merged in submit order, and a line ends at its first failure: a cycle costs the
        jobs it binds, not every job that waits.
        """
        started: list[JobId] = []
        failed: dict[tuple[object, ...], int] = {}
        if new is not None:
            todo = [self._waiting[j] for j in new if j in self._waiting]
            for pj in todo:
                self._bind(pj, failed, now, started)
            partial = tuple(pj.job.id for pj in todo if pj.bound and pj.job.id in self._waiting)
        else:
            heap = [(line[0][0], shape, 0) for shape, line in self._lines.items()]
            heapq.heapify(heap)
            while heap:
                _, shape, k = heapq.heappop(heap)
                key, size = shape[:-1], self._size_of[shape]
                if key in failed and failed[key] <= size:
                    continue  # this shape line found no room; all its jobs would stop at once
                line = self._lines[shape]
                self._bind(self._waiting[line[k][1]], failed, now, started)
                if k + 1 < len(line):
                    heapq.heappush(heap, (line[k + 1][0], shape, k + 1))
            partial = tuple(j for j in self._partly_bound if j in self._waiting)
        for jid in started:
            self._unline(jid)
        return CycleOutcome(tuple(started), (), partial)

    def _bind(
        self, pj: _PodJob, failed: dict[tuple[object, ...], int], now: float, started: list[JobId]
    ) -> None:
        """Bind `pj`'s pods by first fit until one finds no room; start the job when all are bound."""
        snap = self.snapshot
        job = pj.job
        per = job.workers // pj.pods
        size = job.gpus_per_worker if job.kind is GpuMode.WHOLE else (job.gpu_milli or 0)
        key: tuple[object, ...] = (job.kind, job.gpu_type, per)
        while len(pj.bound) < pj.pods:
            if key in failed and failed[key] <= size:
                break  # a smaller pod of this shape already found no room this cycle
            hit = self._first_fit(job, per)
            if hit is None:
                failed[key] = min(size, failed.get(key, size))
                break
            node, gpus = hit
            k = len(pj.bound)
            pod = Job(
                id=JobId(f"{job.id}#pod{k}"),
                queue=job.queue,
                workers=per,
                gpus_per_worker=job.gpus_per_worker,
                gpu_milli=job.gpu_milli,
            )
            nid = snap.nodes[node].id
            if job.kind is GpuMode.WHOLE:
                g = job.gpus_per_worker
                placements = tuple(
                    WorkerPlacement(
                        k * per + w, nid, tuple(snap.gpus[x].id for x in gpus[w * g : (w + 1) * g])
                    )
                    for w in range(per)
                )
            else:
                placements = tuple(
                    WorkerPlacement(k * per + w, nid, (snap.gpus[gpus[w]].id,), milli=Milli(size))
                    for w in range(per)
                )
            alloc = Allocation(AllocationId(f"{pod.id}.t{now:.0f}"), pod.id, placements)
            st = snap.grant(pod, alloc)
            if not st.ok:
                raise AssertionError(f"first fit chose a taken slot: {st.message}")
            pj.bound.append(alloc)
            self._held += job_gpus(pod)
        if len(pj.bound) == pj.pods:
            del self._waiting[job.id]
            self._running[job.id] = pj
            started.append(job.id)
        elif pj.bound:
            self._partly_bound[job.id] = None


def make_policy(
    name: str,
    nodes: Sequence[Node],
    *,
    pod_workers: Mapping[JobId, int] | None = None,
    registry: Registry | None = None,
    time_limits: Mapping[JobId, float] | None = None,
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> Policy:
    """A baseline by name (`BASELINES`); Gangline's profiles run as the services decide them
    (`gangline.sim.gated.GatedPolicy`).

    `easy-backfill` runs on placement's cycle (`gangline.sim.gated.GatedEasyBackfill`: what the
    placement service runs, the same decisions as `EasyBackfill`, the core's cycle, when each instant
    has one input) with the jobs' time limits (`time_limits`, else `default_time_limit_s`).
    """
    if name == "k8s-first-fit":
        return PodFirstFit(name, nodes, pod_workers)
    if name == "easy-backfill":
        # On placement's cycle, as the profiles run (imported here: `gangline.sim.gated` imports this).
        from gangline.sim.gated import GatedEasyBackfill

        return GatedEasyBackfill(
            name, nodes, registry=registry, time_limits=time_limits, default_time_limit_s=default_time_limit_s
        )
    if name == "fifo-gang-best-fit":
        return CorePolicy(
            name, load_profile(FIFO_GANG_BEST_FIT_YAML, registry or placement_registry()), nodes
        )
    raise ValueError(f"unknown baseline {name!r}; the baselines are {', '.join(BASELINES)}")


BASELINES = ("k8s-first-fit", "fifo-gang-best-fit", "easy-backfill")
