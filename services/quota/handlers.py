"""Quota's decisions (pure): which admitted jobs may go to placement now, on which GPU model, and why
the others wait.

The queues, their quotas per GPU model and their cohorts come from the queue configuration
(:mod:`services.common.queues`); the accounting is the core's :class:`~gangline.core.queues.QuotaLedger`
(borrowing and lending within a cohort) and the order of waiting work is the core's fair order
(:class:`~gangline.core.fairshare.FairOrder`: priority, then DRF dominant share over decayed usage, then
admitted time, then job id).

Charging. A job is charged to its queue from its ``job.queued`` until the allocation of that attempt
is released, for any reason, or the job ends (``job.completed``, ``job.failed``, a final release).
What is charged is remembered per job (the GPU model quota chose and the resource vector), so a
release uncharges exactly that. A requeued job (preempted, node failed: a release, then
``job.requeued``) is uncharged and waits again like a newly admitted job, keeping its admitted time;
a requeue read before its release waits for the release. A job of an unlimited queue is not quota's
business: it is retired as soon as its admission is read (no ``job.queued``), and placement places it once
admitted (one hop less on its way to a grant); one of a queue the configuration does not name fails
(``unknown_queue``).

Hardware. Quota charges a job only to a GPU model whose usable nodes can hold its workers at all (per
node, and inside one domain when its topology is required): the core's :mod:`gangline.core.hardware`
decides, over the :class:`Inventory` folded from ``nodes.inventory`` and ``nodes.health``. A flavour
whose nodes cannot is skipped, and a job no flavour's nodes can hold waits uncharged with a pending
reason naming the model and what its largest node offers (constraint ``hardware``; code
``gang_size``, ``memory``, ``gpu_type``, ``mig_profile``, ``fraction`` or ``topology``). It is not
failed: nodes may register or recover. Whenever what some node offers changes, the waiting jobs of
every tree are let through (below), so a job waiting on one model goes to another once that one's
nodes can hold it. A job already queued stays charged where it is (placement places that attempt on
that model). Until any node has registered every flavour counts (admission admits nothing before).

Deciding. On ``job.admitted`` / ``job.requeued`` of a waiting job its flavours (``Queues.requests``)
are tried in order: the first that fits is charged and ``job.queued`` names its model (``gpu_type``,
for every limited queue, the spec's own type when it named one; None for an unlimited queue). When
none fits it gets ``job.pending`` (code ``quota``), or ``job.failed`` (``exceeds_queue_quota``) when
even an idle cohort could never hold it. Whenever usage in a quota tree drops, the waiting jobs of
every queue of that tree are let through in fair order, best effort (one that does not fit is
skipped; smaller ones behind it may go). The first of those still waiting (``REVIEWS_PER_DECISION``)
are told again why they wait when that changed (:func:`pending_key`: not when only a figure did).

Reclaim and priority. Quota decides who is owed quota, not who gives it back. A waiting job whose
queue would stay within its nominal quota if it ran is owed it: its pending reason says so
(constraint ``reclaim``, ``details["within_nominal"]``, on the GPU model it is owed), and the
preemption service reclaims it from jobs of the cohort that borrow it; any other waiting job's reason
says it waits for quota (constraint ``quota``), and the preemption service may free quota of its own
queue from lower-priority work. The victims are chosen there, by the core's victim search on the
cluster's snapshot (it sees where they run, so the set it frees fits the job), and their releases
lower usage here like any other release.

State is a fold over ``jobs.events`` and ``allocations.log`` (our own ``job.queued`` included), and
the node topics, that does not depend on the order between the topics: per job it counts queued
attempts against the attempts owed (one, plus one per ``job.requeued``) and against the allocations
released. The decayed usage history is advanced with event times (never the wall clock), and a change
read after a later one (another partition, another topic, the restore reading topic by topic) is dated
back to its own time (:func:`~gangline.core.fairshare.backdate`): the same events give the same state
in whatever order they are read. A finished job's record is dropped and only its id
kept (``retired``): any event about it read again changes nothing. The restore also reads quota's own
pending reasons, so a restarted quota does not repeat a pending it already sent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gangline.bus import Outgoing
from gangline.core.fairshare import FairOrder, FairShare, Pending, UsageHistory, advance, backdate
from gangline.core.framework.status import Reason
from gangline.core.hardware import NAME as HARDWARE
from gangline.core.hardware import GpuOffer, Hardware, NodeOffer, WorkerAsk
from gangline.core.model import GpuMode, GpuModel, MiB, TopologyLevel
from gangline.core.queues import QueueName as Queue
from gangline.core.queues import QuotaLedger, Resource
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.ids import derived_id
from gangline.events.jobs import (
    JobAdmitted,
    JobCompleted,
    JobFailed,
    JobPending,
    JobQueued,
    JobRequeued,
    JobSpec,
    PendingReason,
)
from gangline.events.nodes import GpuHealthChanged, NodeFailed, NodeRegistered
from gangline.events.types import AllocationId, JobId, QueueName
from services.common.queues import Queues, request_on
from services.common.topics import TopicNames
from services.quota.status import StatusBoard, queue_statuses

SOURCE = "gangline/quota"
FINAL_RELEASES = frozenset({"completed", "failed", "cancelled"})
QUOTA_EVENT_TYPES = (
    JobAdmitted,
    JobQueued,
    JobRequeued,
    JobCompleted,
    JobFailed,
    AllocationGranted,
    AllocationReleased,
)
NODE_EVENT_TYPES = (NodeRegistered, NodeFailed, GpuHealthChanged)
MAX_TEXT = 2000
"""Longest sentence an event carries."""
REVIEWS_PER_DECISION = 64
"""Jobs still waiting after a let-through whose reason is looked at again (the first in fair order);
those further back keep the reason they were last told until they come this far forward."""
_FIGURES = re.compile(r"[0-9]+")

TreeKey = tuple[bool, str]
"""(limited, name): a quota tree by its root cohort, or an unlimited (or unknown) queue on its own."""


@dataclass(frozen=True, slots=True)
class Charge:
    """What the ledger holds for a job: its queue, the GPU model chosen, and the resources counted."""

    queue: QueueName
    gpu_type: str | None
    request: Mapping[Resource, int]
    limited: bool


@dataclass
class Inventory:
    """The nodes as quota needs them: what each one's usable GPUs offer, counted in the core's
    :class:`~gangline.core.hardware.Hardware` (which GPU models can hold a job's workers at all).

    A fold over ``nodes.inventory`` and ``nodes.health`` that does not depend on the order between
    them: a registration older than the node's latest is read again, not news; it resets the health of
    GPUs reported before it, not after; a node is out from its ``node.failed`` until it registers again.
    Failed and degraded GPUs take no new work, so they are not offered (as placement sees them).
    """

    nodes: dict[str, NodeRegistered] = field(default_factory=dict)
    registered_at: dict[str, datetime] = field(default_factory=dict)
    failed_at: dict[str, datetime] = field(default_factory=dict)
    unusable: dict[str, set[str]] = field(default_factory=dict)
    """Node → its GPUs marked failed or degraded."""
    health_at: dict[tuple[str, str], datetime] = field(default_factory=dict)
    """When each GPU's health last changed."""
    offers: dict[str, NodeOffer] = field(default_factory=dict)
    """What each node is counted for in ``hardware`` now."""
    hardware: Hardware = field(default_factory=Hardware)
    version: int = 0
    """Bumped whenever what some node offers changes."""

    @property
    def known(self) -> bool:
        """Whether any node registered: until then quota cannot tell what the nodes hold (admission
        admits nothing while no node is registered, so such a job is one read before its nodes)."""
        return bool(self.nodes)

    def fold(self, envelope: Envelope) -> bool:
        """Apply one node fact; True when what some node offers changed."""
        data = envelope.data
        if isinstance(data, NodeRegistered):
            latest = self.registered_at.get(data.node)
            if latest is not None and envelope.time < latest:
                return False
            self.nodes[data.node] = data
            self.registered_at[data.node] = envelope.time
            marked = self.unusable.get(data.node)
            if marked:
                marked -= {g for g in marked if self.health_at[(data.node, g)] <= envelope.time}
        elif isinstance(data, NodeFailed):
            self.failed_at[data.node] = max(envelope.time, self.failed_at.get(data.node, envelope.time))
        elif isinstance(data, GpuHealthChanged):
            registered = self.registered_at.get(data.node)
            last = self.health_at.get((data.node, data.gpu))
            stale = (registered is not None and envelope.time < registered) or (
                last is not None and envelope.time < last
            )
            if data.previous == data.state or stale:
                return False  # a repeated-error report, or older than a re-registration or a newer report
            self.health_at[(data.node, data.gpu)] = envelope.time
            marked = self.unusable.setdefault(data.node, set())
            if data.state == "healthy":
                marked.discard(data.gpu)
            else:
                marked.add(data.gpu)
        else:
            return False
        return self._recount(data.node)

    def _recount(self, node: str) -> bool:
        offer = self._offer(node)
        before = self.offers.get(node)
        if offer == before:
            return False
        if before is not None:
            self.hardware.remove(before)
        self.hardware.add(offer)
        self.offers[node] = offer
        self.version += 1
        return True

    def _offer(self, node: str) -> NodeOffer:
        registered = self.nodes.get(node)
        failed = self.failed_at.get(node)
        if registered is None or (failed is not None and failed >= self.registered_at[node]):
            return NodeOffer()
        unusable = self.unusable.get(node, set())
        offered = []
        for gpu in registered.gpus:
            if gpu.id not in unusable:
                mode = GpuMode.MIG if gpu.mig_enabled else GpuMode.WHOLE
                offered.append(GpuOffer(GpuModel(gpu.model), MiB(gpu.memory_mib), mode))
        return NodeOffer(tuple(sorted(offered)), registered.nvlink_domain, registered.leaf, registered.spine)


@dataclass
class QuotaJob:
    job_id: JobId
    spec: JobSpec | None = None
    queued: dict[str, str | None] = field(default_factory=dict)
    """Each ``job.queued`` read (event id → the GPU model it named), in the order read."""
    owed: int = 1
    finished: bool = False
    released: set[AllocationId] = field(default_factory=set)
    admitted_at: datetime | None = None
    """The job.admitted event's time: with the priority, fair share and job id, the order waiting jobs
    are let through. Read from the log, so it does not depend on how a restore interleaved partitions."""
    charge: Charge | None = None
    """What the ledger holds for the job now (None: nothing)."""
    options: list[tuple[str | None, dict[Resource, int]]] | None = None
    """Its flavours (``Queues.requests``), worked out once."""
    held: tuple[int, list[tuple[str | None, dict[Resource, int]]], list[Reason]] | None = None
    """Its flavours the nodes can hold, and why the others cannot, as of an inventory version."""

    @property
    def due(self) -> bool:
        """Whether its latest queued attempt holds quota (queued, not released, not finished)."""
        return self.spec is not None and not self.finished and len(self.queued) > len(self.released)

    @property
    def waiting(self) -> bool:
        """Owed a job.queued (admitted or requeued, not let through yet)."""
        return self.spec is not None and not self.finished and len(self.queued) < self.owed

    @property
    def eligible(self) -> bool:
        """Waiting, and its previous attempt's allocation is released: it may be let through."""
        return self.waiting and not self.due


@dataclass
class QuotaState:
    topics: TopicNames
    queues: Queues
    half_life_s: float = 3600.0
    """Fair share's usage half-life; 0: plain DRF on what is charged now."""
    jobs: dict[JobId, QuotaJob] = field(default_factory=dict)
    retired: set[JobId] = field(default_factory=set)
    """Finished jobs, dropped from ``jobs``: nothing read about them any more changes the state."""
    waiting: dict[TreeKey, dict[JobId, QuotaJob]] = field(default_factory=dict)
    """Eligible jobs (owed a job.queued, nothing charged), per quota tree."""
    last_pending: dict[JobId, str] = field(default_factory=dict)
    """Waiting job → what the last pending reason sent said, figures aside (:func:`pending_key`)."""
    history: UsageHistory = field(default_factory=lambda: UsageHistory(as_of=0.0))
    inventory: Inventory = field(default_factory=Inventory)
    status: StatusBoard = field(default_factory=StatusBoard)
    """What quota last published on queues.status (services/quota/status.py)."""
    ledger: QuotaLedger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = QuotaLedger(self.queues.tree)
        tree = self.queues.tree
        self._limited_queues = [Queue(q) for q in tree.queue_names()]
        self._tree_queues: dict[TreeKey, list[Queue]] = {}
        for q in self._limited_queues:
            self._tree_queues.setdefault((True, tree.root_cohort_of(q)), []).append(q)
        self._capacity = {r: tree.total_nominal(r) for r in sorted(tree.resources)}

    # -- the fold ------------------------------------------------------------------------------

    def restore(self, envelope: Envelope) -> None:
        """Fold a fact read from the log at start; quota's own pending reasons say what it last told."""
        if isinstance(envelope.data, JobPending) and envelope.source == SOURCE:
            self._restore_pending(envelope.data)
            return
        if self.status.restore(envelope):
            return
        self.fold(envelope)

    def fold(self, envelope: Envelope, *, at: datetime | None = None) -> TreeKey | None:
        """Apply one fact; the quota tree whose usage it lowered (None when it lowered none).

        ``at`` is the event time the usage history is advanced to (default: the envelope's time); a
        decision folds its own output at its cause's time, never at the clock's.
        """
        if isinstance(envelope.data, NODE_EVENT_TYPES):
            self.inventory.fold(envelope)
            return None
        job = self._fold(envelope)
        if job is None:
            return None
        return self._refresh(job, at if at is not None else envelope.time)

    def _fold(self, envelope: Envelope) -> QuotaJob | None:
        data = envelope.data
        if not isinstance(data, QUOTA_EVENT_TYPES) or data.job_id in self.retired:
            return None
        job = self.jobs.get(data.job_id)
        if job is None:
            job = self.jobs[data.job_id] = QuotaJob(data.job_id)
        if isinstance(data, JobAdmitted):
            if Queue(data.spec.queue) in self.queues.unlimited:
                # Nothing to decide: placement takes it once admitted. Retired at once, so whatever is
                # read about it later (its grant, its end) changes nothing here.
                del self.jobs[data.job_id]
                self.retired.add(data.job_id)
                return None
            if job.spec is None:
                job.spec = data.spec
                job.admitted_at = envelope.time
        elif isinstance(data, JobQueued):
            job.queued.setdefault(envelope.id, data.gpu_type)
        elif isinstance(data, JobRequeued):
            job.owed = max(job.owed, data.attempt)
        elif isinstance(data, JobCompleted | JobFailed):
            job.finished = True
        elif isinstance(data, AllocationGranted):
            return job  # placed: nothing changes here (it was charged from its job.queued)
        elif data.allocation_id not in job.released:
            job.released.add(data.allocation_id)
            if data.reason in FINAL_RELEASES:
                job.finished = True
        return job

    def _refresh(self, job: QuotaJob, at: datetime) -> TreeKey | None:
        """Bring the ledger and the indexes in line with the job's facts; the tree whose usage dropped."""
        dropped: TreeKey | None = None
        want = self._charge_of(job)
        if want != job.charge:
            # A change older than the history (read after a later one: another partition, another topic,
            # the restore's order) is dated back to its own time, so the order facts are read in is moot.
            late = self.half_life_s > 0 and at.timestamp() < self.history.as_of
            before = self._allocation() if late else None
            if not late:
                self._advance(at)
            if job.charge is not None:
                if job.charge.limited:
                    self.ledger.release(Queue(job.charge.queue), job.charge.request)
                dropped = self.tree_of(job.charge.queue)
            if want is not None and want.limited:
                self.ledger.admit(Queue(want.queue), want.request)
            job.charge = want
            if before is not None:
                self.history = backdate(
                    self.history,
                    before,
                    self._allocation(),
                    since=at.timestamp(),
                    half_life_s=self.half_life_s,
                )
        if job.spec is not None:
            tree = self.tree_of(job.spec.queue)
            _index(self.waiting, tree, job, job.eligible)
        if not job.waiting:
            self.last_pending.pop(job.job_id, None)
        if job.finished:
            del self.jobs[job.job_id]
            self.retired.add(job.job_id)
        return dropped

    def _charge_of(self, job: QuotaJob) -> Charge | None:
        """What the job's facts say the ledger should hold for it."""
        if not job.due or job.spec is None:
            return None
        spec = job.spec
        model = next(reversed(job.queued.values()))
        if not self.queues.limited(spec.queue):
            return Charge(spec.queue, model, {}, limited=False)
        if model is None:  # a job.queued naming no model (written before quota chose one): the first
            model = spec.gpu_type or next((m for m, _ in self.queues.requests(spec)), None)
        request = request_on(spec, model) if model is not None else {}
        return Charge(spec.queue, model, request, limited=True)

    def _advance(self, at: datetime) -> None:
        """Move the decayed usage to ``at`` (an event time; never backwards) with what was charged."""
        now = max(self.history.as_of, at.timestamp())
        if self.half_life_s <= 0:
            self.history = UsageHistory(as_of=now)
            return
        self.history = advance(self.history, self._allocation(), now=now, half_life_s=self.half_life_s)

    def _allocation(self, queues: Iterable[Queue] | None = None) -> dict[Queue, dict[Resource, int]]:
        chosen = self._limited_queues if queues is None else queues
        return {q: v for q in chosen if (v := self.ledger.usage_vector(q))}

    def _restore_pending(self, pending: JobPending) -> None:
        job = self.jobs.get(pending.job_id)
        if job is None or not job.eligible:
            return
        reason = pending.reasons[0]
        if reason.constraint == HARDWARE or reason.code == "quota":
            self.last_pending[job.job_id] = pending_key(reason)

    # -- queries -------------------------------------------------------------------------------

    def tree_of(self, queue: str) -> TreeKey:
        if self.queues.limited(queue):
            return (True, self.queues.tree.root_cohort_of(Queue(queue)))
        return (False, queue)

    def options(self, job: QuotaJob) -> list[tuple[str | None, dict[Resource, int]]]:
        """The job's flavours in the order to try them: (GPU model, what it is charged)."""
        if job.options is None:
            assert job.spec is not None
            job.options = list(self.queues.requests(job.spec))
        return job.options

    def held_options(
        self, job: QuotaJob
    ) -> tuple[list[tuple[str | None, dict[Resource, int]]], list[Reason]]:
        """The job's flavours whose model's nodes can hold its workers (the core's
        :meth:`~gangline.core.hardware.Hardware.holds`), and why each of the others cannot.

        All of them while no node has registered (:attr:`Inventory.known`).
        """
        inventory = self.inventory
        if not inventory.known:
            return self.options(job), []
        if job.held is None or job.held[0] != inventory.version:
            assert job.spec is not None
            ask = _ask(job.spec)
            fits: list[tuple[str | None, dict[Resource, int]]] = []
            misfits: list[Reason] = []
            for model, request in self.options(job):
                status = inventory.hardware.holds(GpuModel(model), ask) if model is not None else None
                if status is None or status.ok:
                    fits.append((model, request))
                else:
                    misfits.extend(status.reasons)
            job.held = (inventory.version, fits, misfits)
        return job.held[1], job.held[2]

    def first_fit(
        self, job: QuotaJob, too_big: dict[tuple[Queue, Resource], int] | None = None
    ) -> tuple[str | None, dict[Resource, int]] | None:
        """The first flavour of an eligible job that its queue's quota admits now (model, request), of
        those whose nodes can hold it.

        ``too_big`` remembers, within one let-through (where room only shrinks), the smallest request
        of one resource found not to fit a queue, so larger ones are not checked again.
        """
        assert job.spec is not None
        if not self.queues.limited(job.spec.queue):
            return (None, {})
        queue = Queue(job.spec.queue)
        for model, request in self.held_options(job)[0]:
            single = next(iter(request.items())) if len(request) == 1 else None
            if (
                single is not None
                and too_big is not None
                and single[1] >= too_big.get((queue, single[0]), 1 << 62)
            ):
                continue
            if self.ledger.fits(queue, request):
                return (model, request)
            if single is not None and too_big is not None:
                too_big[(queue, single[0])] = single[1]
        return None

    def fair_share(self, tree: TreeKey, at: datetime) -> FairShare:
        """Dominant shares of the tree's queues: charged usage now, and the history decayed to ``at``."""
        queues = self._tree_queues.get(tree, [])
        history: UsageHistory | None = None
        if self.half_life_s > 0:
            now = max(self.history.as_of, at.timestamp())
            history = advance(self.history, self._allocation(), now=now, half_life_s=self.half_life_s)
        return FairShare(
            capacity=self._capacity,
            weights={q: self.queues.tree.weight(q) for q in queues},
            allocation=self._allocation(queues),
            history=history,
        )


def _ask(spec: JobSpec) -> WorkerAsk:
    """What one worker of ``spec`` needs of a GPU model, and how many workers at least."""
    return WorkerAsk(
        workers=spec.min_workers or spec.workers,
        gpus=spec.gpus_per_worker,
        memory_mib=spec.gpu_memory_mib,
        mig_profile=spec.mig_profile,
        milli=spec.gpu_fraction_milli,
        within=TopologyLevel.parse(spec.topology.level)
        if spec.topology is not None and spec.topology.mode == "required"
        else None,
    )


def _index(index: dict[TreeKey, dict[JobId, QuotaJob]], tree: TreeKey, job: QuotaJob, member: bool) -> None:
    if member:
        index.setdefault(tree, {})[job.job_id] = job
        return
    jobs = index.get(tree)
    if jobs is not None:
        jobs.pop(job.job_id, None)
        if not jobs:
            del index[tree]


# -- decisions -------------------------------------------------------------------------------------


def decide(envelope: Envelope, state: QuotaState, *, now: datetime) -> list[Outgoing]:
    """Fold one event and decide what it allows: queue or hold the job it admits, let others through."""
    data = envelope.data
    if isinstance(data, NODE_EVENT_TYPES):
        reconsidered = _reconsider(state, envelope, now) if state.inventory.fold(envelope) else []
        return reconsidered + queue_statuses(state, envelope, now)
    dropped = state.fold(envelope)
    out: list[Outgoing] = []
    if isinstance(data, JobAdmitted | JobRequeued):
        job = state.jobs.get(data.job_id)
        if job is not None and job.eligible:
            out += _admit_or_hold(state, job, envelope, now)
    if dropped is not None:
        out += _let_through(state, dropped, envelope, now)
    return out + queue_statuses(state, envelope, now)


def _admit_or_hold(state: QuotaState, job: QuotaJob, cause: Envelope, now: datetime) -> list[Outgoing]:
    spec = job.spec
    assert spec is not None
    if not state.queues.known(spec.queue):
        known = ", ".join(state.queues.names())
        why = f"queue {spec.queue} is not in the queue configuration; the queues are: {known}"
        return _fail(state, job, "unknown_queue", why, cause, now)
    never = state.queues.can_ever_fit(spec)
    if never is not None:
        return _fail(state, job, "exceeds_queue_quota", never, cause, now)
    fit = state.first_fit(job)
    if fit is not None:
        return [_queue(state, job, fit[0], cause, now)]
    fair = state.fair_share(state.tree_of(spec.queue), cause.time)
    return _hold(state, job, fair, cause, now)


def _reconsider(state: QuotaState, cause: Envelope, now: datetime) -> list[Outgoing]:
    """What the nodes can hold changed: every tree's waiting jobs are let through (or told why not)."""
    out: list[Outgoing] = []
    for tree in sorted(state.waiting):
        out += _let_through(state, tree, cause, now)
    return out


def _let_through(state: QuotaState, tree: TreeKey, cause: Envelope, now: datetime) -> list[Outgoing]:
    """Usage in ``tree`` dropped: its waiting jobs go in fair order while they fit; the rest are told why."""
    waiting = list(state.waiting.get(tree, {}).values())
    if not waiting:
        return []
    fair = state.fair_share(tree, cause.time)
    order = FairOrder((_pending_item(j) for j in waiting), fair)
    out: list[Outgoing] = []
    still: list[QuotaJob] = []
    too_big: dict[tuple[Queue, Resource], int] = {}
    while (item := order.next()) is not None:
        job = item.item
        fit = state.first_fit(job, too_big)
        if fit is None:
            order.skipped()
            still.append(job)
            continue
        order.admitted(fit[1])
        out.append(_queue(state, job, fit[0], cause, now))
    for job in still[:REVIEWS_PER_DECISION]:
        out += _hold(state, job, fair, cause, now)
    return out


def _pending_item(job: QuotaJob) -> Pending[QuotaJob]:
    assert job.spec is not None
    admitted = job.admitted_at.timestamp() if job.admitted_at is not None else math.inf
    return Pending(Queue(job.spec.queue), job.spec.priority, admitted, job.job_id, job)


def _queue(state: QuotaState, job: QuotaJob, model: str | None, cause: Envelope, now: datetime) -> Outgoing:
    assert job.spec is not None
    event = JobQueued(job_id=job.job_id, queue=job.spec.queue, gpu_type=model)
    envelope = _envelope(event, cause.id, "queued", now)
    state.fold(envelope, at=cause.time)  # charge it now, so the next decision sees it
    return (state.topics.events, envelope)


def _fail(
    state: QuotaState, job: QuotaJob, code: str, why: str, cause: Envelope, now: datetime
) -> list[Outgoing]:
    """A job its queue could never hold would wait forever: it fails now, saying why."""
    failed = JobFailed(job_id=job.job_id, code=code, reason=_sentence(why))
    envelope = _envelope(failed, cause.id, "failed-quota", now)
    dropped = state.fold(envelope, at=cause.time)
    out: list[Outgoing] = [(state.topics.events, envelope)]
    if dropped is not None:
        out += _let_through(state, dropped, cause, now)
    return out


def _hold(
    state: QuotaState, job: QuotaJob, fair: FairShare, cause: Envelope, now: datetime
) -> list[Outgoing]:
    """``job.pending`` for a job that does not fit, when its reason changed (see :func:`pending_key`)."""
    reason = _reason(state, job, fair)
    key = pending_key(reason)
    if state.last_pending.get(job.job_id) == key:
        return []
    state.last_pending[job.job_id] = key
    event = JobPending(job_id=job.job_id, reasons=(reason,))
    return [(state.topics.events, _envelope(event, cause.id, "pending", now))]


def pending_key(reason: PendingReason) -> str:
    """What makes a pending reason news: its constraint and its sentence with the figures left out.

    Every release changes some figure ("uses 12 of its 16"), and each waiting job would be told again
    on every release; it is told when what blocks it changes (another resource, the cohort rather
    than its own quota, whether it is owed its nominal quota), and the figures it gets then are the
    current ones.
    """
    return f"{reason.code}/{reason.constraint}: {_FIGURES.sub('#', reason.message)}"


def _reason(state: QuotaState, job: QuotaJob, fair: FairShare) -> PendingReason:
    """Why the job's queue cannot hold it now, per flavour its nodes can hold, with the figures of the
    first; and why the others' nodes cannot (:func:`_hardware_reason` when no flavour's can)."""
    spec = job.spec
    assert spec is not None
    queue = Queue(spec.queue)
    ledger = state.ledger
    options, misfits = state.held_options(job)
    if not options:
        return _hardware_reason(spec, misfits)
    checks = [(model, ledger.check(queue, request)) for model, request in options]
    if len(checks) == 1 and not misfits:
        message = checks[0][1].reason
    else:
        message = "; ".join(
            [f"on {model}: {check.reason}" for model, check in checks]
            + [f"{r.details['gpu_type']} cannot hold it: {r.message}" for r in misfits]
        )
    model, request = options[0]
    short = next(
        (r for r in sorted(request) if request[r] > ledger.available(queue, r)), next(iter(sorted(request)))
    )
    needed = request[short]
    missing = needed - max(0, ledger.available(queue, short))
    details: dict[str, int | str | bool] = {
        "queue": spec.queue,
        "gpu_type": model or "any",
        "resource": short,
        "needed": needed,
        "used": ledger.usage(queue, short),
        "nominal": state.queues.tree.nominal(queue, short),
        "cohort_can_lend": ledger.cohort_lendable(queue, short),
        "fair_share": _sentence(fair.describe(queue)),
    }
    message = message or f"queue {spec.queue} cannot hold this job now"
    owed = (
        next((m for m, r in options if ledger.within_nominal(queue, r)), None)
        if state.queues.limited(spec.queue)
        else None
    )
    details["within_nominal"] = owed is not None
    if owed is None:
        return PendingReason(
            code="quota",
            constraint="quota",
            message=_sentence(message),
            details=details,
            unblock=_sentence(
                f"wait until {missing} more {short} is free to queue {spec.queue} or its cohort, or "
                "lower-priority preemptible work of the queue gives it back (the preemption service asks)"
            ),
        )
    # Within its nominal quota: what it is owed is lent to other queues of the cohort.
    details["gpu_type"] = owed
    on = f" on {owed}" if owed != model else ""
    return PendingReason(
        code="quota",
        constraint="reclaim",
        message=_sentence(
            f"{message}; queue {spec.queue} is owed this within its nominal quota{on}: the cohort lent it "
            "to other queues, and the preemption service reclaims it from their preemptible jobs"
        ),
        details=details,
        unblock=_sentence("jobs borrowing the cohort's quota checkpoint and release their GPUs"),
    )


def _hardware_reason(spec: JobSpec, misfits: list[Reason]) -> PendingReason:
    """Why no GPU model the job may be charged to has nodes that can hold its workers: it waits, not
    charged, until nodes that can register or recover (the figures are the first model's)."""
    first = misfits[0]
    if len(misfits) == 1:
        message = first.message
    else:
        message = "; ".join(f"on {r.details['gpu_type']}: {r.message}" for r in misfits)
    models = ", ".join(str(r.details["gpu_type"]) for r in misfits)
    return PendingReason(
        code=first.code.value,
        constraint=HARDWARE,
        message=_sentence(message),
        details={"queue": spec.queue, **first.details},
        unblock=_sentence(
            f"a {models} node that can hold its workers registers, or its GPUs recover; "
            "or ask for fewer GPUs per worker"
        ),
    )


def _sentence(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _envelope(event: Event, cause: str, kind: str, now: datetime) -> Envelope:
    return make_envelope(event, event_id=derived_id(cause, kind, event.subject()), source=SOURCE, time=now)
