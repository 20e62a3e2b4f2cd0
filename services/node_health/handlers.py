"""Node health's decisions (pure): silent nodes fail; failed nodes and GPUs give their gangs back;
GPUs whose errors repeat are drained before they fail.

Silence is judged in the heartbeat stream's own time (the rule is the core's:
:mod:`gangline.core.silence`). Every heartbeat consumed is a tick, and at most every ``check_every_s``
(of ``now``, the caller's clock) the service looks for nodes silent longer than ``silence_s``. A node's
silence is the time the bus was *heard* since its last beat, up to the newest beat heard: time in which
no node's heartbeat got into the log for longer than ``outage_gap_s`` (the broker was down or
unreachable, every agent was cut off) counts toward nobody's silence, however short or long the
outage. When a beat was heard is the record's timestamp in the log (when the agent handed it to the
broker: an agent's beats stamped during an outage and sent after it do not hide it), else its own time.
So the verdict is a function of the log, and a replay of it decides the same. Silence is also judged
only while the service keeps up with the log: a heartbeat consumed more than ``max_lag`` after it was
sent means node_health itself is behind (a burst, a restart, a starved CPU); it waits until it has
caught up. (While every node is silent no tick arrives; that whole-cluster outage is left to
operators.)

For a failed node (declared here, reported by an agent, or by an operator) or a failed GPU, every
live allocation that uses it is released (``node_failed``) and its job requeued as its next attempt
(the gang is whole again elsewhere; placement decides where), except one whose end was already
reported (placement releases it for that end). A grant read after the failure of a node or GPU it
uses is released the same way (:func:`release_stranded`): placement may read the requeue before the
failure and put the job back where it was. Ids derive from the node, its last heartbeat sequence and
the allocation, so a retried or repeated decision has the same ids.

The drain policy is the core's (:mod:`gangline.core.health`); node_health applies its rate rule, and
only node_health does. Agents classify single events themselves (an XID 79 is ``failed`` at once, in
their own ``gpu.health_changed``) and report every job-fault XID, warning XID and correctable ECC error
on nodes.health (``gpu.error_reported``, with a count; a ``gpu.health_changed`` with such a cause counts
too). The core's per-GPU windows over them (:class:`~services.node_health.rates.GpuErrorRates`, in the
events' time) mark a GPU ``degraded`` once a kind reaches its limit: one ``gpu.health_changed``
(healthy -> degraded) from node_health, so no new work lands there while the running job may finish.
The GPU stays degraded until its node registers again (reset / repair).

Which nodes are registered or failed, and each job's grants and releases, are the one lifecycle fold
(:class:`~gangline.fold.cluster.ClusterFold`, placement's and preemption's): a node is failed from a
``node.failed`` until a later registration, whatever order the two are read in, so a failure older
than the node's latest registration is history and releases nothing.

Operators' drains (``node.cordoned`` mode drain on nodes.operator; the cordon state is the one fold of
:mod:`gangline.fold.cordons`, the rule when work must leave :mod:`gangline.core.cordon`): once the
drain's ``drain_grace_s`` has passed, every live allocation on the node is asked to leave with a
``job.preempting`` (deadline: now + the job's ``checkpoint_grace_s``, no preemptor), once per
allocation. The agent sends the checkpoint signal; preemption, which carries out every
``job.preempting`` in the log, releases the GPUs at the checkpoint or the deadline and requeues the
job, and placement puts it elsewhere (the node is cordoned). A plain cordon asks nothing. The
cordons are the fold's too (:attr:`ClusterFold.cordons`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

from gangline.bus import Outgoing
from gangline.core.silence import Hearing, silent
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.ids import derived_id
from gangline.events.jobs import (
    JobCheckpointed,
    JobPreempting,
    JobRequeued,
)
from gangline.events.nodes import (
    GpuErrorReported,
    GpuHealthChanged,
    HealthCause,
    HealthState,
    NodeFailed,
    NodeHeartbeat,
    NodeRegistered,
)
from gangline.events.types import AllocationId, GpuId, JobId, NodeId
from gangline.fold.cluster import ClusterFold, FailureKind
from gangline.fold.cordons import NodeCordons
from services.common.topics import TopicNames
from services.node_health.rates import GpuErrorRates, GpuKey

SOURCE = "gangline/node-health"


@dataclass
class NodeHealthState:
    topics: TopicNames
    silence: timedelta
    check_every: timedelta
    started: datetime
    max_lag: timedelta | None = None
    """How far behind the heartbeats node_health may be and still judge silence; half the silence
    when unset."""
    outage_gap: timedelta | None = None
    """A pause this long in every node's heartbeats is an outage of the bus, not silence of the nodes
    (:class:`~gangline.core.silence.Hearing`); half the silence when unset."""
    cluster: ClusterFold = field(default_factory=lambda: ClusterFold(gated=False))
    """The one lifecycle fold: which nodes are registered or failed (in whichever order their facts are
    read), and each job's grants and releases (its live allocations, how many attempts it had)."""
    last_seen: dict[NodeId, datetime] = field(default_factory=dict)
    last_seq: dict[NodeId, int] = field(default_factory=dict)
    checkpoints: dict[JobId, str] = field(default_factory=dict)
    last_check: datetime | None = None
    hearing: Hearing = field(init=False)
    """When the bus was heard (every node's beats, by their log timestamps): what silence counts over."""
    rates: GpuErrorRates = field(default_factory=GpuErrorRates)
    """The drain policy's windows (the core's defaults unless the settings say otherwise)."""
    gpu_state: dict[GpuKey, HealthState] = field(default_factory=dict)
    """Each GPU's state as its agent last reported it."""
    reported_at: dict[GpuKey, datetime] = field(default_factory=dict)
    """When the report that set ``gpu_state`` was made (a later registration resets it, an earlier not)."""
    degraded: dict[GpuKey, datetime] = field(default_factory=dict)
    """GPUs node_health itself drained for repeated errors, with the time of its verdict."""
    counted: dict[GpuKey, dict[str, datetime]] = field(default_factory=dict)
    """The ids of the reports each GPU's error windows counted since its node's latest registration, with
    their times."""
    asked_to_leave: set[AllocationId] = field(default_factory=set)
    """Live allocations a ``job.preempting`` was written for (by anyone): a drain asks them no more."""

    def __post_init__(self) -> None:
        self.hearing = Hearing(self.outage_gap or self.silence / 2)

    SNAPSHOT_FIELDS: ClassVar[tuple[str, ...]] = (
        *(f"cluster.{name}" for name in ClusterFold.SNAPSHOT_FIELDS),
        "checkpoints",
        "rates._windows",
        "gpu_state",
        "reported_at",
        "counted",
        "degraded",
        "asked_to_leave",
    )
    """What a restore from the log fills, and nothing else (services.common.snapshots): the lifecycle
    fold, checkpoints, the error windows (event times), the reports they counted and the GPU states,
    and who was asked to leave. Not
    what heartbeats fill (``last_seq``, ``hearing``, and ``last_seen`` beyond the
    registrations: the restore reads no heartbeats, and silence is counted from the run's start), nor
    ``last_check`` (a decision's), nor the settings (``silence``, ``check_every``, ``started``,
    ``max_lag``, the drain policy). :meth:`snapshot_loaded` sets ``last_seen`` as a restore does."""
    SNAPSHOT_VERSION: ClassVar[int] = 4
    """2: the lifecycle fold keeps elastic resizes; 3: its retired jobs packed (gangline.fold.retired);
    4: the GPU reports' times (a registration forgets only what came before it)."""

    def snapshot_loaded(self) -> None:
        """After a snapshot is loaded: every registered node was last seen at its latest registration or
        at this run's start, whichever is later, as a restore from the log leaves it (the error windows
        judge by the settings' policy, which the snapshot's config matches)."""
        self.last_seen = {n: max(t, self.started) for n, t in self.cluster.registered_at.items()}
        self.rates.adopt_policy()

    def restore(self, envelope: Envelope) -> None:
        self.fold(envelope)

    @property
    def cordons(self) -> NodeCordons:
        """Operators' cordons and drains (nodes.operator), as the one fold keeps them."""
        return self.cluster.cordons

    @property
    def failed(self) -> frozenset[NodeId]:
        """The nodes failed since their latest registration."""
        return frozenset(n for n in self.cluster.failed_at if self.cluster.node_failed(n))

    def live_on(self, node: NodeId) -> dict[AllocationId, AllocationGranted]:
        """The live allocations with a rank on ``node`` (what a drain sends away)."""
        return {a: g for a, g in self.live.items() if any(p.node == node for p in g.placements)}

    def checkpoint_grace(self, job_id: JobId) -> int:
        """The job's ``checkpoint_grace_s`` (from job.admitted): what a drain gives it."""
        record = self.cluster.jobs.get(job_id)
        return record.spec.checkpoint_grace_s if record is not None and record.spec is not None else 0

    @property
    def live(self) -> dict[AllocationId, AllocationGranted]:
        """Every allocation granted and not released, by id."""
        out: dict[AllocationId, AllocationGranted] = {}
        for record in self.cluster.jobs.values():
            granted = record.live()
            if granted is not None:
                out[granted.allocation_id] = granted
        return out

    def fold(self, envelope: Envelope, *, heard_at: datetime | None = None) -> None:
        """Fold one event; ``heard_at``: for a heartbeat, its record's timestamp in the log (when the bus
        heard it), its own time when unknown."""
        data = envelope.data
        if isinstance(data, NodeRegistered):
            latest = self.cluster.registered_at.get(data.node)
            self.cluster.fold(envelope)
            if latest is not None and envelope.time <= latest:
                return  # read again (the restore, then the live poll): it must not undo what came after
            self._reset(data.node, envelope.time)
            seen = self.last_seen.get(data.node, envelope.time)
            self.last_seen[data.node] = max(envelope.time, seen, self.started)
        elif isinstance(data, NodeHeartbeat):
            self.hearing.hear(heard_at or envelope.time)  # a failed node's beat shows the bus is up, too
            if not self.cluster.node_failed(data.node):
                seen = self.last_seen.get(data.node, envelope.time)
                self.last_seen[data.node] = max(envelope.time, seen, self.started)
                self.last_seq[data.node] = data.seq
        elif isinstance(data, GpuHealthChanged):
            self.cluster.fold(envelope)
            key = (data.node, data.gpu)
            if self._before_registration(data.node, envelope.time):
                return
            if envelope.source == SOURCE:
                if data.state == "degraded":
                    self.degraded[key] = envelope.time
            else:
                self.gpu_state[key] = data.state
                self.reported_at[key] = envelope.time
                self._count(key, envelope)
        elif isinstance(data, GpuErrorReported):
            if self._before_registration(data.node, envelope.time):
                return
            key = (data.node, data.gpu)
            self.gpu_state[key] = data.state
            self.reported_at[key] = envelope.time
            self._count(key, envelope)
        elif isinstance(data, JobCheckpointed):
            self.checkpoints[data.job_id] = data.checkpoint
        else:
            if isinstance(data, JobPreempting) and not self._released(data.job_id, data.allocation_id):
                self.asked_to_leave.add(data.allocation_id)
            elif isinstance(data, AllocationReleased):
                self.asked_to_leave.discard(data.allocation_id)
            # node.failed, operators' cordons, job.admitted / ends, allocation.granted / released
            self.cluster.fold(envelope)

    def _reset(self, node: NodeId, registered: datetime) -> None:
        """The node registered (reset, repair) at ``registered``: what its GPUs reported before then is
        history; what they reported after stays, though it may have been read first (a restore reads
        nodes.inventory before nodes.health, the running service reads them in whichever order the
        records come), so both orders leave the same state."""
        self.rates.reset_node(node, registered)
        self.degraded = {k: t for k, t in self.degraded.items() if k[0] != node or t >= registered}
        stale = {k for k, t in self.reported_at.items() if k[0] == node and t < registered}
        self.gpu_state = {k: v for k, v in self.gpu_state.items() if k not in stale}
        self.reported_at = {k: t for k, t in self.reported_at.items() if k not in stale}
        counted = {
            k: {i: t for i, t in ids.items() if k[0] != node or t >= registered}
            for k, ids in self.counted.items()
        }
        self.counted = {k: ids for k, ids in counted.items() if ids}

    def _count(self, key: GpuKey, envelope: Envelope) -> None:
        """Add an agent's report to the GPU's error windows, once per event id (a batch retried after an
        aborted transaction hands its records to the handler again)."""
        counted = self.counted.setdefault(key, {})
        if envelope.id in counted:
            return
        counted[envelope.id] = envelope.time
        data = envelope.data
        assert isinstance(data, GpuHealthChanged | GpuErrorReported)
        self.rates.record(data, envelope.time)

    def _before_registration(self, node: NodeId, at: datetime) -> bool:
        """Whether a GPU report at ``at`` is older than the node's latest registration: history, which
        that registration reset, in whichever order the two are read (a restore reads nodes.inventory
        before nodes.health; the running service may read them the other way round)."""
        registered = self.cluster.registered_at.get(node)
        return registered is not None and at < registered

    def _released(self, job_id: JobId, allocation_id: AllocationId) -> bool:
        record = self.cluster.jobs.get(job_id)
        return record is None or allocation_id in record.released or allocation_id not in record.grants


def decide(
    envelope: Envelope, state: NodeHealthState, *, now: datetime, heard_at: datetime | None = None
) -> list[Outgoing]:
    """Fold ``envelope`` and decide; ``heard_at``: its record's timestamp in the log (see :meth:`fold`)."""
    out = _decide(envelope, state, now=now, heard_at=heard_at)
    return out + drain(state, now=now) if state.cordons.evicts_at else out


def _decide(
    envelope: Envelope, state: NodeHealthState, *, now: datetime, heard_at: datetime | None
) -> list[Outgoing]:
    data = envelope.data
    if isinstance(data, NodeFailed):
        first = not state.cluster.node_failed(data.node)
        state.fold(envelope)
        return (
            release_on(state, data.node, None, now=now)
            if first and state.cluster.node_failed(data.node)
            else []
        )
    if isinstance(data, GpuHealthChanged):
        state.fold(envelope)
        if envelope.source == SOURCE:
            return []
        if data.state == "failed":
            return release_on(state, data.node, data.gpu, now=now)
        return check_error_rate(state, data.node, data.gpu, cause=envelope.id, at=envelope.time)
    if isinstance(data, GpuErrorReported):
        state.fold(envelope)
        return check_error_rate(state, data.node, data.gpu, cause=envelope.id, at=envelope.time)
    if isinstance(data, AllocationGranted):
        state.fold(envelope)
        return release_stranded(state, data, now=now)
    state.fold(envelope, heard_at=heard_at)
    if isinstance(data, NodeHeartbeat):
        if now - envelope.time > (state.max_lag or state.silence / 2):
            return []  # behind the log: the beats not read yet may speak for the "silent" nodes
        return check_silence(state, now=now)
    return []


def check_silence(state: NodeHealthState, *, now: datetime) -> list[Outgoing]:
    """Declare failed every node silent for longer than ``silence`` (at most every ``check_every``).

    Silent by the core's rule (:func:`gangline.core.silence.silent`): over the time the bus was heard,
    at the newest beat heard.
    """
    if state.last_check is not None and now - state.last_check < state.check_every:
        return []
    state.last_check = now
    watched = {
        node: max(seen, state.started)
        for node, seen in sorted(state.last_seen.items())
        if not state.cluster.node_failed(node)
    }
    if watched:
        state.hearing.forget_before(min(watched.values()))
    out: list[Outgoing] = []
    for node, heard in silent(watched, state.hearing, silence=state.silence):
        seen = state.last_seen[node]
        seq = state.last_seq.get(node)
        failed = NodeFailed(
            node=node,
            code="heartbeat_timeout",
            reason=(
                f"no heartbeat from {node} for {int((now - seen).total_seconds())} s, "
                f"{int(heard.total_seconds())} s of it with the bus heard "
                f"(limit {state.silence.total_seconds():g} s)"
            ),
            last_seq=seq,
        )
        cause = derived_id(node, "silent", seq if seq is not None else "never")
        envelope = _envelope(failed, cause, "failed", now)
        out.append((state.topics.health, envelope))
        state.fold(envelope)
        out += release_on(state, node, None, now=now)
    return out


def check_error_rate(
    state: NodeHealthState, node: NodeId, gpu: GpuId, *, cause: str, at: datetime
) -> list[Outgoing]:
    """Drain a healthy GPU whose reported errors reached a limit within the window (once)."""
    key = (node, gpu)
    if (
        key in state.degraded
        or state.cluster.node_failed(node)
        or state.gpu_state.get(key, "healthy") != "healthy"
    ):
        return []
    verdict = state.rates.over_limit(node, gpu, at)
    if verdict is None:
        return []
    message = verdict.sentence(f"{node}/{gpu}")
    health_cause = (
        HealthCause(kind="ecc", message=message)
        if verdict.kind == "correctable_ecc"
        else HealthCause(kind="xid", message=message, xid=verdict.last_xid)
    )
    changed = GpuHealthChanged(node=node, gpu=gpu, previous="healthy", state="degraded", cause=health_cause)
    envelope = _envelope(changed, cause, f"degraded-{gpu}", at)
    state.fold(envelope)
    return [(state.topics.health, envelope)]


def drain(state: NodeHealthState, *, now: datetime) -> list[Outgoing]:
    """Ask every live allocation on a node whose drain grace has passed to leave (once each)."""
    out: list[Outgoing] = []
    for node in state.cordons.evicting(now):
        cordon = state.cordons.of(node)
        why = f" ({cordon.reason})" if cordon is not None and cordon.reason else ""
        live = state.live_on(node)
        for allocation_id in sorted(set(live) - state.asked_to_leave):
            granted = live[allocation_id]
            grace = state.checkpoint_grace(granted.job_id)
            asked = JobPreempting(
                job_id=granted.job_id,
                allocation_id=granted.allocation_id,
                deadline=now + timedelta(seconds=grace),
                reason=f"node {node} is drained by an operator{why}; checkpoint within {grace} s",
            )
            envelope = _envelope(asked, granted.allocation_id, f"drained-{node}", now)
            state.fold(envelope)
            out.append((state.topics.events, envelope))
    return out


def release_on(state: NodeHealthState, node: NodeId, gpu: str | None, *, now: datetime) -> list[Outgoing]:
    """Release every live allocation on ``node`` (or only those using ``gpu`` there) and requeue its job."""
    hit = [
        granted
        for record in state.cluster.jobs.values()
        if (granted := record.live()) is not None
        and any(p.node == node and (gpu is None or gpu in p.gpus) for p in granted.placements)
    ]
    out: list[Outgoing] = []
    for granted in sorted(hit, key=lambda g: g.allocation_id):
        out += release(state, granted, "node_failed" if gpu is None else "gpu_failed", now=now)
    return out


def release_stranded(state: NodeHealthState, granted: AllocationGranted, *, now: datetime) -> list[Outgoing]:
    """A live grant onto a node or GPU already failed is released and its job requeued, as if the failure
    had come after it.

    Placement grants on what it has read: the failure is on nodes.health, the release and requeue it
    caused on allocations.log and jobs.events, so placement may read the requeue first and put the job
    back onto the failed node's freed GPUs. The failure was decided before that grant was read, so
    nothing else would release it (the silent node never reports its end).
    """
    record = state.cluster.jobs.get(granted.job_id)
    live = record.live() if record is not None else None
    why = state.cluster.failure_under(granted)
    if live is None or live.allocation_id != granted.allocation_id or why is None:
        return []
    return release(state, granted, why, now=now)


def release(
    state: NodeHealthState, granted: AllocationGranted, why: FailureKind, *, now: datetime
) -> list[Outgoing]:
    """``allocation.released`` (node_failed) for ``granted`` and its job's requeue as the next attempt; the
    ids derive from the allocation, so whichever path releases it writes the same events.

    An allocation whose end was read (its job completed or failed there before the failure) is left to
    placement, which releases it for that end: requeueing it would restart a finished job.
    """
    record = state.cluster.jobs[granted.job_id]
    if granted.allocation_id in record.ended:
        return []
    released = AllocationReleased(
        job_id=granted.job_id, allocation_id=granted.allocation_id, reason="node_failed"
    )
    requeued = JobRequeued(
        job_id=granted.job_id,
        reason=why,
        attempt=max(2, record.attempts_granted() + 1),
        resume_from=state.checkpoints.get(granted.job_id),
    )
    release_envelope = _envelope(released, granted.allocation_id, "released-node-failed", now)
    state.fold(release_envelope)
    return [
        (state.topics.allocations, release_envelope),
        (state.topics.events, _envelope(requeued, granted.allocation_id, "requeued-node-failed", now)),
    ]


def _envelope(event: Event, cause: str, kind: str, now: datetime) -> Envelope:
    return make_envelope(event, event_id=derived_id(cause, kind, event.subject()), source=SOURCE, time=now)
