"""The decision services on an in-memory bus and a virtual clock, with simulated nodes (no Kafka).

What runs is what the live services run: admission's ``on_request``, quota's ``decide``, placement's
``fold_event`` + ``end_batch``, preemption's ``fold_event`` + ``end_batch`` and node_health's
``decide``, each on the state its ``wiring.new_state`` builds, each reading the topics its wiring
consumes and selecting the event types its wiring's ``select`` decodes. The simulated nodes act like
``fake-nodes`` (:class:`services.agent.fake.FakeCluster`): they register, heartbeat, start each grant
on their nodes (``job.started``), complete it after its duration hint (``job.completed``) or stop it at
its ``time_limit_s`` when that comes first (``job.checkpointed``, then ``job.failed`` time_limit), stop a job
whose allocation is released, and answer ``job.preempting`` with ``job.checkpointed`` after a delay;
a failed node goes silent (and may report an XID first).

How delivery works (the batching rule)
--------------------------------------
Every input (a request, a node's report, a heartbeat tick, a timer firing) is one *transaction*. The
outputs of a consumer's handling of one transaction are the next transaction. Transactions are
delivered first in, first out; each one to every consumer in a fixed order (admission, quota,
placement, preemption, node_health, then the nodes), each consumer handling the records it selects
from it as one batch: each record in order (selected just before it is handled, as the live
``select`` is asked per record), then its once-per-batch decision. Outputs name their cause as the
processor does (the handled event; a batch decision: the batch's last event). So with inputs spaced
in time a live service sees the same batches: one producer's transaction, read whole
(``read_committed`` makes it visible at once). Everything a transaction causes is decided at the
same virtual time; ``now`` is the virtual clock as a datetime (``EPOCH`` + seconds). Inputs due at
the same virtual time go in the order they were scheduled, except that the nodes' ends of runs
(completions, time limits) go first, as the core's simulator frees what ends before what arrives.

Heartbeats
----------
With ``heartbeats="always"`` every live node beats every ``heartbeat_s`` (one transaction per tick),
as fake-nodes do. With ``"when_needed"`` (long traces) ticks are delivered only while a heartbeat can
decide something: a node is silent and not yet declared failed (node_health's silence check), a victim
is being asked to checkpoint (preemption finishes overdue victims on any event), placement owes a
first cycle with jobs waiting, or an operator's drain still has work on its node (node_health asks it
to leave on the first event after the grace). Before the first tick after a pause, node_health folds
the last skipped round (every live node heard at the previous tick, with its sequence number), which
is all a check during the pause could have seen: every node heard within the silence limit, nothing declared.
"""

from __future__ import annotations

import heapq
import itertools
import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from gangline.bus import Outgoing
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.ids import derived_id
from gangline.events.jobs import (
    JobAdmitted,
    JobCancelRequested,
    JobCheckpointed,
    JobCompleted,
    JobPreempting,
    JobRequested,
    JobResizing,
    JobStarted,
)
from gangline.events.nodes import (
    GpuHealthChanged,
    GpuStatus,
    HealthCause,
    NodeCordoned,
    NodeHeartbeat,
    NodeRegistered,
    NodeUncordoned,
)
from gangline.events.types import AllocationId, JobId, NodeId, Seconds
from gangline.fold.cluster import FOLDED_EVENTS
from services.admission.handlers import on_request
from services.admission.settings import AdmissionSettings
from services.admission.wiring import new_state as admission_state
from services.agent.fake import AGENT_EVENTS, time_limit_reached
from services.common.queues import Queues
from services.common.topics import TopicNames
from services.node_health.handlers import decide as node_health_decide
from services.node_health.settings import NodeHealthSettings
from services.node_health.wiring import NODE_HEALTH_EVENTS
from services.node_health.wiring import new_state as node_health_state
from services.placement.handlers import end_batch as placement_end_batch
from services.placement.handlers import fold_event as placement_fold
from services.placement.settings import PlacementSettings
from services.placement.wiring import new_state as placement_state
from services.preemption.handlers import end_batch as preemption_end_batch
from services.preemption.handlers import fold_event as preemption_fold
from services.preemption.settings import PreemptionSettings
from services.preemption.wiring import new_state as preemption_state
from services.quota.handlers import decide as quota_decide
from services.quota.settings import QuotaSettings
from services.quota.wiring import NODE_EVENTS, QUOTA_EVENTS, job_topics, node_topics
from services.quota.wiring import new_state as quota_state

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Virtual time 0 as a datetime: the ``now`` the services are given is EPOCH + the virtual seconds."""
PRODUCER_SOURCE = "gangline/simulate"
HeartbeatMode = Literal["always", "when_needed"]


def kind_of(envelope: Envelope) -> str:
    """The event type ("job.admitted"), what the live ``select`` reads from the raw record."""
    return type(envelope.data).TYPE


@dataclass(frozen=True, slots=True)
class Transaction:
    """What one producer wrote in one go, at virtual time ``at``: delivered to each consumer as one batch."""

    source: str
    at: float
    outputs: tuple[tuple[str, Envelope], ...]


class Consumer(ABC):
    """One service (or the nodes) as its shell runs it: which topics, which records, how it decides."""

    name: str
    topics: frozenset[str]

    def selects(self, topic: str, envelope: Envelope) -> bool:
        return True

    @abstractmethod
    def handle(self, envelope: Envelope, now: datetime) -> Sequence[Outgoing]:
        """One selected record (the live handler); outputs named after it by the bus."""

    def end_batch(self, last: Envelope, now: datetime) -> Sequence[Outgoing]:
        return []


# -- the decision services, as their wiring runs them -------------------------------------------


class Admission(Consumer):
    name = "admission"

    def __init__(self, settings: AdmissionSettings, queues: Queues) -> None:
        self.state = admission_state(settings, queues)
        t = self.state.topics
        self.topics = frozenset({t.requests, t.inventory})

    def handle(self, envelope: Envelope, now: datetime) -> Sequence[Outgoing]:
        return on_request(envelope, self.state, now=now)


class Quota(Consumer):
    name = "quota"

    def __init__(self, settings: QuotaSettings, queues: Queues) -> None:
        self.state = quota_state(settings, queues)
        t = self.state.topics
        self._nodes = frozenset(node_topics(t))
        self.topics = frozenset({*job_topics(t), *self._nodes})
        self._node_kinds = frozenset(NODE_EVENTS)
        self._job_kinds = frozenset(QUOTA_EVENTS)

    def selects(self, topic: str, envelope: Envelope) -> bool:
        if topic in self._nodes:
            return kind_of(envelope) in self._node_kinds
        # quota_select: records keyed by a retired job are skipped undecoded (the key is the job id).
        job_id = getattr(envelope.data, "job_id", None)
        return kind_of(envelope) in self._job_kinds and job_id not in self.state.retired

    def handle(self, envelope: Envelope, now: datetime) -> Sequence[Outgoing]:
        return quota_decide(envelope, self.state, now=now)


class Placement(Consumer):
    name = "placement"

    def __init__(self, settings: PlacementSettings, queues: Queues) -> None:
        self.state = placement_state(settings, queues)
        t = self.state.topics
        self._requests, self._heartbeats = t.requests, t.heartbeats
        self.topics = frozenset(
            {t.inventory, t.health, t.operator, t.events, t.allocations, t.heartbeats, t.requests}
        )
        self._kinds = frozenset(FOLDED_EVENTS) - {"allocation.granted"}  # its own grants it holds

    def selects(self, topic: str, envelope: Envelope) -> bool:
        if topic == self._requests:
            return kind_of(envelope) == JobCancelRequested.TYPE
        if topic == self._heartbeats:
            return self.state.needs_cycle
        if isinstance(envelope.data, AllocationGranted):
            return envelope.data.resizes is not None  # a resize's grant is preemption's
        return kind_of(envelope) in self._kinds

    def handle(self, envelope: Envelope, now: datetime) -> Sequence[Outgoing]:
        return placement_fold(envelope, self.state, now=now)

    def end_batch(self, last: Envelope, now: datetime) -> Sequence[Outgoing]:
        return placement_end_batch(self.state, cause=last.id, now=now)


class Preemption(Consumer):
    name = "preemption"

    def __init__(self, settings: PreemptionSettings, queues: Queues) -> None:
        self.state = preemption_state(settings, queues)
        t = self.state.mirror.topics
        self._heartbeats = t.heartbeats
        self.topics = frozenset({t.inventory, t.health, t.operator, t.events, t.allocations, t.heartbeats})
        self._kinds = frozenset({*FOLDED_EVENTS, "job.pending", "job.checkpointed"})

    def selects(self, topic: str, envelope: Envelope) -> bool:
        if topic == self._heartbeats:
            return self.state.awaits_deadline()
        return kind_of(envelope) in self._kinds

    def handle(self, envelope: Envelope, now: datetime) -> Sequence[Outgoing]:
        return preemption_fold(envelope, self.state, now=now)

    def end_batch(self, last: Envelope, now: datetime) -> Sequence[Outgoing]:
        return preemption_end_batch(self.state, now=now)


class NodeHealth(Consumer):
    name = "node_health"

    def __init__(self, settings: NodeHealthSettings) -> None:
        self.state = node_health_state(settings, now=EPOCH)
        t = self.state.topics
        self.topics = frozenset({t.inventory, t.health, t.operator, t.allocations, t.heartbeats, t.events})
        self._kinds = frozenset(NODE_HEALTH_EVENTS)

    def selects(self, topic: str, envelope: Envelope) -> bool:
        return kind_of(envelope) in self._kinds

    def handle(self, envelope: Envelope, now: datetime) -> Sequence[Outgoing]:
        return node_health_decide(envelope, self.state, now=now)


# -- the simulated nodes --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """How the simulated nodes behave (fake-nodes' knobs, in virtual seconds)."""

    heartbeat_s: float = 2.0
    checkpoint_delay_s: float = 0.2
    default_duration_s: float | None = None
    """Run time of jobs without a duration hint; None: they run until released."""
    resume_from_checkpoint: bool = True
    """A job granted again after a checkpoint runs only what was left (fake-nodes rerun it whole)."""


@dataclass(slots=True)
class _Running:
    granted: AllocationGranted
    started: float
    timer: int | None = None


class SimNodes(Consumer):
    """The nodes' agents: what :class:`~services.agent.fake.FakeCluster` does, on the virtual clock."""

    name = "nodes"

    def __init__(self, sim: ServiceSimulation, nodes: Sequence[NodeRegistered], name: str) -> None:
        self.sim = sim
        self.options = sim.node_options
        self.cluster = name
        self.source = f"gangline/agent/{name}"
        self.nodes = {n.node: n for n in nodes}
        t = sim.topics
        self.topics = frozenset({t.events, t.allocations})
        self.silent: set[NodeId] = set()
        self.durations: dict[JobId, int | None] = {}
        self.limits: dict[JobId, int] = {}
        """Jobs with a ``time_limit_s``: each run is stopped there (checkpoint, then ``job.failed``)."""
        self.running: dict[AllocationId, _Running] = {}
        self.running_jobs: dict[JobId, int] = {}
        self.undated: dict[JobId, AllocationId] = {}
        self.saved_s: dict[JobId, float] = {}
        """Work each job saved at its checkpoints (virtual seconds of run time)."""
        self.lost_s: dict[AllocationId, float] = {}
        """Run time an allocation lost when it was released (what its checkpoint did not keep)."""
        self.checkpointed: dict[AllocationId, float] = {}
        self._kinds = frozenset(AGENT_EVENTS)
        self._tokens = itertools.count(1)

    def envelope(self, event: Event, event_id: str) -> Envelope:
        return make_envelope(event, event_id=event_id, source=self.source, time=self.sim.clock())

    def selects(self, topic: str, envelope: Envelope) -> bool:
        kind = kind_of(envelope)
        if kind == AllocationReleased.TYPE:
            return envelope.data.job_id in self.running_jobs  # type: ignore[attr-defined]
        return kind in self._kinds

    def handle(self, envelope: Envelope, now: datetime) -> Sequence[Outgoing]:
        data = envelope.data
        t = self.sim.topics
        if isinstance(data, JobAdmitted):
            self.durations[data.job_id] = data.spec.duration_hint_s
            if data.spec.time_limit_s is not None:
                self.limits[data.job_id] = data.spec.time_limit_s
            undated = self.undated.pop(data.job_id, None)
            if undated is not None:
                self._start_timer(undated)
        elif isinstance(data, AllocationGranted):
            if data.allocation_id in self.running or data.placements[0].node not in self.nodes:
                return []
            if any(p.node in self.silent for p in data.placements):
                return []  # a dead node starts nothing
            self.running[data.allocation_id] = _Running(data, self.sim.now)
            self.running_jobs[data.job_id] = self.running_jobs.get(data.job_id, 0) + 1
            started = JobStarted(job_id=data.job_id, allocation_id=data.allocation_id)
            if data.job_id in self.durations:
                self._start_timer(data.allocation_id)
            else:
                self.undated[data.job_id] = data.allocation_id
            return [(t.events, self.envelope(started, derived_id(envelope.id, "started")))]
        elif isinstance(data, AllocationReleased):
            gone = self._stop(data.allocation_id)
            if gone is not None:
                ran = self.sim.now - gone.started
                kept = self.checkpointed.pop(data.allocation_id, None)
                resumed = kept is not None and self.options.resume_from_checkpoint
                self.lost_s[data.allocation_id] = ran - (kept if resumed and kept is not None else 0.0)
            if self.undated.get(data.job_id) == data.allocation_id:
                del self.undated[data.job_id]
        elif isinstance(data, JobPreempting | JobResizing):
            holding = self.running.get(data.allocation_id)
            if holding is None or holding.granted.placements[0].node in self.silent:
                return []
            event_id = derived_id(envelope.id, "checkpointed")
            self.sim.after(self.options.checkpoint_delay_s, lambda: self._checkpoint(data, event_id))
        return []

    def _start_timer(self, allocation_id: AllocationId) -> None:
        running = self.running.get(allocation_id)
        if running is None or any(p.node in self.silent for p in running.granted.placements):
            return
        job_id = running.granted.job_id
        hint = self.durations.get(job_id)
        duration = float(hint) if hint is not None else self.options.default_duration_s
        limit = self.limits.get(job_id)
        left = max(1.0, duration - self.saved_s.get(job_id, 0.0)) if duration is not None else None
        if limit is not None and (left is None or limit < left):
            # The agent stops the run at its limit: checkpoint signal, acknowledgement, job.failed.
            token = running.timer = next(self._tokens)
            at = max(self.sim.now, running.started + limit + self.options.checkpoint_delay_s)
            self.sim.at(at, lambda: self._time_limit(allocation_id, token, limit), end=True)
            return
        if left is None:
            return  # runs until released
        token = running.timer = next(self._tokens)
        at = max(self.sim.now, running.started + left)
        self.sim.at(at, lambda: self._complete(allocation_id, token), end=True)

    def _stop(self, allocation_id: AllocationId) -> _Running | None:
        running = self.running.pop(allocation_id, None)
        if running is not None:
            job_id = running.granted.job_id
            left = self.running_jobs.pop(job_id, 1) - 1
            if left > 0:
                self.running_jobs[job_id] = left
        return running

    def _complete(self, allocation_id: AllocationId, token: int) -> None:
        running = self.running.get(allocation_id)
        if running is None or running.timer != token:
            return
        granted = running.granted
        if any(p.node in self.silent for p in granted.placements):
            return
        self._stop(allocation_id)
        held = self.sim.now - running.started
        done = JobCompleted(
            job_id=granted.job_id,
            allocation_id=allocation_id,
            gpu_seconds=Seconds(int(held * granted.whole_gpus)),
        )
        self.durations.pop(granted.job_id, None)  # a completed job is never granted again
        self.sim.publish(
            self.name, [(self.sim.topics.events, self.envelope(done, derived_id(allocation_id, "completed")))]
        )

    def _time_limit(self, allocation_id: AllocationId, token: int, limit: int) -> None:
        running = self.running.get(allocation_id)
        if running is None or running.timer != token:
            return
        granted = running.granted
        if any(p.node in self.silent for p in granted.placements):
            return
        self._stop(allocation_id)
        held = self.sim.now - running.started
        node = granted.placements[0].node
        ack, failed = time_limit_reached(granted, allocation_id, node, limit, held)
        self.durations.pop(granted.job_id, None)
        self.limits.pop(granted.job_id, None)
        events = self.sim.topics.events
        self.sim.publish(
            self.name,
            [
                (events, self.envelope(ack, derived_id(allocation_id, "time-limit", "checkpointed"))),
                (events, self.envelope(failed, derived_id(allocation_id, "time-limit", "failed"))),
            ],
        )

    def _checkpoint(self, asked: JobPreempting | JobResizing, event_id: str) -> None:
        holding = self.running.get(asked.allocation_id)
        if holding is None:
            return
        node = holding.granted.placements[0].node
        if node in self.silent:
            return
        ran = self.sim.now - holding.started
        self.checkpointed[asked.allocation_id] = ran
        if self.options.resume_from_checkpoint:
            self.saved_s[asked.job_id] = self.saved_s.get(asked.job_id, 0.0) + ran
        ack = JobCheckpointed(
            job_id=asked.job_id,
            allocation_id=asked.allocation_id,
            node=node,
            checkpoint=f"ckpt://{asked.job_id}/{asked.allocation_id}",
        )
        self.sim.publish(self.name, [(self.sim.topics.events, self.envelope(ack, event_id))])

    def fail(self, node: NodeId, xid: int | None) -> None:
        """The node goes silent (after reporting its GPU 0 failed with ``xid``); its jobs stall."""
        self.silent.add(node)
        for running in self.running.values():
            if node in {p.node for p in running.granted.placements}:
                running.timer = None
        if xid is not None:
            gpu = self.nodes[node].gpus[0].id
            event = GpuHealthChanged(
                node=node,
                gpu=gpu,
                previous="healthy",
                state="failed",
                cause=HealthCause(kind="xid", message=f"XID {xid} on {gpu}", xid=xid),
            )
            seq = self.sim.tick_of(self.sim.now)
            envelope = self.envelope(event, derived_id(node, "xid", xid, seq))
            self.sim.publish(self.name, [(self.sim.topics.health, envelope)])

    def busy(self) -> dict[NodeId, set[str]]:
        out: dict[NodeId, set[str]] = {}
        for running in self.running.values():
            for p in running.granted.placements:
                out.setdefault(p.node, set()).update(p.gpus)
        return out

    def heartbeats(self, seq: int, at: datetime) -> list[tuple[str, Envelope]]:
        busy = self.busy()
        out = []
        for node_id, node in self.nodes.items():
            if node_id in self.silent:
                continue
            held = busy.get(node_id, set())
            beat = NodeHeartbeat(
                node=node_id,
                seq=seq,
                gpus=tuple(GpuStatus(id=g.id, healthy=True, busy=g.id in held) for g in node.gpus),
            )
            envelope = make_envelope(
                beat, event_id=derived_id(self.cluster, node_id, "hb", seq), source=self.source, time=at
            )
            out.append((self.sim.topics.heartbeats, envelope))
        return out


# -- the simulation ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    """The services' settings the simulation runs them with (their defaults otherwise)."""

    profile_path: Path | None = None
    gated: bool = True
    max_jobs_per_cycle: int = 256
    fair_share_half_life_s: float = 3600.0
    silence_s: float = 10.0
    check_every_s: float = 0.5


Observer = Callable[[Transaction], None]
"""Told of every transaction once every consumer has handled it (its outputs are the next ones)."""


@dataclass
class ServiceSimulation:
    """The services and the nodes on one in-memory bus (see the module docstring). Deterministic."""

    nodes: Sequence[NodeRegistered]
    queues: Queues
    cluster_name: str = "cluster"
    options: ServiceOptions = field(default_factory=ServiceOptions)
    node_options: NodeOptions = field(default_factory=NodeOptions)
    heartbeats: HeartbeatMode = "when_needed"
    topics: TopicNames = field(default_factory=TopicNames)
    keep_log: bool = True
    """Keep every transaction in ``log`` (tests); a long trace keeps none and reports to observers."""

    def __post_init__(self) -> None:
        prefix = self.topics.prefix
        o = self.options
        profile = str(o.profile_path) if o.profile_path is not None else None
        self.admission = Admission(AdmissionSettings(topic_prefix=prefix), self.queues)
        self.quota = Quota(
            QuotaSettings(
                topic_prefix=prefix, fair_share_half_life_s=o.fair_share_half_life_s, profile_path=profile
            ),
            self.queues,
        )
        self.placement = Placement(
            PlacementSettings(
                topic_prefix=prefix,
                profile_path=profile,
                gated=o.gated,
                max_jobs_per_cycle=o.max_jobs_per_cycle,
            ),
            self.queues,
        )
        self.preemption = Preemption(
            PreemptionSettings(topic_prefix=prefix, profile_path=profile, gated=o.gated), self.queues
        )
        self.node_health = NodeHealth(
            NodeHealthSettings(topic_prefix=prefix, silence_s=o.silence_s, check_every_s=o.check_every_s)
        )
        self.sim_nodes = SimNodes(self, self.nodes, self.cluster_name)
        self.consumers: tuple[Consumer, ...] = (
            self.admission,
            self.quota,
            self.placement,
            self.preemption,
            self.node_health,
            self.sim_nodes,
        )
        self.now = 0.0
        self.log: list[Transaction] = []
        self.observers: list[Observer] = []
        self.steps: list[Callable[[], None]] = []
        """Called after each scheduled input and everything it caused (a measuring hook)."""
        self._heap: list[tuple[float, int, int, bool, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._actions = 0
        """Scheduled items other than heartbeat ticks: the run ends when none is left (and no tick is due)."""
        self._tick_armed = False
        self._last_tick = 0
        self._registered = False

    # -- the clock -------------------------------------------------------------------------------

    def clock(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)

    def tick_of(self, t: float) -> int:
        """The heartbeat tick at or before ``t`` (tick k is at k x heartbeat_s; a node's k-th beat)."""
        return math.floor(t / self.node_options.heartbeat_s + 1e-9)

    def at(self, t: float, action: Callable[[], None], *, tick: bool = False, end: bool = False) -> None:
        """Run ``action`` at virtual time ``t`` (never before now); same-time actions in scheduling order,
        except that a run's end (``end``: a completion, a time limit) goes before the rest, as in the
        core's simulator: what ends at an instant has freed its GPUs for what arrives then."""
        if not tick:
            self._actions += 1
        heapq.heappush(self._heap, (max(t, self.now), 0 if end else 1, next(self._seq), tick, action))

    def after(self, delay_s: float, action: Callable[[], None]) -> None:
        self.at(self.now + delay_s, action)

    # -- inputs --------------------------------------------------------------------------------------

    def register_nodes(self, at: float = 0.0) -> None:
        """Every node's ``node.registered``, in one transaction (as fake-nodes send them at start)."""

        def register() -> None:
            now = self.clock()
            outputs = [
                (
                    self.topics.inventory,
                    make_envelope(
                        n,
                        event_id=derived_id(self.cluster_name, n.node, "registered"),
                        source=self.sim_nodes.source,
                        time=now,
                    ),
                )
                for n in self.nodes
            ]
            self._registered = True
            self.publish(self.sim_nodes.name, outputs)

        self.at(at, register)

    def request(self, at: float, request: JobRequested, *, event_id: str | None = None) -> None:
        """A producer's ``job.requested`` on jobs.requests at ``at``."""
        eid = event_id or derived_id(PRODUCER_SOURCE, request.job_id, "requested")
        self._produce(at, self.topics.requests, request, eid)

    def cancel(self, at: float, job_id: str, *, reason: str | None = None) -> None:
        event = JobCancelRequested(job_id=JobId(job_id), reason=reason)
        self._produce(at, self.topics.requests, event, derived_id(PRODUCER_SOURCE, job_id, "cancel"))

    def operate(self, at: float, event: NodeCordoned | NodeUncordoned) -> None:
        """An operator's cordon, drain or uncordon of a node on nodes.operator at ``at``, as the API
        writes it (placement, preemption and node_health honour it as live)."""
        eid = derived_id(PRODUCER_SOURCE, event.node, event.TYPE, at)
        self._produce(at, self.topics.operator, event, eid)

    def fail_node(self, at: float, node: str, *, xid: int | None = None) -> None:
        """At ``at`` the node goes silent (optionally reporting an XID first), as fake-nodes' fail_node."""

        def fail() -> None:
            self._fold_skipped_beats(self.tick_of(self.now))
            self.sim_nodes.fail(NodeId(node), xid)

        self.at(at, fail)

    def _produce(self, at: float, topic: str, event: Event, event_id: str) -> None:
        def send() -> None:
            envelope = make_envelope(event, event_id=event_id, source=PRODUCER_SOURCE, time=self.clock())
            self.publish("producer", [(topic, envelope)])

        self.at(at, send)

    # -- the bus -------------------------------------------------------------------------------------

    def publish(self, source: str, outputs: Iterable[tuple[str, Envelope]]) -> None:
        """One transaction now, and everything it causes, delivered in causal order (module docstring)."""
        first = Transaction(source, self.now, tuple(outputs))
        if not first.outputs:
            return
        now = self.clock()
        pending = deque([first])
        while pending:
            tx = pending.popleft()
            if self.keep_log:
                self.log.append(tx)
            for consumer in self.consumers:
                topics = consumer.topics
                outs: list[tuple[str, Envelope]] = []
                last: Envelope | None = None
                for topic, envelope in tx.outputs:
                    if topic not in topics or not consumer.selects(topic, envelope):
                        continue
                    last = envelope
                    outs += caused(consumer.handle(envelope, now), envelope.id)
                if last is not None:
                    outs += caused(consumer.end_batch(last, now), last.id)
                if outs:
                    pending.append(Transaction(consumer.name, self.now, tuple(outs)))
            for observe in self.observers:  # after the nodes handled it: what a release lost is known
                observe(tx)

    # -- heartbeats --------------------------------------------------------------------------------

    def heartbeats_needed(self) -> bool:
        """Whether a heartbeat can decide something now (see the module docstring)."""
        if not self._registered:
            return False
        if self.heartbeats == "always":
            return True
        failed = self.node_health.state.failed
        if any(n not in failed for n in self.sim_nodes.silent):
            return True
        if self.preemption.state.awaits_deadline():
            return True
        health = self.node_health.state
        if any(set(health.live_on(n)) - health.asked_to_leave for n in health.cordons.evicts_at):
            return True  # a drain will send work away when its grace has passed: ticks are its clock
        placement = self.placement.state
        return placement.needs_cycle and bool(placement.waiting)

    def _arm(self) -> None:
        if self._tick_armed or not self.heartbeats_needed():
            return
        self._tick_armed = True
        k = self.tick_of(self.now) + 1
        self.at(k * self.node_options.heartbeat_s, self._tick, tick=True)

    def _tick(self) -> None:
        self._tick_armed = False
        if not self.heartbeats_needed():
            return
        k = self.tick_of(self.now)
        self._fold_skipped_beats(k - 1)
        self._last_tick = k
        self.publish(self.sim_nodes.name, self.sim_nodes.heartbeats(k, self.clock()))

    def _fold_skipped_beats(self, k: int) -> None:
        """node_health hears round ``k`` of the ticks skipped since the last one delivered (a pause)."""
        if k <= self._last_tick or not self._registered:
            return
        self._last_tick = k
        at = EPOCH + timedelta(seconds=k * self.node_options.heartbeat_s)
        for _, envelope in self.sim_nodes.heartbeats(k, at):
            self.node_health.state.fold(envelope)

    # -- running ------------------------------------------------------------------------------------

    def run(self, until: float | None = None) -> None:
        """Handle everything scheduled, in time order, until nothing is left to do (or ``until``)."""
        self._arm()
        while self._heap:
            t, _, _, tick, action = self._heap[0]
            if until is not None and t > until:
                break
            if self._actions == 0 and not self.heartbeats_needed():
                break
            heapq.heappop(self._heap)
            if not tick:
                self._actions -= 1
            self.now = t
            action()
            for step in self.steps:
                step()
            self._arm()
        if until is not None:
            self.now = max(self.now, until)

    # -- what it decided -------------------------------------------------------------------------------

    def envelopes(self, topic: str | None = None) -> list[Envelope]:
        """Every envelope of the log (on ``topic``), in delivery order."""
        return [e for tx in self.log for tp, e in tx.outputs if topic is None or tp == topic]


def caused(outputs: Iterable[Outgoing], cause: str) -> list[tuple[str, Envelope]]:
    """The outputs as the processor sends them: each names the consumed event as its cause."""
    return [(topic, envelope.model_copy(update={"causationid": cause})) for topic, envelope in outputs]
