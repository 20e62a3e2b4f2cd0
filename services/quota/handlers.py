"""Quota's decisions (pure): which admitted jobs may go to placement now, on which GPU model, and why
the others wait.

The queues, their quotas per GPU model and their cohorts come from the queue configuration
(:mod:`services.common.queues`); the accounting is the core's :class:`~gangline.core.queues.QuotaLedger`
(borrowing and lending within a cohort), and who is let through, on which model, in which order and
why the others wait is the core's quota gate (:mod:`gangline.core.quota_gate`: fair order by priority,
then DRF dominant share over decayed usage, then admitted time, then job id; the rule the core cycle's
fair order runs too). This module folds the facts, calls the gate and writes what it decided.

Charging. A job is charged to its queue from its ``job.queued`` until the allocation of that attempt
is released, for any reason but an elastic resize (``resized``: the run goes on at another size, in
the grant that names it), or the job ends (``job.completed``, ``job.failed``, a final release).
What is charged is remembered per job (the GPU model quota chose and the resource vector), so a
release uncharges exactly that. A requeued job (preempted, node failed: a release, then
``job.requeued``) is uncharged and waits again like a newly admitted job, keeping its admitted time;
a requeue read before its release waits for the release. A job of an unlimited queue is not quota's
business: it is retired as soon as its admission is read (no ``job.queued``), and placement places it once
admitted (one hop less on its way to a grant); one of a queue the configuration does not name fails
(``unknown_queue``).

Hardware. Quota charges a job only to a GPU model whose usable nodes can hold its workers at all (per
node, and inside one domain when its topology is required): the core's :mod:`gangline.core.hardware`
decides, over the :class:`Inventory` folded from ``nodes.inventory``, ``nodes.health`` and
``nodes.operator`` (a cordoned or drained node holds nothing new, as placement sees it). A flavour
whose nodes cannot is skipped, and a job no flavour's nodes can hold waits uncharged with a pending
reason naming the model and what its largest node offers (constraint ``hardware``; code
``gang_size``, ``memory``, ``gpu_type``, ``mig_profile``, ``fraction`` or ``topology``). It is not
failed: nodes may register or recover. Whenever what some node offers changes, the waiting jobs of
every tree are let through (below), so a job waiting on one model goes to another once that one's
nodes can hold it. A job already queued and not placed yet whose model's nodes cannot hold it any
more (drained, failed, gone) moves: a ``job.queued`` naming another model it may be charged to and its
quota admits, that ``replaces`` the one it was queued with (the same attempt; placement places it
there), or, while none admits it, it stays charged and is looked at again whenever quota or the nodes
change. Until any node has registered every flavour counts (admission admits nothing before).

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

State is the one lifecycle fold (:class:`~gangline.fold.cluster.ClusterFold`) over ``jobs.events`` and
``allocations.log`` (our own ``job.queued`` included), and the node topics, which does not depend on the
order between the topics: per job quota counts queued attempts against the attempts owed (one, plus one
per ``job.requeued``) and against the allocations released. The decisions are the core's
:class:`~gangline.core.charging.QuotaCharges` (the object the core's simulator decides with): it holds
the ledger, the held jobs in the gate's lines and the fair shares; this module tells it what the fold
says is charged and who waits, asks it, and writes the answer as events. The decayed usage counts each
attempt's charge from the time of its ``job.queued`` to the time of what ended it (its release, the
requeue written with it, the job's end; :meth:`QuotaState.usage_steps`), never the wall clock nor the
time it was read, in an integral whose sums do not depend on the order of their terms
(:class:`~gangline.core.fairshare.UsageIntegral`): the same events give the same state, bit for bit, in
whatever order they are read (another partition, the restore reading topic by topic, a snapshot and its
tail). Fair shares are worked out at the time of the event decided on. A job the fold retired (finished,
its grants released) and a job of an unlimited queue are ``retired`` here: any event about it read again
changes nothing, and the select skips it. The restore also reads quota's own pending reasons, so a
restarted quota does not repeat a pending it already sent.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar

from gangline.bus import Outgoing
from gangline.core.charging import Charge, QuotaCharges, usage_steps
from gangline.core.fairshare import FairShare, Pending, Step, job_line_work
from gangline.core.framework.status import Reason
from gangline.core.hardware import NAME as HARDWARE
from gangline.core.hardware import Hardware, HoldsWorkers, NodeOffer
from gangline.core.model import GpuModel
from gangline.core.model import JobId as CoreJobId
from gangline.core.pools import PooledHardware, PoolLayout, route
from gangline.core.queues import QueueName as Queue
from gangline.core.queues import QuotaLedger, Resource
from gangline.core.quota_gate import (
    Flavour,
    HoldReason,
    WaitingLines,
    held_flavours,
    sentence,
    stranded_move,
)
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
    JobRouted,
    JobSpec,
    PendingReason,
)
from gangline.events.nodes import GpuHealthChanged, NodeCordoned, NodeFailed, NodeRegistered, NodeUncordoned
from gangline.events.queues import QuotaTicked
from gangline.events.types import JobId, NodeId
from gangline.fold.adapter import node_offer, pool_labels, worker_ask
from gangline.fold.cluster import FINAL_RELEASES, ClusterFold, JobRecord
from services.common.queues import Queues, request_on
from services.common.topics import TopicNames
from services.quota.status import StatusBoard, queue_statuses

SOURCE = "gangline/quota"
QUOTA_EVENT_TYPES = (
    JobAdmitted,
    JobQueued,
    JobRequeued,
    JobCompleted,
    JobFailed,
    AllocationGranted,
    AllocationReleased,
)
NODE_EVENT_TYPES = (NodeRegistered, NodeFailed, GpuHealthChanged, NodeCordoned, NodeUncordoned)
REVIEWS_PER_DECISION = 64
"""Jobs still waiting after a let-through whose reason is looked at again (the first in fair order);
those further back keep the reason they were last told until they come this far forward."""
_FIGURES = re.compile(r"[0-9]+")

_DATED = (JobAdmitted, JobQueued, JobRequeued, JobCompleted, JobFailed, AllocationReleased)
"""The facts :meth:`QuotaState.usage_steps` reads (a grant changes no charge's dates)."""

TreeKey = tuple[bool, str]
"""(limited, name): a quota tree by its root cohort, or an unlimited (or unknown) queue on its own."""


@dataclass
class Inventory:
    """The nodes as quota needs them: what each one's usable GPUs offer, counted in the core's
    :class:`~gangline.core.hardware.Hardware` (which GPU models can hold a job's workers at all).

    Read off the one lifecycle fold (``cluster``: ``nodes.inventory``, ``nodes.health`` and
    ``nodes.operator``, folded so the order between them does not matter): a node is out from its
    ``node.failed`` until it registers again, while an operator's cordon or drain stands (the fold's
    :meth:`~gangline.fold.cluster.ClusterFold.cordoned`, as placement's snapshot marks it), or when the
    core cannot model its hardware; failed and degraded GPUs take no new work, so they are not offered
    (as placement sees them).
    """

    cluster: ClusterFold
    offers: dict[str, NodeOffer] = field(default_factory=dict)
    """What each node is counted for in ``hardware`` now."""
    hardware: Hardware = field(default_factory=Hardware)
    version: int = 0
    """Bumped whenever what some node offers changes."""
    layout: PoolLayout | None = None
    """The pools (None: one pool, the whole cluster); with them, what each pool's nodes offer too."""
    node_pool: dict[str, str] = field(default_factory=dict)
    """Each counted node's pool (with ``layout``; a node whose label names no pool is in none)."""
    pooled: PooledHardware = field(default_factory=PooledHardware)
    """``hardware`` per pool (with ``layout``): whether one pool can hold a job whole."""
    pool_gpus: dict[str, Counter[GpuModel]] = field(default_factory=dict)
    """Each pool's usable GPUs per model (with ``layout``): the room routing compares."""

    @property
    def known(self) -> bool:
        """Whether any node registered: until then quota cannot tell what the nodes hold (admission
        admits nothing while no node is registered, so such a job is one read before its nodes)."""
        return bool(self.cluster.registered_at)

    def fold(self, envelope: Envelope) -> bool:
        """Apply one node fact; True when what some node offers changed."""
        data = envelope.data
        if not isinstance(data, NODE_EVENT_TYPES):
            return False
        self.cluster.fold(envelope)
        return self._recount(data.node)

    def _recount(self, node: str) -> bool:
        offer = self._offer(NodeId(node))
        before = self.offers.get(node)
        if offer == before:
            return False
        if before is not None:
            self.hardware.remove(before)
        self.hardware.add(offer)
        self.offers[node] = offer
        if self.layout is not None:
            self._recount_pool(node, before, offer)
        self.version += 1
        return True

    def _recount_pool(self, node: str, before: NodeOffer | None, offer: NodeOffer) -> None:
        """Move the node's offer in its pool's counts (its pool may change with a re-registration)."""
        assert self.layout is not None
        old = self.node_pool.pop(node, None)
        if old is not None and before is not None:
            self._count_in_pool(old, before, -1)
        registered = self.cluster.nodes.get(NodeId(node))
        pool = self.layout.pool_of(pool_labels(registered)) if registered is not None else old
        if pool is not None:
            self.node_pool[node] = pool
            self._count_in_pool(pool, offer, 1)

    def _count_in_pool(self, pool: str, offer: NodeOffer, delta: int) -> None:
        if delta > 0:
            self.pooled.add(pool, offer)
        else:
            self.pooled.remove(pool, offer)
        gpus = self.pool_gpus.setdefault(pool, Counter())
        for gpu in offer.gpus:
            gpus[gpu.model] += delta

    def pools_loaded(self) -> None:
        """After a snapshot is loaded: each pool's counts from the saved offers and pools."""
        self.pooled = PooledHardware()
        self.pool_gpus = {}
        for node, pool in sorted(self.node_pool.items()):
            offer = self.offers.get(node)
            if offer is not None:
                self._count_in_pool(pool, offer, 1)

    def _offer(self, node: NodeId) -> NodeOffer:
        cluster = self.cluster
        registered = cluster.nodes.get(node)
        if registered is None or cluster.cordoned(node):
            return NodeOffer()
        unusable = cluster.failed_gpus.get(node, set()) | cluster.degraded_gpus.get(node, set())
        return node_offer(registered, frozenset(unusable))


@dataclass
class QuotaJob:
    """What quota keeps of a job beyond its lifecycle record (the fold's): what is charged for it, its
    flavours, and the id of the ``job.queued`` its attempt was last queued with."""

    record: JobRecord
    charge: Charge | None = None
    """What the ledger holds for the job now (None: nothing)."""
    options: list[Flavour] | None = field(default=None, compare=False)
    """Its flavours (``Queues.requests``), worked out once."""
    held: tuple[int, list[Flavour], list[Reason]] | None = field(default=None, compare=False)
    """Its flavours the nodes can hold, and why the others cannot, as of an inventory version."""
    latest_queued: str | None = None
    """The id of the latest ``job.queued`` read (None: none)."""
    gate: tuple[int, list[Flavour], list[Reason]] | None = field(default=None, compare=False)
    """What the gate may let it through on, and why its other flavours' nodes cannot hold it, as of an
    inventory version (:meth:`QuotaState.gate_options`)."""
    pending: tuple[JobSpec, datetime | None, Pending[QuotaJob]] | None = field(default=None, compare=False)
    """Its place in its queue's line, as of its spec and admitted time (:func:`_pending_item`)."""
    starts: dict[str, tuple[float, str | None, str | None]] = field(default_factory=dict)
    """Each ``job.queued`` read: its id → (its time, the GPU model it names, the one it ``replaces``)."""
    ends: dict[str, float] = field(default_factory=dict)
    """Each allocation released: its id → when (the earliest release read)."""
    requeues: dict[int, float] = field(default_factory=dict)
    """Each ``job.requeued``: the attempt it is owed → when (the earliest read). Written with the
    release of the attempt before, at the same time (preemption, node_health), on jobs.events: a restore
    reads it before that release, or without it once the job has retired."""
    finished_at: float | None = None
    """When the job ended (the earliest end read: ``job.completed``, ``job.failed``, a final release)."""
    steps: tuple[Step, ...] = ()
    """The usage changes of its charges, dated by those facts (:meth:`QuotaState.usage_steps`), as
    counted in the decayed history."""

    @property
    def job_id(self) -> JobId:
        return self.record.job_id

    @property
    def spec(self) -> JobSpec | None:
        return self.record.spec

    @property
    def admitted_at(self) -> datetime | None:
        """The job.admitted event's time: with the priority, fair share and job id, the order waiting
        jobs are let through. Read from the log, so it does not depend on how a restore interleaved."""
        return self.record.admitted_at

    @property
    def queued(self) -> set[str]:
        """The ``job.queued`` of its attempts read (moves aside)."""
        return self.record.queued

    @property
    def attempts(self) -> int:
        """The attempts queued."""
        return len(self.record.queued)

    @property
    def due(self) -> bool:
        """Whether its latest queued attempt holds quota (queued, not released, not finished)."""
        r = self.record
        return r.spec is not None and not r.finished and len(r.queued) > r.attempts_released()

    @property
    def unplaced(self) -> bool:
        """Charged (``due``) and its latest attempt not granted yet (placement has not placed it)."""
        return self.due and self.record.attempts_granted() < self.attempts

    @property
    def waiting(self) -> bool:
        """Owed a job.queued (admitted or requeued, not let through yet)."""
        r = self.record
        return r.spec is not None and not r.finished and len(r.queued) < r.requeued_attempt

    @property
    def eligible(self) -> bool:
        """Waiting, and its previous attempt's allocation is released: it may be let through."""
        return self.waiting and not self.due


class _Settled(AbstractSet[JobId]):
    """The jobs nothing read about changes quota's state any more (its select skips their records):
    those the lifecycle fold retired and those of unlimited queues. It reads them off the state each time,
    so a state loaded from a snapshot (new sets in its fields) is still what the select was given."""

    __slots__ = ("_state",)

    def __init__(self, state: QuotaState) -> None:
        self._state = state

    def __contains__(self, job_id: object) -> bool:
        state = self._state
        if job_id in state.cluster.retired:
            return True
        # With pools an unlimited queue's job is read until it ends: its routing and its pool's load.
        return job_id in state.unlimited and (
            state.pools is None or (job_id in state.routed and job_id not in state.routed_live)
        )

    def __iter__(self) -> Iterator[JobId]:
        yield from self._state.cluster.retired
        yield from self._state.unlimited

    def __len__(self) -> int:
        return len(self._state.cluster.retired) + len(self._state.unlimited)


@dataclass
class QuotaState:
    topics: TopicNames
    queues: Queues
    half_life_s: float = 3600.0
    """Fair share's usage half-life; 0: plain DRF on what is charged now."""
    starvation_s: float | None = None
    """The profile's starvation bound: a job admitted longer ago goes before fair order, oldest first."""
    line_order: str = "submit"
    """The profile's ``line_order``: how each queue's line orders its jobs (gangline.core.fairshare)."""
    gate_reserve: bool = False
    """The profile's ``gate_reserve``: quota is reserved for the oldest starving job the gate holds."""
    cluster: ClusterFold = field(default_factory=ClusterFold)
    """The one lifecycle fold: every job's attempts, grants and ends, and the nodes."""
    jobs: dict[JobId, QuotaJob] = field(default_factory=dict)
    """Quota's own facts per job of a limited queue, while it is not finished."""
    unlimited: set[JobId] = field(default_factory=set)
    """Jobs of unlimited queues: not quota's business (placement takes them once admitted)."""
    pools: PoolLayout | None = None
    """The pools (None: one pool). With pools every job quota lets through, and every job of an unlimited
    queue, is routed to one pool at its admission (``job.routed``: :func:`_route_admitted`)."""
    routed: dict[JobId, str] = field(default_factory=dict)
    """With pools: the pool each job was routed to (it keeps it for every attempt)."""
    routed_gpus: dict[str, int] = field(default_factory=dict)
    """With pools: per pool, the GPUs asked by the jobs routed there and not finished (``routed_live``)."""
    routed_live: dict[JobId, tuple[str, int]] = field(default_factory=dict)
    """With pools: each unfinished routed job's pool and GPUs."""
    waiting: dict[TreeKey, dict[JobId, QuotaJob]] = field(default_factory=dict)
    """Eligible jobs (owed a job.queued, nothing charged), per quota tree."""
    last_pending: dict[JobId, str] = field(default_factory=dict)
    """Waiting job → what the last pending reason sent said, figures aside (:func:`pending_key`)."""
    unplaced: dict[JobId, QuotaJob] = field(default_factory=dict)
    """Jobs charged whose attempt is not placed yet: those a change of the nodes may strand."""
    stranded: set[JobId] = field(default_factory=set)
    """Jobs of ``unplaced`` whose model's nodes cannot hold them and that no other flavour took yet."""
    status: StatusBoard = field(default_factory=StatusBoard)
    """What quota last published on queues.status (services/quota/status.py)."""
    charges: QuotaCharges[QuotaJob] = field(init=False)
    """The core's quota gate and charges (the ledger, the held jobs' lines, the decayed usage): the
    one object quota decides with, as the core's simulator does (gangline.core.charging)."""
    inventory: Inventory = field(init=False)

    SNAPSHOT_FIELDS: ClassVar[tuple[str, ...]] = (
        *(f"cluster.{name}" for name in ClusterFold.SNAPSHOT_FIELDS),
        "jobs",
        "unlimited",
        "waiting",
        "last_pending",
        "unplaced",
        "charges.usage",
        "inventory.offers",
        "inventory.node_pool",
        "routed",
        "routed_gpus",
        "routed_live",
    )
    """What a restore from the log fills, and nothing else (services.common.snapshots): the lifecycle
    fold, quota's facts per job (the times of its charges among them) and their indexes, what it last told
    each waiting job, the decayed usage's sums (a function of the charges' times alone, so a snapshot
    holds what a rebuild from the log computes), and what each node offers. Not the settings
    (``topics``, ``queues``, ``half_life_s``); not ``stranded`` (only a decision fills it: a restore
    leaves it empty, and the next change of the nodes looks at every unplaced job); not the status
    board (read whole from queues.status at every start, compacted to one record per queue); not the
    inventory's ``version`` (a count of changes, only the caches' key: how many a restore sees depends
    on the order it reads the node topics in, and the caches start empty on load); not what is worked
    out from the saved fields (the ledger, whose figures are keyed by the queue tree's nodes in memory,
    the gate's held jobs, and the inventory's hardware counts: :meth:`snapshot_loaded` rebuilds them)
    nor the per-job caches."""
    SNAPSHOT_VERSION: ClassVar[int] = 4
    """2: the lifecycle fold keeps elastic resizes; 3: its retired jobs packed (gangline.fold.retired);
    4: the charges' times and the decayed usage's sums."""

    def snapshot_loaded(self) -> None:
        """After a snapshot is loaded: the ledger is the sum of the jobs' charges, the gate holds the
        waiting jobs and the hardware is the sum of the nodes' offers, as the fold left them; the caches
        start empty, as after a restore."""
        usage = self.charges.usage
        self.charges = self._new_charges()
        self.charges.usage = usage
        for job in sorted(self.jobs.values(), key=lambda j: j.job_id):
            job.options = job.held = job.gate = job.pending = None
            if job.charge is not None and self.queues.limited(job.charge.queue):
                self.charges.set_charge(CoreJobId(job.job_id), job.charge)
        for tree in sorted(self.waiting):
            if tree[0]:
                for job in self.waiting[tree].values():
                    self.charges.hold(_pending_item(job, self.line_order))
        self.inventory.hardware = Hardware(self.inventory.offers.values())
        self.inventory.pools_loaded()

    def __post_init__(self) -> None:
        self.charges = self._new_charges()
        self.inventory = Inventory(self.cluster, layout=self.pools)
        self.retired = _Settled(self)
        """Jobs whose records the select may skip: nothing read about them changes the state."""

    def _new_charges(self) -> QuotaCharges[QuotaJob]:
        return QuotaCharges(
            self.queues.tree,
            self.gate_options,
            half_life_s=self.half_life_s,
            starvation_s=self.starvation_s,
            run_bound=_run_bound,
            expected_release=self._expected_release if self.gate_reserve else None,
        )

    def _expected_release(self, job_id: CoreJobId, at: float) -> float | None:
        """When a charged job's charge is expected to go: its live grant's time (``at`` when not placed
        yet) plus its run bound (None: no duration hint or time limit; the core's QuotaCharges)."""
        job = self.jobs.get(JobId(job_id))
        if job is None:
            return None
        record = job.record
        core = record.core()
        if core is None or core.run_bound_s is None:
            return None
        live = record.live()
        granted = record.granted_at.get(live.allocation_id) if live is not None else None
        return (granted.timestamp() if granted is not None else at) + core.run_bound_s

    @property
    def ledger(self) -> QuotaLedger:
        """What is charged, per queue (the core's ledger, in :attr:`charges`)."""
        return self.charges.ledger

    # -- the fold ------------------------------------------------------------------------------

    def restore(self, envelope: Envelope) -> None:
        """Fold a fact read from the log at start; quota's own pending reasons say what it last told."""
        if isinstance(envelope.data, JobPending) and envelope.source == SOURCE:
            self._restore_pending(envelope.data)
            return
        if self.status.restore(envelope):
            return
        self.fold(envelope)

    def fold(self, envelope: Envelope) -> TreeKey | None:
        """Apply one fact; the quota tree whose usage it lowered (None when it lowered none). A charge
        counts in the decayed usage from the time of the fact that made it to the time of the one that
        ended it, whatever order they are read in."""
        if isinstance(envelope.data, NODE_EVENT_TYPES):
            self.fold_nodes(envelope)
            return None
        if self.pools is not None:
            self._fold_route(envelope)
        job = self._fold(envelope)
        if job is None:
            return None
        return self._refresh(job, dated=isinstance(envelope.data, _DATED))

    def fold_nodes(self, envelope: Envelope) -> bool:
        """Apply one node fact; True when what some node offers changed (so may a job's flavours)."""
        changed = self.inventory.fold(envelope)
        if changed:
            self.charges.reflavour()
        return changed

    def _fold_route(self, envelope: Envelope) -> None:
        """With pools: the pool each job was routed to (our own ``job.routed``), and each pool's load."""
        data = envelope.data
        if isinstance(data, JobRouted):
            if data.job_id not in self.routed:
                self.routed[data.job_id] = data.pool
                gpus = data.spec.workers * data.spec.gpus_per_worker
                self.routed_live[data.job_id] = (data.pool, gpus)
                self.routed_gpus[data.pool] = self.routed_gpus.get(data.pool, 0) + gpus
            return
        over = isinstance(data, JobCompleted | JobFailed) or (
            isinstance(data, AllocationReleased) and data.reason in FINAL_RELEASES
        )
        if over:
            live = self.routed_live.pop(JobId(envelope.subject), None)
            if live is not None:
                self.routed_gpus[live[0]] -= live[1]

    def _fold(self, envelope: Envelope) -> QuotaJob | None:
        data = envelope.data
        if (
            not isinstance(data, QUOTA_EVENT_TYPES)
            or data.job_id in self.retired
            or data.job_id in self.unlimited
        ):
            return None
        if isinstance(data, JobAdmitted) and Queue(data.spec.queue) in self.queues.unlimited:
            # Nothing to decide: placement takes it once admitted. Whatever is read about it later (its
            # grant, its end) changes nothing here.
            self.unlimited.add(data.job_id)
            self.cluster.jobs.pop(data.job_id, None)
            self.cluster.waiting.pop(data.job_id, None)
            return None
        self.cluster.fold(envelope)
        record = self.cluster.jobs.get(data.job_id)
        job = self.jobs.get(data.job_id)
        if job is None:
            if record is None:
                return None  # retired by this fact: nothing was charged that is not released below
            job = self.jobs[data.job_id] = QuotaJob(record)
        elif record is not None:
            job.record = record
        at = envelope.time.timestamp()
        if isinstance(data, JobQueued):
            job.latest_queued = envelope.id
            job.starts.setdefault(envelope.id, (at, data.gpu_type, data.replaces))
        elif isinstance(data, AllocationReleased):
            job.ends[data.allocation_id] = min(at, job.ends.get(data.allocation_id, at))
        elif isinstance(data, JobRequeued):
            job.requeues[data.attempt] = min(at, job.requeues.get(data.attempt, at))
        if isinstance(data, JobCompleted | JobFailed) or (
            isinstance(data, AllocationReleased) and data.reason in FINAL_RELEASES
        ):
            job.finished_at = at if job.finished_at is None else min(job.finished_at, at)
        return job

    def _refresh(self, job: QuotaJob, *, dated: bool = True) -> TreeKey | None:
        """Bring the charges and the indexes in line with the job's facts; the tree whose usage dropped
        (``dated``: the fact may change when its charges began or ended)."""
        dropped: TreeKey | None = None
        want = self._charge_of(job)
        if want != job.charge:
            if job.charge is not None:
                dropped = self.tree_of(job.charge.queue)
            limited = want if want is not None and self.queues.limited(want.queue) else None
            if limited is not None or CoreJobId(job.job_id) in self.charges.charges:
                self.charges.set_charge(CoreJobId(job.job_id), limited)
            job.charge = want
        if self.half_life_s > 0 and dated:
            steps = self.usage_steps(job)
            if steps != job.steps:
                self.charges.count_usage(steps, taken_back=job.steps)
                job.steps = steps
        if job.spec is not None:
            tree = self.tree_of(job.spec.queue)
            _index(self.waiting, tree, job, job.eligible)
            if tree[0]:
                if job.eligible:
                    self.charges.hold(_pending_item(job, self.line_order))
                else:
                    self.charges.unhold(job.job_id, job.spec.queue)
        if job.unplaced:
            self.unplaced[job.job_id] = job
        else:
            self.unplaced.pop(job.job_id, None)
            self.stranded.discard(job.job_id)
        if not job.waiting:
            self.last_pending.pop(job.job_id, None)
        if job.job_id not in self.cluster.jobs:
            # Retired (finished, its grants released). A finished job whose release is still to come is
            # kept: that release dates the end of its charge, whichever of the two is read first.
            del self.jobs[job.job_id]
        return dropped

    def waiting_lines(self, tree: TreeKey) -> WaitingLines[QuotaJob]:
        """The tree's waiting jobs in the gate's lines (the core's, in :attr:`charges`)."""
        return self.charges.waiting_lines(tree[1])

    def _charge_of(self, job: QuotaJob) -> Charge | None:
        """What the job's facts say the ledger should hold for it."""
        if not job.due or job.spec is None:
            return None
        return Charge(Queue(job.spec.queue), self._flavour_of(job.spec, job.record.flavour))

    def _flavour_of(self, spec: JobSpec, model: str | None) -> Flavour:
        """What a job of ``spec`` queued on ``model`` is charged (nothing in an unlimited queue)."""
        if not self.queues.limited(spec.queue):
            return Flavour(model, {})
        if model is None:  # a job.queued naming no model (written before quota chose one): the first
            model = spec.gpu_type or next((m for m, _ in self.queues.requests(spec)), None)
        return Flavour(model, request_on(spec, model) if model is not None else {})

    def usage_steps(self, job: QuotaJob) -> tuple[Step, ...]:
        """The job's charges as usage changes, each at the time of the fact that made it: attempt k
        (the k-th ``job.queued`` that is not a move, by time) is charged from its ``job.queued`` until
        the first of the k-th release (by time) and a ``job.requeued`` for a later attempt, on the model
        it was queued on and then on each model a move named, from the move's time. The job's end
        (``job.completed``, ``job.failed``) ends only an attempt no release was read for: placement
        releases the GPUs once it reads the end, at its own later time, and the two are on two topics, so
        either may be read first (and an end read after the final release is skipped: the job retired);
        the release dates it in both orders. A function of which facts were read, not of their order;
        and the same whether the release of an attempt or its requeue (written together, at one time)
        is read, so a restore (jobs.events first, then allocations.log) dates it as the service did."""
        spec = job.spec
        if spec is None or not self.queues.limited(spec.queue):
            return ()
        queue = Queue(spec.queue)
        starts = job.starts
        moves: dict[str, list[tuple[float, str | None]]] = {}
        for at, model, replaces in starts.values():
            if replaces is None:
                continue
            first = replaces
            while (seen := starts.get(first)) is not None and seen[2] is not None:
                first = seen[2]
            moves.setdefault(first, []).append((at, model))
        attempts = sorted((at, qid) for qid, (at, _, replaces) in starts.items() if replaces is None)
        releases = sorted(job.ends.values())
        steps: list[Step] = []
        for k, (start, qid) in enumerate(attempts):
            ends = [t for attempt, t in job.requeues.items() if attempt > k + 1]
            if k < len(releases):
                ends.append(releases[k])
            elif job.finished_at is not None:
                ends.append(job.finished_at)  # an end with no release of the attempt (yet)
            end = min(ends) if ends else None
            if end is not None and end <= start:
                continue
            pieces = [(start, starts[qid][1])]
            later = [m for m in moves.get(qid, []) if m[0] >= start and (end is None or m[0] < end)]
            pieces += sorted(later, key=lambda m: m[0])
            for p, (at, model) in enumerate(pieces):
                until = pieces[p + 1][0] if p + 1 < len(pieces) else end
                steps += usage_steps(queue, self._flavour_of(spec, model).request, at, until)
        return tuple(steps)

    def charged(self) -> Mapping[Queue, Mapping[Resource, int]]:
        """What the ledger charges per limited queue (``usage_vector``), queues charged nothing left out."""
        return self.charges.charged()

    def _restore_pending(self, pending: JobPending) -> None:
        """Remember quota's own pending reason for a job that waits (owed a ``job.queued``), whether or not
        its previous attempt's release is read yet: the running quota tells a requeued job once it read the
        release, but a restore reads jobs.events (the requeue, then that pending) before allocations.log
        (the release). Asking ``eligible`` here made what it remembers depend on that read order."""
        job = self.jobs.get(pending.job_id)
        if job is None or not job.waiting:
            return
        reason = pending.reasons[0]
        if reason.constraint == HARDWARE or reason.code == "quota":
            self.last_pending[job.job_id] = pending_key(reason)

    # -- queries -------------------------------------------------------------------------------

    def tree_of(self, queue: str) -> TreeKey:
        if self.queues.limited(queue):
            return (True, self.queues.tree.root_cohort_of(Queue(queue)))
        return (False, queue)

    def options(self, job: QuotaJob) -> list[Flavour]:
        """The job's flavours in the order to try them (GPU model, what it is charged)."""
        if job.options is None:
            assert job.spec is not None
            job.options = [Flavour(m, r) for m, r in self.queues.requests(job.spec)]
        return job.options

    def held_options(self, job: QuotaJob) -> tuple[list[Flavour], list[Reason]]:
        """The job's flavours whose model's nodes can hold its workers, and why each other cannot (the
        core's :func:`~gangline.core.quota_gate.held_flavours`; all while no node has registered)."""
        inventory = self.inventory
        if job.held is None or job.held[0] != inventory.version:
            assert job.spec is not None
            hardware: HoldsWorkers | None = inventory.hardware if inventory.known else None
            pool = self.routed.get(job.job_id) if self.pools is not None else None
            if hardware is not None and pool is not None:
                # With pools a flavour is held only where its pool holds the job whole (no gang spans pools).
                hardware = inventory.pooled.only(pool)
            fits, misfits = held_flavours(hardware, worker_ask(job.spec), self.options(job))
            job.held = (inventory.version, fits, misfits)
        return job.held[1], job.held[2]

    def gate_flavours(self, job: QuotaJob) -> list[Flavour]:
        """What the gate may let ``job`` through on: its flavours the nodes can hold (for a limited
        queue), or "any model, nothing charged" (an unlimited one)."""
        assert job.spec is not None
        if not self.queues.limited(job.spec.queue):
            return [Flavour(None, {})]
        return self.held_options(job)[0]

    def gate_options(self, job: QuotaJob) -> tuple[list[Flavour], list[Reason]]:
        """:meth:`gate_flavours` and why the other flavours' nodes cannot hold it, worked out once per
        inventory version (the queue configuration does not change under a state)."""
        version = self.inventory.version
        cached = job.gate
        if cached is None or cached[0] != version:
            misfits = self.held_options(job)[1]
            cached = job.gate = (version, self.gate_flavours(job), misfits)
        return cached[1], cached[2]

    def fair_share(self, tree: TreeKey, at: datetime) -> FairShare:
        """Dominant shares of the tree's queues: charged usage now, and the history decayed to ``at``
        (the core's, in :attr:`charges`; an unlimited queue's tree has none). ``at`` is the time of the
        event decided on, so the figures are a function of the facts read and that time alone."""
        return self.charges.fair_share(tree[1] if tree[0] else "", at.timestamp())


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
        reconsidered = _reconsider(state, envelope, now) if state.fold_nodes(envelope) else []
        return reconsidered + queue_statuses(state, envelope, now)
    if isinstance(data, QuotaTicked):
        return queue_statuses(state, envelope, now)  # the clock: what the throttle held back is due now
    dropped = state.fold(envelope)
    out: list[Outgoing] = []
    if state.pools is not None and isinstance(data, JobAdmitted):
        out += _route_admitted(state, data, envelope, now)
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
    tree = state.tree_of(spec.queue)
    if tree[0] and state.charges.reserves(tree[1], cause.time.timestamp()):
        return _let_through(state, tree, cause, now)  # held already: it goes in the gate's order
    fit = state.charges.first_fit(spec.queue, state.gate_flavours(job))
    if fit is not None:
        return [_queue(state, job, fit.model, cause, now)]
    fair = state.fair_share(state.tree_of(spec.queue), cause.time)
    return _hold(state, job, fair, cause, now)


def _reconsider(state: QuotaState, cause: Envelope, now: datetime) -> list[Outgoing]:
    """What the nodes can hold changed: jobs charged to a model that cannot hold them any more move
    (:func:`_move_stranded`), and every tree's waiting jobs are let through (or told why not)."""
    out = _move_stranded(state, cause, now)
    for tree in sorted(state.waiting):
        out += _let_through(state, tree, cause, now)
    return out


def _move_stranded(
    state: QuotaState, cause: Envelope, now: datetime, *, only_stranded: bool = False
) -> list[Outgoing]:
    """Each job charged to a GPU model and not placed yet whose model's nodes can no longer hold it
    (drained, failed, gone) moves to the first other flavour they can that its quota admits
    (the core's :func:`~gangline.core.quota_gate.stranded_move`): a ``job.queued`` naming the new model
    that ``replaces`` the one it was queued with (the same attempt; placement places it there). One no
    flavour admits stays charged where it is (``stranded``) and is looked at again when quota or the
    nodes change (``only_stranded``: only those, after a release)."""
    out: list[Outgoing] = []
    if only_stranded:
        candidates = [state.unplaced[j] for j in sorted(state.stranded) if j in state.unplaced]
    else:
        candidates = sorted(state.unplaced.values(), key=lambda j: j.job_id)
    for job in candidates:
        state.stranded.discard(job.job_id)
        charge = job.charge
        if charge is None or not state.queues.limited(charge.queue) or charge.flavour.model is None:
            continue
        if job.spec is None:
            continue
        held = state.gate_flavours(job)
        if any(f.model == charge.flavour.model for f in held):
            continue
        move = stranded_move(charge.queue, charge.flavour, held, state.ledger)
        if move is None:
            state.stranded.add(job.job_id)
            continue
        out.append(_queue(state, job, move.model, cause, now, replaces=job.latest_queued))
    return out


def _let_through(state: QuotaState, tree: TreeKey, cause: Envelope, now: datetime) -> list[Outgoing]:
    """Usage in ``tree`` dropped: its waiting jobs go in fair order while they fit (the core's
    :func:`~gangline.core.quota_gate.let_through`); the first of the rest are told why."""
    out: list[Outgoing] = []
    if state.stranded:
        out += _move_stranded(state, cause, now, only_stranded=True)
    if not tree[0] or not state.charges.holds(tree[1]):
        return out
    gate = state.charges.gate(tree[1], cause.time.timestamp(), explain=REVIEWS_PER_DECISION)
    for job, flavour in gate.admitted:
        out.append(_queue(state, job, flavour.model, cause, now))
    told: dict[int, tuple[PendingReason, str]] = {}  # a pass shares one reason among the jobs it fits
    for job, why in gate.held:
        out += _tell(state, job, why, cause, now, told)
    return out


def _run_bound(job: QuotaJob) -> float | None:
    """A waiting job's run bound (duration hint or time limit), as the core's job has it."""
    core = job.record.core()
    return None if core is None else core.run_bound_s


def _pending_item(job: QuotaJob, line_order: str = "submit") -> Pending[QuotaJob]:
    spec, at = job.spec, job.admitted_at
    assert spec is not None
    cached = job.pending
    if cached is not None and cached[0] is spec and cached[1] == at:
        return cached[2]
    admitted = at.timestamp() if at is not None else math.inf
    core = job.record.core()
    work = job_line_work(core, line_order) if core is not None else 0.0
    pending = Pending(Queue(spec.queue), spec.priority, admitted, job.job_id, job, work)
    job.pending = (spec, at, pending)
    return pending


def _queue(
    state: QuotaState,
    job: QuotaJob,
    model: str | None,
    cause: Envelope,
    now: datetime,
    *,
    replaces: str | None = None,
) -> Outgoing:
    assert job.spec is not None
    pool = state.routed.get(job.job_id) if state.pools is not None else None
    event = JobQueued(job_id=job.job_id, queue=job.spec.queue, gpu_type=model, replaces=replaces, pool=pool)
    envelope = _envelope(event, cause.id, "queued" if replaces is None else f"moved-{model}", now)
    state.fold(envelope)  # charge it now, so the next decision sees it
    return (state.topics.events, envelope)


def _route_admitted(
    state: QuotaState, admitted: JobAdmitted, cause: Envelope, now: datetime
) -> list[Outgoing]:
    """With pools, every admitted job is routed to one pool (``job.routed``, on the pool's partition): the
    core's choice among the pools that hold it whole on one of its models (gangline.core.pools), or, when no
    pool can, the one with the most usable GPUs (it waits there, its placement saying why). Once per job:
    an admission read again is not routed again. A job of an unlimited queue too (nothing is charged): a
    pool's owners learn of a job only from its partition."""
    layout = state.pools
    assert layout is not None
    if admitted.job_id in state.routed:
        return []
    spec = admitted.spec
    job = state.jobs.get(admitted.job_id)
    models: list[str | None] = [f.model for f in state.options(job)] if job is not None else [spec.gpu_type]
    inventory = state.inventory
    pool = route(
        [GpuModel(m) if m is not None else None for m in models],
        worker_ask(spec),
        inventory.pooled,
        inventory.pool_gpus,
        state.routed_gpus,
        layout.pools,
    ) or min(layout.pools, key=lambda p: (-sum(inventory.pool_gpus.get(p, Counter()).values()), p))
    event = JobRouted(job_id=admitted.job_id, pool=pool, spec=spec, admitted_at=cause.time)
    envelope = _envelope(event, cause.id, "routed", now)
    state.fold(envelope)
    return [(state.topics.events, envelope)]


def _fail(
    state: QuotaState, job: QuotaJob, code: str, why: str, cause: Envelope, now: datetime
) -> list[Outgoing]:
    """A job its queue could never hold would wait forever: it fails now, saying why."""
    failed = JobFailed(job_id=job.job_id, code=code, reason=sentence(why))
    envelope = _envelope(failed, cause.id, "failed-quota", now)
    dropped = state.fold(envelope)
    out: list[Outgoing] = [(state.topics.events, envelope)]
    if dropped is not None:
        out += _let_through(state, dropped, cause, now)
    return out


def _hold(
    state: QuotaState, job: QuotaJob, fair: FairShare, cause: Envelope, now: datetime
) -> list[Outgoing]:
    """``job.pending`` for a job that does not fit (the core's hold reason), when its reason changed."""
    assert job.spec is not None
    flavours, misfits = state.held_options(job)
    why = state.charges.hold_reason(job.spec.queue, flavours, misfits, fair)
    return _tell(state, job, why, cause, now)


def _tell(
    state: QuotaState,
    job: QuotaJob,
    why: HoldReason,
    cause: Envelope,
    now: datetime,
    told: dict[int, tuple[PendingReason, str]] | None = None,
) -> list[Outgoing]:
    """``job.pending`` saying ``why``, when it says something else than the last one (:func:`pending_key`);
    ``told`` keeps the event's reason and key per reason object already worked out (by ``id``)."""
    known = told.get(id(why)) if told is not None else None
    if known is None:
        reason = _pending_reason(why)
        known = (reason, pending_key(reason))
        if told is not None:
            told[id(why)] = known
    reason, key = known
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


def _pending_reason(why: HoldReason) -> PendingReason:
    """The core's hold reason as the event's pending reason."""
    return PendingReason(
        code=why.code,
        constraint=why.constraint,
        message=why.message,
        details=dict(why.details),
        unblock=why.unblock,
    )


def _envelope(event: Event, cause: str, kind: str, now: datetime) -> Envelope:
    return make_envelope(event, event_id=derived_id(cause, kind, event.subject()), source=SOURCE, time=now)
