"""Quota's decisions (pure): which admitted jobs may go to placement now, on which GPU model, and why
the others wait.

The queues, their quotas per GPU model and their cohorts come from the queue configuration
(:mod:`services.common.queues`); the accounting is the core's :class:`~gangline.core.queues.QuotaLedger`
(borrowing and lending within a cohort), and who is let through, on which model, in which order and
why the others wait is the core's quota gate (:mod:`gangline.core.quota_gate`: fair order by priority,
then DRF dominant share over decayed usage, then admitted time, then job id; the rule the core cycle's
fair order runs too). This module folds the facts, calls the gate and writes what it decided.

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
``allocations.log`` (our own ``job.queued`` included), and the node topics, which does not depend on
the order between the topics: per job quota counts queued attempts against the attempts owed (one,
plus one per ``job.requeued``) and against the allocations released. The decayed usage history is
advanced with event times (never the wall clock), and a change read after a later one (another
partition, another topic, the restore reading topic by topic) is dated back to its own time
(:func:`~gangline.core.fairshare.backdate`): the same events give the same state in whatever order they
are read. A job the fold retired (finished, its grants released) and a job of an unlimited queue are
``retired`` here: any event about it read again changes nothing, and the select skips it. The restore
also reads quota's own pending reasons, so a restarted quota does not repeat a pending it already sent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar

from gangline.bus import Outgoing
from gangline.core.fairshare import FairShare, Pending, UsageHistory, advance, backdate
from gangline.core.framework.status import Reason
from gangline.core.hardware import NAME as HARDWARE
from gangline.core.hardware import Hardware, NodeOffer
from gangline.core.queues import QueueName as Queue
from gangline.core.queues import QuotaLedger, Resource
from gangline.core.quota_gate import (
    Flavour,
    HoldReason,
    WaitingLines,
    first_fit,
    held_flavours,
    hold_reason,
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
    JobSpec,
    PendingReason,
)
from gangline.events.nodes import GpuHealthChanged, NodeCordoned, NodeFailed, NodeRegistered, NodeUncordoned
from gangline.events.types import JobId, NodeId, QueueName
from gangline.fold.adapter import node_offer, worker_ask
from gangline.fold.cluster import ClusterFold, JobRecord
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
        self.version += 1
        return True

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
    options: list[Flavour] | None = None
    """Its flavours (``Queues.requests``), worked out once."""
    held: tuple[int, list[Flavour], list[Reason]] | None = None
    """Its flavours the nodes can hold, and why the others cannot, as of an inventory version."""
    latest_queued: str | None = None
    """The id of the latest ``job.queued`` read (None: none)."""
    gate: tuple[int, list[Flavour], list[Reason]] | None = None
    """What the gate may let it through on, and why its other flavours' nodes cannot hold it, as of an
    inventory version (:meth:`QuotaState.gate_options`)."""
    pending: tuple[JobSpec, datetime | None, Pending[QuotaJob]] | None = None
    """Its place in its queue's line, as of its spec and admitted time (:func:`_pending_item`)."""

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
        return r.spec is not None and not r.finished and len(r.queued) > len(r.released)

    @property
    def unplaced(self) -> bool:
        """Charged (``due``) and its latest attempt not granted yet (placement has not placed it)."""
        return self.due and len(self.record.grants) < self.attempts

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
        return job_id in self._state.cluster.retired or job_id in self._state.unlimited

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
    cluster: ClusterFold = field(default_factory=ClusterFold)
    """The one lifecycle fold: every job's attempts, grants and ends, and the nodes."""
    jobs: dict[JobId, QuotaJob] = field(default_factory=dict)
    """Quota's own facts per job of a limited queue, while it is not finished."""
    unlimited: set[JobId] = field(default_factory=set)
    """Jobs of unlimited queues: not quota's business (placement takes them once admitted)."""
    waiting: dict[TreeKey, dict[JobId, QuotaJob]] = field(default_factory=dict)
    """Eligible jobs (owed a job.queued, nothing charged), per quota tree."""
    lines: dict[TreeKey, tuple[int, WaitingLines[QuotaJob]]] = field(default_factory=dict)
    """``waiting`` in the gate's lines per tree, as of an inventory version (:meth:`waiting_lines`)."""
    last_pending: dict[JobId, str] = field(default_factory=dict)
    """Waiting job → what the last pending reason sent said, figures aside (:func:`pending_key`)."""
    unplaced: dict[JobId, QuotaJob] = field(default_factory=dict)
    """Jobs charged whose attempt is not placed yet: those a change of the nodes may strand."""
    stranded: set[JobId] = field(default_factory=set)
    """Jobs of ``unplaced`` whose model's nodes cannot hold them and that no other flavour took yet."""
    history: UsageHistory = field(default_factory=lambda: UsageHistory(as_of=0.0))
    status: StatusBoard = field(default_factory=StatusBoard)
    """What quota last published on queues.status (services/quota/status.py)."""
    ledger: QuotaLedger = field(init=False)
    inventory: Inventory = field(init=False)

    SNAPSHOT_FIELDS: ClassVar[tuple[str, ...]] = (
        *(f"cluster.{name}" for name in ClusterFold.SNAPSHOT_FIELDS),
        "jobs",
        "unlimited",
        "waiting",
        "last_pending",
        "unplaced",
        "history",
        "inventory.offers",
    )
    """What a restore from the log fills, and nothing else (services.common.snapshots): the lifecycle
    fold, quota's facts per job and their indexes, what it last told each waiting job, the decayed usage,
    and what each node offers. Not the settings (``topics``, ``queues``, ``half_life_s``); not
    ``stranded`` (only a decision fills it: a restore leaves it empty, and the next change of the nodes
    looks at every unplaced job); not the status board (read whole from queues.status at every start,
    compacted to one record per queue); not the inventory's ``version`` (a count of changes, only the
    caches' key: how many a restore sees depends on the order it reads the node topics in, and the
    caches start empty on load); not what is worked out from the saved fields (the ledger,
    whose figures are keyed by the queue tree's nodes in memory, and the inventory's hardware counts:
    :meth:`snapshot_loaded` rebuilds them) nor the per-job caches."""
    SNAPSHOT_VERSION: ClassVar[int] = 1

    def snapshot_loaded(self) -> None:
        """After a snapshot is loaded: the ledger is the sum of the jobs' charges and the hardware the
        sum of the nodes' offers, as the fold left them; the caches start empty, as after a restore."""
        self.ledger = QuotaLedger(self.queues.tree)
        for job in sorted(self.jobs.values(), key=lambda j: j.job_id):
            job.options = job.held = job.gate = job.pending = None
            if job.charge is not None and job.charge.limited:
                self.ledger.admit(Queue(job.charge.queue), job.charge.request)
        self.inventory.hardware = Hardware(self.inventory.offers.values())

    def __post_init__(self) -> None:
        self.ledger = QuotaLedger(self.queues.tree)
        self.inventory = Inventory(self.cluster)
        self.retired = _Settled(self)
        """Jobs whose records the select may skip: nothing read about them changes the state."""
        tree = self.queues.tree
        self._limited_queues = [Queue(q) for q in tree.queue_names()]
        self._tree_queues: dict[TreeKey, list[Queue]] = {}
        for q in self._limited_queues:
            self._tree_queues.setdefault((True, tree.root_cohort_of(q)), []).append(q)
        self._capacity = {r: tree.total_nominal(r) for r in sorted(tree.resources)}
        self._charged: dict[Queue, dict[Resource, int]] | None = None
        """What the ledger charges per limited queue (:meth:`_allocation`), until it changes."""
        self._decayed: tuple[UsageHistory, float, UsageHistory] | None = None
        """(history, time, the history advanced to that time with what is charged) of the last
        :meth:`fair_share`, until the ledger changes."""

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
        if isinstance(data, JobQueued):
            job.latest_queued = envelope.id
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
            self._charged = self._decayed = None
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
            self._line_up(tree, job, job.eligible)
        if job.unplaced:
            self.unplaced[job.job_id] = job
        else:
            self.unplaced.pop(job.job_id, None)
            self.stranded.discard(job.job_id)
        if not job.waiting:
            self.last_pending.pop(job.job_id, None)
        if job.record.finished or job.job_id not in self.cluster.jobs:
            del self.jobs[job.job_id]
        return dropped

    def _line_up(self, tree: TreeKey, job: QuotaJob, member: bool) -> None:
        """Keep the tree's lines (when built for the current inventory) in step with ``waiting``."""
        entry = self.lines.get(tree)
        if entry is None or entry[0] != self.inventory.version:
            return  # built afresh when next asked for
        if member:
            entry[1].put(_pending_item(job), self.gate_options(job)[0])
        else:
            entry[1].discard(job.job_id)

    def waiting_lines(self, tree: TreeKey) -> WaitingLines[QuotaJob]:
        """The tree's waiting jobs in the gate's lines, each to go on what :meth:`gate_options` says;
        built once per inventory version (what the nodes hold decides a job's flavours), then kept."""
        version = self.inventory.version
        entry = self.lines.get(tree)
        if entry is None or entry[0] != version:
            waiting = self.waiting.get(tree, {}).values()
            lines = WaitingLines.of((_pending_item(j) for j in waiting), lambda j: self.gate_options(j)[0])
            entry = self.lines[tree] = (version, lines)
        return entry[1]

    def _charge_of(self, job: QuotaJob) -> Charge | None:
        """What the job's facts say the ledger should hold for it."""
        if not job.due or job.spec is None:
            return None
        spec = job.spec
        model = job.record.flavour
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

    def charged(self) -> Mapping[Queue, Mapping[Resource, int]]:
        """What the ledger charges per limited queue (``usage_vector``), queues charged nothing left out."""
        return self._allocation()

    def _allocation(self, queues: Iterable[Queue] | None = None) -> dict[Queue, dict[Resource, int]]:
        """What the ledger charges per queue (of ``queues``; all limited ones), queues charged nothing
        left out. Worked out once per change of the ledger: read it, never change it."""
        charged = self._charged
        if charged is None:
            ledger = self.ledger
            charged = self._charged = {q: v for q in self._limited_queues if (v := ledger.usage_vector(q))}
        if queues is None:
            return charged
        return {q: charged[q] for q in queues if q in charged}

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
            hardware = inventory.hardware if inventory.known else None
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
        """Dominant shares of the tree's queues: charged usage now, and the history decayed to ``at``."""
        queues = self._tree_queues.get(tree, [])
        history: UsageHistory | None = None
        if self.half_life_s > 0:
            now = max(self.history.as_of, at.timestamp())
            known = self._decayed
            if known is not None and known[0] is self.history and known[1] == now:
                history = known[2]
            else:
                history = advance(self.history, self._allocation(), now=now, half_life_s=self.half_life_s)
                self._decayed = (self.history, now, history)
        return FairShare(
            capacity=self._capacity,
            weights={q: self.queues.tree.weight(q) for q in queues},
            allocation=self._allocation(queues),
            history=history,
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
    fit = first_fit(state.ledger, Queue(spec.queue), state.gate_flavours(job))
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
        if charge is None or not charge.limited or charge.gpu_type is None or job.spec is None:
            continue
        held = state.gate_flavours(job)
        if any(f.model == charge.gpu_type for f in held):
            continue
        queue = Queue(charge.queue)
        move = stranded_move(queue, Flavour(charge.gpu_type, charge.request), held, state.ledger)
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
    lines = state.waiting_lines(tree)
    if not lines:
        return out
    gate = lines.let_through(
        state.ledger.copy(),
        state.fair_share(tree, cause.time),
        state.queues.tree,
        state.gate_options,
        explain=REVIEWS_PER_DECISION,
        aged_before=cause.time.timestamp() - state.starvation_s if state.starvation_s is not None else None,
    )
    for job, flavour in gate.admitted:
        out.append(_queue(state, job, flavour.model, cause, now))
    told: dict[int, tuple[PendingReason, str]] = {}  # a pass shares one reason among the jobs it fits
    for job, why in gate.held:
        out += _tell(state, job, why, cause, now, told)
    return out


def _pending_item(job: QuotaJob) -> Pending[QuotaJob]:
    spec, at = job.spec, job.admitted_at
    assert spec is not None
    cached = job.pending
    if cached is not None and cached[0] is spec and cached[1] == at:
        return cached[2]
    admitted = at.timestamp() if at is not None else math.inf
    pending = Pending(Queue(spec.queue), spec.priority, admitted, job.job_id, job)
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
    event = JobQueued(job_id=job.job_id, queue=job.spec.queue, gpu_type=model, replaces=replaces)
    envelope = _envelope(event, cause.id, "queued" if replaces is None else f"moved-{model}", now)
    state.fold(envelope, at=cause.time)  # charge it now, so the next decision sees it
    return (state.topics.events, envelope)


def _fail(
    state: QuotaState, job: QuotaJob, code: str, why: str, cause: Envelope, now: datetime
) -> list[Outgoing]:
    """A job its queue could never hold would wait forever: it fails now, saying why."""
    failed = JobFailed(job_id=job.job_id, code=code, reason=sentence(why))
    envelope = _envelope(failed, cause.id, "failed-quota", now)
    dropped = state.fold(envelope, at=cause.time)
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
    why = hold_reason(Queue(job.spec.queue), flavours, misfits, state.ledger, state.queues.tree, fair)
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
