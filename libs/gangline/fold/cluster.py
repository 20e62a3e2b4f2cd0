"""The one lifecycle fold: the cluster (nodes, their health) and every job's attempts, grants and ends.

State is a fold over ``nodes.inventory``, ``nodes.health``, ``jobs.events`` and ``allocations.log``,
written so the order between topics does not matter: a job's status is derived from counts (attempts
allowed, grants, releases), not from the order they arrived in. Placement decides on it, preemption
mirrors the cluster with it, and the simulator runs both over it.

A job waits to be placed when it was admitted (or, ``gated``, queued by the quota service; a job of an
unlimited queue is never held by quota), holds no live allocation, is not finished, and has had fewer
grants than attempts allowed (one, plus one per ``job.requeued``). A finished job whose grants are all
released (or that had none) is retired: only its released allocation ids are kept, so state stays
bounded by live jobs.

An operator's cordon or drain (``node.cordoned`` on nodes.operator, :mod:`gangline.fold.cordons`)
marks the node cordoned in the snapshot until ``node.uncordoned``, as a failed node is: the core's
health filter gives it no new work, and its running work stays (node_health sends a drained node's
work away once the drain's grace has passed).

An elastic resize (``job.resizing``) is kept until the grant at the new size is read (preemption
releases the allocation ``resized`` and grants the new size in one transaction; until the grant is
read, the released allocation's GPUs stay held, so a cycle between the two never sees them free): a
grow's extra GPUs are held for its job in the snapshot meanwhile, a shrink's dropped GPUs are kept
for the job it makes room for (``freeing``), and the job is in flight for the core (no second resize,
no victim search). A grant that names the allocation it resizes (``resizes``) is the same attempt,
not a new one; a shrink's is new capacity.

A registration whose hardware the core cannot model (``core.snapshot.node_problem``) leaves the node
out (``refused``): its GPUs take no work, every other node is scheduled as before.

:meth:`ClusterFold.snapshot` is the core's view of it (:mod:`gangline.fold.adapter` converts), and
:meth:`ClusterFold.queue_context` the queue facts a cycle reads (the clock, admission and start times,
the GPUs a preemption in flight frees).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, cast

from gangline.core.actions.queueing import (
    EarliestStart,
    PreemptionPolicy,
    QueueContext,
    RunFacts,
    open_context,
)
from gangline.core.model import Allocation, Job
from gangline.core.model import AllocationId as CoreAllocationId
from gangline.core.model import GpuId as CoreGpuId
from gangline.core.model import JobId as CoreJobId
from gangline.core.snapshot import RunningJob, Snapshot, node_problem
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import (
    JobAdmitted,
    JobCompleted,
    JobFailed,
    JobPreempting,
    JobQueued,
    JobRequeued,
    JobResizing,
    JobRouted,
    JobSpec,
)
from gangline.events.nodes import (
    GpuHealthChanged,
    NodeCordoned,
    NodeFailed,
    NodeRegistered,
    NodeRejected,
    NodeUncordoned,
)
from gangline.events.types import AllocationId, JobId, NodeId
from gangline.fold.adapter import core_allocation, core_gpu_id, core_job, core_node, core_placements
from gangline.fold.cordons import CORDON_EVENTS, NodeCordons
from gangline.fold.retired import RetiredJobs, allocation_id_of

log = logging.getLogger(__name__)
_NEVER = datetime.min.replace(tzinfo=UTC)

FOLDED_EVENTS = (
    "node.registered",
    "node.rejected",
    "node.failed",
    "gpu.health_changed",
    *CORDON_EVENTS,
    "job.admitted",
    "job.routed",
    "job.queued",
    "job.requeued",
    "job.completed",
    "job.failed",
    "job.preempting",
    "job.resizing",
    "allocation.granted",
    "allocation.released",
)
"""The event types the fold reads (cancellations, read from jobs.requests, end as job.failed)."""
POOL_FOLDED_EVENTS = tuple(t for t in FOLDED_EVENTS if t != "job.admitted")
"""What a pool's fold reads (gangline.core.pools): a job is its pool's from the ``job.queued`` that routes it
there (which carries the spec); a ``job.admitted`` on the pool's partition may be of another pool's job."""

FINAL_RELEASES = frozenset({"completed", "failed", "cancelled"})
"""Release reasons after which the job is over."""
FailureKind = Literal["node_failed", "gpu_failed"]
"""What failed under an allocation (a requeue's reason)."""


@dataclass
class JobRecord:
    job_id: JobId
    spec: JobSpec | None = None
    queued: set[str] = field(default_factory=set)
    """Ids of the job.queued events seen (the quota service queues once per attempt)."""
    requeued_attempt: int = 1
    flavour: str | None = None
    """The GPU model the quota service charged the latest attempt to (``job.queued``'s ``gpu_type``, or
    the model a later ``job.queued`` moved it to), when the job named none: the attempt is placed only
    on that model, so the quota it holds is the one used."""
    grants: dict[AllocationId, AllocationGranted] = field(default_factory=dict)
    released: set[AllocationId] = field(default_factory=set)
    resized: set[AllocationId] = field(default_factory=set)
    """Allocations released for an elastic resize (reason ``resized``): the run goes on in the grant
    that names them, so they end no attempt."""
    finished: bool = False
    ended: dict[AllocationId, JobCompleted | JobFailed] = field(default_factory=dict)
    """The end the agents reported per allocation (the first one read), to release it with."""
    admitted_at: datetime | None = None
    """The time of the job.admitted event: with the priority and the job id, the waiting order. Read
    from the log, so the order does not depend on how a restore or a poll interleaved the partitions."""
    granted_at: dict[AllocationId, datetime] = field(default_factory=dict)
    """When each grant was written (its event's time): a running job's start, for the core's run facts."""
    _core: Job | None = None
    _core_of: JobSpec | None = None
    _narrowed: tuple[JobSpec, str, JobSpec] | None = None

    _CACHES: ClassVar[tuple[str, ...]] = ("_core", "_core_of", "_narrowed")

    def __getstate__(self) -> dict[str, Any]:
        """What a snapshot of the state saves: the facts, not the conversions cached from them."""
        return {k: v for k, v in self.__dict__.items() if k not in self._CACHES}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        self.__dict__.update(saved)
        self.__dict__.setdefault("resized", set())
        for name in self._CACHES:
            self.__dict__.setdefault(name, None)

    def core(self) -> Job | None:
        """The core's job for :meth:`placement_spec` (converted once per spec)."""
        spec = self.placement_spec()
        if spec is None:
            return None
        if self._core is None or self._core_of is not spec:
            self._core, self._core_of = core_job(self.job_id, spec), spec
        return self._core

    def placement_spec(self) -> JobSpec | None:
        """The spec to place: the job's own, narrowed to the model quota charged it to, if any (the
        narrowed copy is kept while spec and flavour stay, so :meth:`core` converts it once)."""
        spec = self.spec
        if spec is None or self.flavour is None or spec.gpu_type is not None:
            return spec
        narrowed = self._narrowed
        if narrowed is None or narrowed[0] is not spec or narrowed[1] != self.flavour:
            narrowed = (spec, self.flavour, spec.model_copy(update={"gpu_type": self.flavour}))
            self._narrowed = narrowed
        return narrowed[2]

    def live(self) -> AllocationGranted | None:
        for allocation_id, granted in self.grants.items():
            if allocation_id not in self.released:
                return granted
        return None

    def holding(self) -> AllocationGranted | None:
        """The allocation whose GPUs the job holds: its live one, or one released ``resized`` whose
        grant at the new size (written with it, in one transaction) is not read yet, so no cycle in
        between sees the GPUs free."""
        live = self.live()
        if live is not None or not self.resized:
            return live
        replaced = {g.resizes for g in self.grants.values()}
        return next((g for a, g in self.grants.items() if a in self.resized and a not in replaced), None)

    def allowed_attempts(self, gated: bool) -> int:
        return len(self.queued) if gated else self.requeued_attempt

    def attempts_granted(self) -> int:
        """Grants that started an attempt: not those of an elastic resize (``resizes``), the same run."""
        return sum(1 for g in self.grants.values() if g.resizes is None)

    def attempts_released(self) -> int:
        """Releases that ended an attempt: not those of an elastic resize (reason ``resized``)."""
        return len(self.released - self.resized)

    def waiting(self, gated: bool) -> bool:
        if self.spec is None or self.finished or self.live() is not None:
            return False
        return self.attempts_granted() < self.allowed_attempts(gated)

    def next_allocation_id(self) -> AllocationId:
        return allocation_id_of(self.job_id, len(self.grants) + 1)


@dataclass
class ClusterFold:
    """The cluster and its jobs as a fold of the log (see module docstring)."""

    SNAPSHOT_FIELDS: ClassVar[tuple[str, ...]] = (
        "nodes",
        "registered_at",
        "failed_at",
        "failed_gpus",
        "degraded_gpus",
        "gpu_health_at",
        "jobs",
        "retired",
        "waiting",
        "preemptors",
        "to_release",
        "refused",
        "rejections_sent",
        "cordons",
        "resizing",
    )
    """What folding the log fills, all of it: a snapshot of these, read on to the end of the log, is the
    fold of the whole log. Not the settings (``gated``, ``unlimited_queues``), what only a running service
    fills (``last_pending``), nor the caches."""
    SNAPSHOT_VERSION: ClassVar[int] = 3
    """2: elastic resizes kept; 3: ``retired`` packed (:class:`~gangline.fold.retired.RetiredJobs`)."""

    gated: bool = True
    unlimited_queues: frozenset[str] = frozenset()
    """Queues the queues file marks unlimited: quota never holds their jobs back (it writes no
    job.queued for them), so even ``gated`` placement takes them as soon as they are admitted."""
    nodes: dict[NodeId, NodeRegistered] = field(default_factory=dict)
    registered_at: dict[NodeId, datetime] = field(default_factory=dict)
    failed_at: dict[NodeId, datetime] = field(default_factory=dict)
    failed_gpus: dict[NodeId, set[str]] = field(default_factory=dict)
    degraded_gpus: dict[NodeId, set[str]] = field(default_factory=dict)
    """GPUs node_health or the agent marked degraded: their running work stays, new work goes elsewhere."""
    gpu_health_at: dict[tuple[NodeId, str], datetime] = field(default_factory=dict)
    """When each GPU's health last changed: with ``registered_at`` it makes folding these facts again,
    or in another order across topics, leave the same state."""
    jobs: dict[JobId, JobRecord] = field(default_factory=dict)
    retired: RetiredJobs = field(default_factory=RetiredJobs)
    """Jobs that finished with every grant released, dropped from ``jobs`` so state stays bounded by the
    live jobs: only their released allocation ids are kept (packed), so a re-delivered event changes
    nothing."""
    waiting: dict[JobId, JobRecord] = field(default_factory=dict)
    """Jobs that may be placed now (a cycle lines them up by :func:`gangline.core.waiting.waiting_line`)."""
    last_pending: dict[JobId, tuple[str, ...]] = field(default_factory=dict)
    preemptors: dict[JobId, set[tuple[JobId, AllocationId]]] = field(default_factory=dict)
    """Per job for which running work was asked to give its GPUs back (job.preempting names it), the
    victims' allocations: their GPUs are kept for it as they free up, and only those."""
    to_release: set[tuple[JobId, AllocationId]] = field(default_factory=set)
    """Live allocations whose job's end was read: the next :func:`end_batch` releases them."""
    refused: dict[NodeId, tuple[str, str]] = field(default_factory=dict)
    """Nodes whose latest registration the core cannot model: its event id and why (they take no work)."""
    rejections_sent: set[str] = field(default_factory=set)
    """Registrations whose ``node.rejected`` is in the log (ours, read back) or sent by this run."""
    cordons: NodeCordons = field(default_factory=NodeCordons)
    """Operators' cordons and drains (nodes.operator): those nodes take no new work."""
    resizing: dict[AllocationId, JobResizing] = field(default_factory=dict)
    """Elastic resizes asked for and not done, by the allocation they replace (dropped when the grant
    at the new size is read, or the allocation is released for another reason): a grow's extra GPUs
    are held for its job meanwhile (:meth:`snapshot`)."""
    _snapshot: Snapshot | None = None
    _run_facts: dict[CoreJobId, tuple[str, RunFacts]] = field(default_factory=dict, repr=False)
    """Running job → (its allocation, its run facts), so each cycle does not work them out again."""
    _starts: dict[tuple[object, ...], EarliestStart] = field(default_factory=dict, repr=False)
    """Reserve's earliest starts (`QueueContext.start_memo`), each read only on the snapshot version it
    was found on: the run facts (grant times) change only with the snapshot."""

    # -- folding the log ---------------------------------------------------------------------

    def restore(self, envelope: Envelope) -> None:
        self.fold(envelope)

    def fold(self, envelope: Envelope) -> bool:
        """Apply one fact; True when it may let a waiting job run: new capacity, a new job, or capacity
        lost (a failed node or GPU, a cordon), which may leave a reserved gang no way to fit and so free
        the GPUs it held back for the jobs behind it."""
        data = envelope.data
        if isinstance(data, NodeRegistered):
            latest = self.registered_at.get(data.node)
            if latest is not None and envelope.time < latest:
                # An older registration read again (the restore, then the live poll): the newer one stands.
                return False
            self.registered_at[data.node] = envelope.time
            problem = node_problem(core_node(data, cordoned=False, unusable_gpus=frozenset()))
            if problem is not None:
                # Hardware the core cannot model: the node takes no work (fold_event announces why).
                self.nodes.pop(data.node, None)
                self.refused[data.node] = (envelope.id, problem)
                self._snapshot = None
                return False
            self.refused.pop(data.node, None)
            self.nodes[data.node] = data
            # A registration resets the GPUs' health, but not a change reported after it.
            for marked in (self.failed_gpus.get(data.node), self.degraded_gpus.get(data.node)):
                if marked:
                    marked -= {g for g in marked if self.gpu_health_at[(data.node, g)] <= envelope.time}
            self._snapshot = None
            return True
        if isinstance(data, NodeRejected):
            if data.registration_id is not None:
                self.rejections_sent.add(data.registration_id)
            return False
        if isinstance(data, NodeCordoned | NodeUncordoned):
            if not self.cordons.fold(envelope):
                return False
            self._snapshot = None
            return True  # back in service: room; cordoned: a reservation on it may have to move
        if isinstance(data, NodeFailed):
            self.failed_at[data.node] = max(envelope.time, self.failed_at.get(data.node, envelope.time))
            self._snapshot = None
            return True  # a reservation on the node may have to move, or no longer hold anything back
        if isinstance(data, GpuHealthChanged):
            if data.previous == data.state:
                return False  # a repeated-error report for node_health's windows, not a change of state
            registered = self.registered_at.get(data.node)
            last = self.gpu_health_at.get((data.node, data.gpu))
            stale = (registered is not None and envelope.time < registered) or (
                last is not None and envelope.time < last
            )
            if stale:
                return False  # older than a re-registration or a newer report: read again, not news
            self.gpu_health_at[(data.node, data.gpu)] = envelope.time
            failed = self.failed_gpus.setdefault(data.node, set())
            degraded = self.degraded_gpus.setdefault(data.node, set())
            failed.discard(data.gpu)
            degraded.discard(data.gpu)
            if data.state == "failed":
                failed.add(data.gpu)
            elif data.state == "degraded":
                degraded.add(data.gpu)
            self._snapshot = None
            return True  # healthy: room; failed or degraded: a reservation may no longer fit there
        job_event = JobAdmitted | JobRouted | JobQueued | JobRequeued | JobCompleted | JobFailed
        if isinstance(data, job_event) and data.job_id in self.retired:
            return False  # finished and released: nothing about it can change any more
        if isinstance(data, AllocationGranted | AllocationReleased) and self._absorbed_by_retired(data):
            return False
        if isinstance(data, JobAdmitted | JobRouted):
            # Routed to a pool (job.routed): what a pool's owners read instead of the job.admitted.
            record = self._record(data.job_id)
            if record.spec is None:
                record.spec = data.spec
                record.admitted_at = data.admitted_at if isinstance(data, JobRouted) else envelope.time
            return self._refresh(record)
        if isinstance(data, JobQueued):
            record = self._record(data.job_id)
            moved = (
                data.replaces is not None and data.gpu_type is not None and data.gpu_type != record.flavour
            )
            if data.replaces is None:
                record.queued.add(envelope.id)  # a move (``replaces``) is the same attempt, elsewhere
            if data.gpu_type is not None:
                record.flavour = data.gpu_type
            new = self._refresh(record)
            return new or (moved and record.job_id in self.waiting)  # a move: another model may hold it
        if isinstance(data, JobRequeued):
            record = self._record(data.job_id)
            record.requeued_attempt = max(record.requeued_attempt, data.attempt)
            return self._refresh(record)
        if isinstance(data, JobPreempting):
            if data.preemptor_job_id is not None and data.preemptor_job_id not in self.retired:
                victims = self.preemptors.setdefault(data.preemptor_job_id, set())
                victims.add((data.job_id, data.allocation_id))
            return False
        if isinstance(data, JobResizing):
            return self._fold_resizing(data)
        if isinstance(data, JobCompleted | JobFailed):
            record = self._record(data.job_id)
            record.finished = True
            if data.allocation_id is not None:
                record.ended.setdefault(data.allocation_id, data)
                self._note_end(record, data.allocation_id)
            self._refresh(record)
            return False
        if isinstance(data, AllocationGranted):
            record = self._record(data.job_id)
            if data.allocation_id in record.grants:
                return False
            record.grants[data.allocation_id] = data
            record.granted_at.setdefault(data.allocation_id, envelope.time)
            freed = False
            if data.resizes is not None:
                # The resize is done: the allocation it replaces, and a grow's held GPUs, give way to it.
                self.resizing.pop(data.resizes, None)
                self._snapshot = None
                replaced = record.grants.get(data.resizes)
                freed = replaced is not None and replaced.gpu_share > data.gpu_share  # a shrink frees GPUs
            mirrored = self._snapshot
            # Its GPUs may look taken (a release not read yet): then the snapshot is rebuilt from the
            # records when next wanted, by the same rule whenever that is (see _holders).
            if (
                data.allocation_id not in record.released
                and mirrored is not None
                and not self._grant_in_snapshot(mirrored, record, data)
            ):
                self._snapshot = None
            self._note_end(record, data.allocation_id)
            self._refresh(record)
            return freed
        if isinstance(data, AllocationReleased):
            record = self._record(data.job_id)
            if data.allocation_id in record.released:
                return False
            was_live = record.live()
            record.released.add(data.allocation_id)
            self.to_release.discard((data.job_id, data.allocation_id))
            if data.reason == "resized":
                # Its GPUs stay held until the grant at the new size, in the same transaction, is read.
                record.resized.add(data.allocation_id)
                self._refresh(record)
                return False
            resize = self.resizing.pop(data.allocation_id, None)
            if resize is not None and resize.grows:
                self._snapshot = None  # the extra GPUs held for the grow: granted now, or free again
            if data.reason in FINAL_RELEASES:
                record.finished = True
            if (
                was_live is not None
                and was_live.allocation_id == data.allocation_id
                and self._snapshot is not None
            ):
                self._snapshot.release(CoreJobId(data.job_id))
            self._refresh(record)
            return True
        return False

    def _fold_resizing(self, data: JobResizing) -> bool:
        """An elastic resize asked for: kept until its allocation is released; never new capacity."""
        record = self.jobs.get(data.job_id)
        if record is None or data.allocation_id in record.released or data.allocation_id in self.resizing:
            return False  # retired, released already (read again), or known
        self.resizing[data.allocation_id] = data
        if data.preemptor_job_id is not None and data.preemptor_job_id not in self.retired:
            victims = self.preemptors.setdefault(data.preemptor_job_id, set())
            victims.add((data.job_id, data.allocation_id))
        if data.grows:
            self._snapshot = None  # its extra GPUs are held for it from now on
        return False

    def resizing_jobs(self) -> frozenset[CoreJobId]:
        """Jobs with a resize in flight: no other resize or victim search takes them meanwhile."""
        return frozenset(CoreJobId(r.job_id) for r in self.resizing.values())

    def _hold_grows(self, snap: Snapshot) -> None:
        """Hold each grow's extra GPUs for its job in ``snap``, so no other job is granted them."""
        for allocation_id, resize in sorted(self.resizing.items()):
            running = snap.running.get(CoreJobId(resize.job_id))
            if not resize.grows or running is None or str(running.allocation.id) != allocation_id:
                continue
            own = {g for p in running.allocation.placements for g in p.gpus}
            extra = [
                replace(p, gpus=(g,)) if p.mig is None and p.milli is None else p
                for p in core_placements(resize.placements)
                for g in (p.gpus if p.mig is None and p.milli is None else p.gpus[:1])
                if g not in own
            ]
            slots = snap.slots_of(Allocation(CoreAllocationId(allocation_id), running.job.id, tuple(extra)))
            if isinstance(slots, str):
                log.warning("cannot hold the GPUs of %s's grow: %s", resize.job_id, slots)
                continue
            for slot in slots:
                if snap.slot_conflict(running.job, slot) is None:
                    snap.take(running.job, slot)

    def _absorbed_by_retired(self, data: AllocationGranted | AllocationReleased) -> bool:
        """Whether a retired job's allocation event is fully accounted for by what was kept of it.

        A release, or a re-delivered grant, is; a grant the log holds after the job ended (a
        release never written) brings the record back, finished, so its GPUs stay taken.
        """
        released = self.retired.get(data.job_id)
        if released is None:
            return False
        if isinstance(data, AllocationReleased):
            if data.allocation_id not in released:
                self.retired[data.job_id] = (*released, data.allocation_id)
            return True
        if data.allocation_id in released:
            return True
        del self.retired[data.job_id]
        self.jobs[data.job_id] = JobRecord(data.job_id, released=set(released), finished=True)
        return False

    def _note_end(self, record: JobRecord, allocation_id: AllocationId) -> None:
        """An allocation granted, not released, and reported ended (read in any order) is due a release."""
        if (
            allocation_id in record.ended
            and allocation_id in record.grants
            and allocation_id not in record.released
        ):
            self.to_release.add((record.job_id, allocation_id))

    def _retire(self, record: JobRecord) -> None:
        del self.jobs[record.job_id]
        self.retired[record.job_id] = tuple(sorted(record.released))
        for allocation_id in record.grants:
            self.resizing.pop(allocation_id, None)
        self.preemptors.pop(record.job_id, None)

    def _record(self, job_id: JobId) -> JobRecord:
        record = self.jobs.get(job_id)
        if record is None:
            record = self.jobs[job_id] = JobRecord(job_id)
        return record

    def gated_for(self, record: JobRecord) -> bool:
        """Whether ``record`` waits for quota's job.queued (not for a job of an unlimited queue)."""
        spec = record.spec
        return self.gated and (spec is None or spec.queue not in self.unlimited_queues)

    def _refresh(self, record: JobRecord) -> bool:
        if record.waiting(self.gated_for(record)):
            new = record.job_id not in self.waiting
            self.waiting[record.job_id] = record
            return new
        self.waiting.pop(record.job_id, None)
        self.last_pending.pop(record.job_id, None)
        # An end read before its grant (a restore reads jobs.events first) keeps the job until it is released;
        # a job that ended without one (failed by quota, cancelled while waiting) is retired at once (a
        # grant read after that brings it back, finished: `_absorbed_by_retired`).
        ended_unreleased = any(a not in record.released for a in record.ended)
        if record.finished and record.live() is None and not ended_unreleased:
            self._retire(record)
        return False

    # -- the cluster as the core sees it ---------------------------------------------------

    def cordoned(self, node: NodeId) -> bool:
        """No new work on ``node``: it failed (since its latest registration) or an operator cordoned it."""
        return self.cordons.cordoned(node) or self.node_failed(node)

    def unusable_gpus(self, node: NodeId) -> frozenset[str]:
        """The GPUs of ``node`` that take no new work: failed or degraded."""
        return frozenset(self.failed_gpus.get(node, set()) | self.degraded_gpus.get(node, set()))

    def node_failed(self, node: NodeId) -> bool:
        """Whether ``node`` failed since its latest registration (whatever order the two were read in)."""
        failed = self.failed_at.get(node)
        return failed is not None and failed >= self.registered_at.get(node, failed)

    def failure_under(self, granted: AllocationGranted) -> FailureKind | None:
        """What failed under ``granted``, as a requeue names it: a node it has a rank on (``node_failed``),
        else a GPU it holds (``gpu_failed``), each since the node's latest registration; None when sound."""
        nodes = {p.node for p in granted.placements}
        if any(self.node_failed(n) for n in sorted(nodes)):
            return "node_failed"
        if any(set(p.gpus) & self.failed_gpus.get(p.node, set()) for p in granted.placements):
            return "gpu_failed"
        return None

    def snapshot(self) -> Snapshot:
        if self._snapshot is None:
            nodes = [
                core_node(
                    n,
                    cordoned=self.cordoned(n.node),
                    unusable_gpus=self.unusable_gpus(n.node),
                )
                for n in self.nodes.values()
            ]
            snap = Snapshot(nodes)
            for node, why in snap.refused.items():
                log.warning("node %s is left out of the cluster: %s", node, why)
            for record, live in self._holders():
                self._grant_in_snapshot(snap, record, live)
            if self.resizing:
                self._hold_grows(snap)
            self._snapshot = snap
        return self._snapshot

    def _holders(self) -> list[tuple[JobRecord, AllocationGranted]]:
        """The live grants to mirror, oldest first; of two that hold one whole GPU, the newer.

        Two live grants of one GPU mean the older one's release is in the log but not read yet (the
        partitions of allocations.log are read side by side, a restore reads them one after the other):
        the grant was written after its writer read that release. Which of the two is mirrored must not
        depend on the order the facts were read in, or a restarted service and its replay see two clusters.
        """
        live = [
            (record, granted) for record in self.jobs.values() if (granted := record.holding()) is not None
        ]

        def written(item: tuple[JobRecord, AllocationGranted]) -> tuple[datetime, str, str]:
            record, granted = item
            at = record.granted_at.get(granted.allocation_id, _NEVER)
            return (at, record.job_id, granted.allocation_id)

        taken: set[tuple[str, str]] = set()
        kept: list[tuple[JobRecord, AllocationGranted]] = []
        for record, granted in sorted(live, key=written, reverse=True):
            whole = {(p.node, gpu) for p in granted.placements if not p.shared for gpu in p.gpus}
            if whole & taken:
                log.warning(
                    "cannot mirror a grant in the snapshot: %s holds GPUs granted since to another job "
                    "(its release not read yet)",
                    granted.allocation_id,
                )
                continue
            taken |= whole
            kept.append((record, granted))
        return kept[::-1]

    @staticmethod
    def _grant_in_snapshot(snap: Snapshot, record: JobRecord, granted: AllocationGranted) -> bool:
        spec = record.spec or JobSpec(queue=granted.queue, workers=granted.workers, gpus_per_worker=1)
        status = snap.grant(core_job(record.job_id, spec), core_allocation(granted))
        if not status.ok:
            # The log is the truth; a grant we cannot mirror (e.g. a node not registered yet) is logged.
            log.warning("cannot mirror a grant in the snapshot: %s", status.message)
        return bool(status.ok)

    def running(self) -> list[RunningJob]:
        return list(self.snapshot().running.values())

    def queue_context(
        self, snap: Snapshot, jobs: list[Job], *, now: datetime, policy: PreemptionPolicy | None = None
    ) -> QueueContext:
        """The core's queue facts for a cycle: no quota (the quota service is the gate), the clock,
        when each waiting job was admitted, when each running job started, and what preemption frees."""
        submit_time: dict[CoreJobId, float] = {}  # only the cycle's jobs' are read (its fair order)
        for job in jobs:
            waiting = self.waiting.get(JobId(job.id))
            if waiting is not None and waiting.admitted_at:
                submit_time[job.id] = waiting.admitted_at.timestamp()
        known = self._run_facts
        if len(known) > 2 * len(snap.running) + 64:
            self._run_facts = known = {j: f for j, f in known.items() if j in snap.running}
        # Worked out for the running jobs the cycle asks about, not for every running job of the cluster.
        run_facts = _RunFactsOf(self, dict(snap.running), known)
        ctx = open_context(
            snap,
            jobs,
            now=now.timestamp(),
            submit_time=submit_time,
            run_facts=run_facts,
            in_flight=self.resizing_jobs(),
            freeing=self.freeing(),
            policy=policy,
        )
        if len(self._starts) > 4096:
            self._starts.clear()  # one entry per request shape: bounded, but never unbounded
        ctx.start_memo = self._starts
        return ctx

    def freeing(self) -> dict[CoreJobId, frozenset[CoreGpuId]]:
        """Per waiting preemptor, the GPUs of the allocations its victims were asked to give back."""
        out: dict[CoreJobId, frozenset[CoreGpuId]] = {}
        for preemptor, victims in self.preemptors.items():
            if preemptor not in self.waiting:
                continue
            gpus: set[CoreGpuId] = set()
            for victim, allocation_id in victims:
                record = self.jobs.get(victim)
                granted = record.grants.get(allocation_id) if record is not None else None
                if granted is not None:
                    gpus.update(core_gpu_id(p.node, g) for p in granted.placements for g in p.gpus)
                resize = self.resizing.get(allocation_id)
                if resize is not None:  # a shrink keeps these: only the rest is freed
                    gpus.difference_update(core_gpu_id(p.node, g) for p in resize.placements for g in p.gpus)
            out[CoreJobId(preemptor)] = frozenset(gpus)
        return out


class _RunFactsOf(Mapping[CoreJobId, RunFacts]):
    """When each job of ``running`` (the snapshot's, as the cycle began) started: its live grant's time in
    the fold, worked out when a cycle asks and kept in ``known`` while the job holds that allocation."""

    def __init__(
        self,
        fold: ClusterFold,
        running: dict[CoreJobId, RunningJob],
        known: dict[CoreJobId, tuple[str, RunFacts]],
    ) -> None:
        self._fold = fold
        self._running = running
        self._known = known
        self._asked: dict[CoreJobId, RunFacts | None] = {}

    def get(self, job_id: CoreJobId, default: Any = None) -> Any:
        if job_id in self._asked:
            facts = self._asked[job_id]
        else:
            facts = self._asked[job_id] = self._facts(job_id)
        return default if facts is None else facts

    def __getitem__(self, job_id: CoreJobId) -> RunFacts:
        facts = self.get(job_id)
        if facts is None:
            raise KeyError(job_id)
        return cast(RunFacts, facts)

    def __iter__(self) -> Iterator[CoreJobId]:
        return (job_id for job_id in self._running if self.get(job_id) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return bool(self._running)

    def _facts(self, job_id: CoreJobId) -> RunFacts | None:
        running = self._running.get(job_id)
        if running is None:
            return None
        seen = self._known.get(job_id)
        if seen is not None and seen[0] == running.allocation.id:
            return seen[1]  # the same allocation: its grant's time does not change
        record = self._fold.jobs.get(JobId(job_id))
        live = record.live() if record is not None else None
        started = record.granted_at.get(live.allocation_id) if record and live else None
        if started is None:
            return None
        facts = RunFacts(started_at=started.timestamp())
        if live is not None and str(live.allocation_id) == running.allocation.id:
            self._known[job_id] = (running.allocation.id, facts)
        return facts
