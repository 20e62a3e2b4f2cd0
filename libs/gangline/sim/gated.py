"""Gangline's profiles in the simulator, decided by the services' rule: the quota gate, then placement.

What `gangline simulate` runs for a profile (the baselines are `gangline.sim.policies`). The two
stages are the ones the quota and placement services run, from the core, in the order the services
apply them to each input:

* **the gate** (:class:`~gangline.core.charging.QuotaCharges`, the quota service's rule): a job of a
  limited queue is charged when its queue's quota lets it through and keeps the charge until its
  allocation is released; an arrival goes through on the first flavour that fits now or is held;
  after a release that lowers a quota tree's usage, its held jobs go through in fair order (DRF over
  charged usage with a decayed history, half-life ``half_life_s``). Jobs of a queue the queues file
  does not limit (or of no queues file at all) go straight to placement.
* **placement** (:func:`~gangline.core.actions.queueing.placement_cycle`, the placement service's cycle):
  the profile's actions over the jobs let through and not placed yet (no quota: they hold theirs),
  the first ``head`` in line and every later one the free GPUs could hold.

Per input, as the services' bus delivers it: an arrival is gated, and placement cycles if it went
through; a run's end first frees its GPUs and lets placement cycle over the jobs already let through,
then the gate lets the held jobs through, then placement cycles again if any went. The simulator
hands one instant's inputs together, the ends first (in the order the runs started), then the
arrivals (in submit order); they are taken one by one in that order, each end freeing its GPUs in its
turn, which is the order the services' simulator delivers them in. With nothing waiting an end is
taken at once (nothing can be decided differently).

Preemption is the core's, in the cycle (the placement stage may evict, as `CorePolicy` does); the
services run it in their preemption service with the checkpoint protocol, so preemption is where the
two engines still decide differently.

Elastic resizes (the profile's ``elastic`` action: a shrink for a waiting job, a grow into idle GPUs
when nothing waits) are applied as the cycle decides them (:func:`~gangline.core.resize.apply_resize`):
the job's allocation is replaced by one at its new size, a grant that names the one it replaces
(``Grant.resizes``); the job keeps its work (it checkpointed) and its end. The services apply the same
resize once the job acknowledged its checkpoint (``job.resizing``), a checkpoint's time later. While an
elastic job runs below its most workers, placement cycles even when nothing waits, as placement does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gangline.core.actions.queueing import (
    EarliestStart,
    PreemptionPolicy,
    QueueContext,
    Resize,
    RunFacts,
    open_context,
    placement_cycle,
    places_nothing,
)
from gangline.core.charging import DEFAULT_HALF_LIFE_S, QuotaCharges
from gangline.core.defaults import placement_registry
from gangline.core.fairshare import FairShare, Pending, job_line_work
from gangline.core.framework.cycle import apply_plan
from gangline.core.framework.profile import Profile, load_profile
from gangline.core.framework.registry import Registry
from gangline.core.gate_credit import CreditPolicy
from gangline.core.hardware import GpuOffer, Hardware, NodeOffer, WorkerAsk
from gangline.core.model import Allocation, AllocationId, GpuModel, Job, JobId, Node, QueueName, Seconds
from gangline.core.queues import job_request
from gangline.core.quota_gate import Flavour, held_flavours
from gangline.core.resize import apply_resize, may_grow
from gangline.core.snapshot import Snapshot
from gangline.core.waiting import FRONT_OF_LINE
from gangline.queues_file import Queues
from gangline.sim.policies import (
    DEFAULT_TIME_LIMIT_S,
    EASY_BACKFILL_YAML,
    CycleOutcome,
    job_gpus,
    reclaimed_by,
)


@dataclass(frozen=True, slots=True)
class Grant:
    """A job placed: when, and where (the allocation granted)."""

    at: float
    allocation: Allocation
    resizes: str | None = None
    """For an elastic resize: the allocation this grant replaces (released ``resized`` at ``at``)."""


def node_offer(node: Node) -> NodeOffer:
    """What a node's usable GPUs offer, as the core's hardware counts them."""
    gpus = tuple(sorted(GpuOffer(g.model, g.memory_mib, g.mode) for g in node.gpus if g.healthy))
    return NodeOffer(gpus, node.domain, node.leaf, node.spine)


LEND_ROUNDS = 3
"""Rounds of the gate's backfill after one placement try: lend, place, hand back what did not place."""


@dataclass
class GatedPolicy:
    """A profile under the quota gate and placement (see the module docstring)."""

    name: str
    profile: Profile
    nodes: Sequence[Node]
    queues: Queues | None = None
    """The queues file's configuration; None: every queue unlimited (no quota)."""
    half_life_s: float = DEFAULT_HALF_LIFE_S
    head: int = FRONT_OF_LINE
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    fair: bool = True
    """False: no fair share orders placement's line (every share 0), so it is priority, then submit
    time, as priority FIFO reads it (``easy-backfill``)."""
    snapshot: Snapshot = field(init=False)
    granted: list[Grant] = field(init=False, default_factory=list)
    """Every grant, in order (what allocations.log would hold)."""

    def __post_init__(self) -> None:
        self.snapshot = Snapshot(self.nodes)
        self._hardware = Hardware(node_offer(n) for n in self.nodes)
        self._charges: QuotaCharges[Job] | None = None
        if self.queues is not None:
            window = self.profile.settings.gate_credit_s
            self._charges = QuotaCharges(
                self.queues.tree,
                lambda job: (self._flavours(job), ()),
                half_life_s=self.half_life_s,
                starvation_s=self.profile.settings.starvation_s,
                credit=CreditPolicy(window) if window is not None else None,
                run_bound=lambda job: job.run_bound_s,
                expected_release=self._expected_release if self.profile.settings.gate_reserve else None,
            )
        self._submitted: dict[JobId, float] = {}
        self._waiting: dict[JobId, Job] = {}
        """Every job not running: held at the gate or let through, in submit order."""
        self._placeable: dict[JobId, Job] = {}
        """Let through, not placed yet: what placement's cycles see."""
        self._inputs: list[Job | JobId | _Released] = []
        """Inputs not taken yet, in order: a job that arrived, the id of a job whose run ended (its
        GPUs are freed in its turn), or an eviction's release (made already)."""
        self._facts: dict[JobId, RunFacts] = {}
        self._held = 0.0
        self._cycle = 0
        self._shapes: dict[tuple[object, ...], list[Flavour]] = {}
        self._elastic = any(a.name == "elastic" for a in self.profile.actions)
        self._elastic_running: set[JobId] = set()
        """Running elastic jobs (those a grow may concern)."""
        self._resizes = 0
        self._job_flavours: dict[JobId, list[Flavour]] = {}
        """Each waiting job's flavours (its shape's, looked up once: the gate asks on every pass)."""
        self._starts: dict[tuple[object, ...], EarliestStart] = {}
        """Reserve's earliest starts (`QueueContext.start_memo`): each read only on the snapshot version
        it was found on; the run facts change only with the snapshot (a start, a release)."""

    # -- the simulator's calls ----------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        self._submitted.setdefault(job.id, now)
        self._waiting[job.id] = job
        self._inputs.append(job)

    def finish(self, job_id: JobId, now: float) -> None:
        """A run ended: taken in its turn (its GPUs freed then), at once when nothing waits."""
        self._inputs.append(job_id)
        if not self._waiting:
            self._take(now, _Outcome())  # nothing to decide: the order of the instant's ends is moot

    def _release(self, job_id: JobId, now: float) -> str | None:
        """Free the job's GPUs and its charge; the quota tree whose usage that lowered (None: none)."""
        r = self.snapshot.release(job_id)
        if r is None:
            return None
        placed = len(r.allocation.placements)
        self._held -= job_gpus(r.job) * (placed / r.job.workers if placed != r.job.workers else 1)
        self._facts.pop(job_id, None)
        self._elastic_running.discard(job_id)
        return self._charges.release(job_id, now) if self._charges is not None else None

    def limits(self, queue: str) -> bool:
        """Whether the gate charges ``queue``'s jobs (a limited queue of the queues file)."""
        return self._charges is not None and self._charges.limits(queue)

    def pending(self) -> Sequence[Job]:
        return list(self._waiting.values())

    def may_grow(self) -> bool:
        """Whether an elastic job runs below its most workers under a profile that grows it (then a
        release is worth a cycle even when nothing waits)."""
        running = self.snapshot.running
        return self._elastic and any(may_grow(running[j]) for j in self._elastic_running)

    def held_gpus(self) -> float:
        return self._held

    def cycle(self, now: float, new: Sequence[JobId] | None = None) -> CycleOutcome:
        """Take the inputs since the last call, one by one (see the module docstring)."""
        del new
        out = _Outcome()
        self._take(now, out)
        return CycleOutcome(
            tuple(out.started),
            tuple(out.evicted),
            tuple(out.partial),
            tuple(out.problems),
            tuple(out.resized),
            tuple(out.reclaimed),
        )

    def _take(self, now: float, out: _Outcome) -> None:
        while self._inputs:
            inputs, self._inputs = self._inputs, []
            for item in inputs:
                if isinstance(item, Job):
                    if self._gate(item, now):
                        self._place(now, out)
                    else:
                        self._lend(now, out)
                    continue
                lowered = item.lowered if isinstance(item, _Released) else self._release(item, now)
                self._place(now, out)
                if lowered is not None and self._charges is not None:
                    through = self._charges.let_through(lowered, now)
                    for job, _ in through:
                        self._placeable[job.id] = job
                    if through:
                        self._place(now, out)

    # -- the two stages -----------------------------------------------------------------------------

    def _gate(self, job: Job, now: float) -> bool:
        """Whether the arriving job goes to placement now (charged, for a limited queue)."""
        charges = self._charges
        limited = charges is not None and charges.limits(job.queue)
        if limited and charges is not None:
            work = job_line_work(job, self.profile.settings.line_order)
            pending = Pending(job.queue, job.priority, self._submitted[job.id], job.id, job, work)
            if charges.reserves(charges.root(job.queue), now):
                through = charges.arrive_in_turn(pending, now)
                for other, _ in through:
                    self._placeable[other.id] = other
                return bool(through)
            if charges.arrive(pending, now) is None:
                return False
        self._placeable[job.id] = job
        return True

    def _expected_release(self, job_id: JobId, at: float) -> float | None:
        """When a charged job's charge is expected to go: its run's start (``at`` when not placed yet)
        plus its run bound (None: no bound; :class:`~gangline.core.charging.QuotaCharges`)."""
        facts = self._facts.get(job_id)
        job = self._waiting.get(job_id)
        if job is None:
            running = self.snapshot.running.get(job_id)
            if running is None:
                return None
            job = running.job
        bound = job.run_bound_s
        start = facts.started_at if facts is not None and job_id in self.snapshot.running else at
        return None if bound is None else start + bound

    def _flavours(self, job: Job) -> list[Flavour]:
        """The job's flavours its nodes can hold, in the order the quota service tries them (its GPU
        type, else the models its queue's quotas name, then the file's resource order)."""
        known = self._job_flavours.get(job.id)
        if known is not None:
            return known
        shape = (job.queue, job.gpu_type, job.mig_profile, job.gpu_milli, job.workers, job.gpus_per_worker)
        known = self._shapes.get(shape)
        if known is not None:
            self._job_flavours[job.id] = known
            return known
        assert self.queues is not None
        models: list[str] = []
        if job.gpu_type is not None:
            models.append(job.gpu_type)
        else:
            own = tuple(self.queues.tree.spec(QueueName(job.queue)).quotas)
            for r in (*own, *self.queues.resource_order):
                model = r.split("/", 1)[0]
                if model not in models:
                    models.append(model)
        options = [Flavour(m, job_request(job, GpuModel(m))) for m in models]
        fits, _ = held_flavours(self._hardware, WorkerAsk.of(job), options)
        self._shapes[shape] = self._job_flavours[job.id] = fits
        return fits

    def _context(self, jobs: list[Job], now: float) -> QueueContext:
        """Placement's queue facts (no quota: the gate decided), without the explanations, which decide
        nothing and which nothing here reads."""
        ctx = open_context(
            self.snapshot,
            jobs,
            now=now,
            submit_time=self._submitted,
            run_facts=self._facts,
            policy=self.preemption,
        )
        ctx.explain = False
        ctx.start_memo = self._starts
        if not self.fair:
            ctx.fair = FairShare(capacity={}, weights={}, allocation={})
        return ctx

    def _place(self, now: float, out: _Outcome) -> None:
        """One placement cycle over the jobs let through, then, when the gate lends what is charged to
        jobs still unplaced (:mod:`gangline.core.gate_credit`), one more over those it lent it to."""
        self._cycle_once(now, out)
        self._lend(now, out)

    def _lend(self, now: float, out: _Outcome) -> None:
        """The gate's backfill after placement's try (:meth:`QuotaCharges.lend`): held jobs go through on
        what is charged to jobs still unplaced, and any placement does not place at once go back."""
        charges = self._charges
        if charges is None or charges.credit is None:
            return
        tried: set[JobId] = set()
        for _ in range(LEND_ROUNDS):
            lent = charges.lend(now, exclude=tried)
            if not lent:
                return
            for job, _ in lent:
                self._placeable[job.id] = job
            self._cycle_once(now, out)
            for job, _ in lent:
                tried.add(job.id)
                if job.id in self._placeable:  # not placed: the credit goes back, the job to the gate
                    del self._placeable[job.id]
                    charges.unlend(job.id)

    def _cycle_once(self, now: float, out: _Outcome) -> None:
        """One placement cycle over the jobs let through; commit what it decided."""
        if not self._placeable and not self.may_grow():
            return
        self._cycle += 1
        snap = self.snapshot
        waiting = list(self._placeable.values())
        if places_nothing(snap, waiting, self.profile):
            return  # it would only say why they wait, which nothing here reads (its number is used up)
        plan, decisions = placement_cycle(
            snap,
            waiting,
            self._submitted,
            self.profile,
            lambda jobs: self._context(jobs, now),
            head=self.head,
            cycle=self._cycle,
        )
        reclaimed = set(reclaimed_by(plan))
        for e in plan.evicted:
            r = snap.running.get(e.job_id)
            if r is not None:
                # Released before the plan's grants take its GPUs; then back at the gate, keeping
                # its admitted time (a requeue), after the gate has let through what the release allows.
                self._inputs.append(_Released(self._release(e.job_id, now)))
                self.submit(r.job, now)
                out.evicted.append(e.job_id)
                if e.job_id in reclaimed:
                    out.reclaimed.append(e.job_id)
        out.problems += [s.message for s in apply_plan(snap, plan) if not s.ok]
        for p in plan.placed:
            job = p.job
            if job.id not in snap.running or job.id not in self._placeable:
                continue
            del self._placeable[job.id]
            del self._waiting[job.id]
            self._job_flavours.pop(job.id, None)
            out.started.append(job.id)
            if len(p.allocation.placements) < job.fewest_workers:
                out.partial.append(job.id)
            self._held += job_gpus(job) * len(p.allocation.placements) / job.workers
            self._facts[job.id] = RunFacts(started_at=now)
            self.granted.append(Grant(now, p.allocation))
            if job.min_workers is not None:
                self._elastic_running.add(job.id)
            if self._charges is not None:
                self._charges.placed(job.id)
        for resize in decisions.resizes:
            self._resize(resize, now, out)

    def _resize(self, resize: Resize, now: float, out: _Outcome) -> None:
        """Apply an elastic resize the cycle decided: the job's allocation replaced at its new size."""
        running = self.snapshot.running.get(resize.job_id)
        if running is None:
            return
        self._resizes += 1
        new_id = AllocationId(f"{resize.job_id}.r{self._resizes}")
        allocation = apply_resize(self.snapshot, resize, new_id)
        if allocation is None:
            out.problems.append(
                f"resize of {resize.job_id} to {resize.to_workers} workers could not be applied"
            )
            return
        job = running.job
        workers = len(allocation.placements)  # a grow that fell back keeps its old size
        self._held += job_gpus(job) * (workers - resize.from_workers) / job.workers
        self._facts[job.id] = RunFacts(started_at=now)  # the new allocation's run: its minimum runtime anew
        self.granted.append(Grant(now, allocation, resizes=str(running.allocation.id)))
        out.resized.append(job.id)
        if workers < resize.from_workers:
            self._inputs.append(_Released(None))  # GPUs freed (its quota charge stays): placement cycles


@dataclass(frozen=True, slots=True)
class _Released:
    """A release made already (an eviction's): the quota tree whose usage it lowered (None: none)."""

    lowered: str | None


@dataclass
class _Outcome:
    started: list[JobId] = field(default_factory=list)
    evicted: list[JobId] = field(default_factory=list)
    partial: list[JobId] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    resized: list[JobId] = field(default_factory=list)
    reclaimed: list[JobId] = field(default_factory=list)


class GatedEasyBackfill(GatedPolicy):
    """``easy-backfill`` on placement's cycle (:func:`~gangline.core.actions.queueing.placement_cycle`,
    what the placement service runs): the profile ``EASY_BACKFILL_YAML``, no quota gate, priority FIFO
    (no fair share), each job's time limit as its duration hint (its trace's, else the default, never
    its run time) and nothing preemptible (EASY has no preemption); see `gangline.sim.policies`."""

    def __init__(
        self,
        name: str,
        nodes: Sequence[Node],
        *,
        registry: Registry | None = None,
        time_limits: Mapping[JobId, float] | None = None,
        default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    ) -> None:
        profile = load_profile(EASY_BACKFILL_YAML, registry or placement_registry())
        super().__init__(name, profile, nodes, None, fair=False)
        self._limits = dict(time_limits or {})
        self.default_time_limit_s = default_time_limit_s

    def time_limit(self, job_id: JobId) -> float:
        """The time limit ``job_id`` runs under: its trace's, or the default."""
        return self._limits.get(job_id, self.default_time_limit_s)

    def submit(self, job: Job, now: float) -> None:
        hint = Seconds(max(1, math.ceil(self.time_limit(job.id))))
        super().submit(replace(job, duration_hint_s=hint, preemptible=False), now)
