"""Node health's decisions (pure): silent nodes fail; failed nodes and GPUs give their gangs back.

Time comes from the caller (``now``): every heartbeat consumed is also a clock tick, and at most
every ``check_every_s`` the service looks for nodes silent longer than ``silence_s``. (While every
node is silent no tick arrives; that whole-cluster outage is left to operators.)

For a failed node (declared here, reported by an agent, or by an operator) or a failed GPU, every
live allocation that uses it is released (``node_failed``) and its job requeued as its next attempt
(the gang is whole again elsewhere; placement decides where). Ids derive from the node, its last
heartbeat sequence and the allocation, so a retried or repeated decision has the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gangline.bus import Outgoing
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import JobCheckpointed, JobRequeued
from gangline.events.nodes import GpuHealthChanged, NodeFailed, NodeHeartbeat, NodeRegistered
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.ids import derived_id
from services.common.topics import TopicNames

SOURCE = "gangline/node-health"


@dataclass
class NodeHealthState:
    topics: TopicNames
    silence: timedelta
    check_every: timedelta
    started: datetime
    last_seen: dict[NodeId, datetime] = field(default_factory=dict)
    last_seq: dict[NodeId, int] = field(default_factory=dict)
    failed: set[NodeId] = field(default_factory=set)
    live: dict[AllocationId, AllocationGranted] = field(default_factory=dict)
    released: set[AllocationId] = field(default_factory=set)
    grants_per_job: dict[JobId, set[AllocationId]] = field(default_factory=dict)
    checkpoints: dict[JobId, str] = field(default_factory=dict)
    last_check: datetime | None = None

    def restore(self, envelope: Envelope) -> None:
        self.fold(envelope)

    def fold(self, envelope: Envelope) -> None:
        data = envelope.data
        if isinstance(data, NodeRegistered):
            self.failed.discard(data.node)
            self.last_seen[data.node] = max(envelope.time, self.started)
        elif isinstance(data, NodeHeartbeat):
            if data.node not in self.failed:
                self.last_seen[data.node] = max(envelope.time, self.started)
                self.last_seq[data.node] = data.seq
        elif isinstance(data, NodeFailed):
            self.failed.add(data.node)
        elif isinstance(data, AllocationGranted):
            self.grants_per_job.setdefault(data.job_id, set()).add(data.allocation_id)
            if data.allocation_id not in self.released:
                self.live[data.allocation_id] = data
        elif isinstance(data, AllocationReleased):
            self.released.add(data.allocation_id)
            self.live.pop(data.allocation_id, None)
        elif isinstance(data, JobCheckpointed):
            self.checkpoints[data.job_id] = data.checkpoint


def decide(envelope: Envelope, state: NodeHealthState, *, now: datetime) -> list[Outgoing]:
    data = envelope.data
    if isinstance(data, NodeFailed):
        first = data.node not in state.failed
        state.fold(envelope)
        return release_on(state, data.node, None, now=now) if first else []
    if isinstance(data, GpuHealthChanged):
        state.fold(envelope)
        if data.state != "failed":
            return []
        return release_on(state, data.node, data.gpu, now=now)
    state.fold(envelope)
    if isinstance(data, NodeHeartbeat):
        return check_silence(state, now=now)
    return []


def check_silence(state: NodeHealthState, *, now: datetime) -> list[Outgoing]:
    """Declare failed every node silent for longer than ``silence`` (at most every ``check_every``)."""
    if state.last_check is not None and now - state.last_check < state.check_every:
        return []
    state.last_check = now
    out: list[Outgoing] = []
    for node, seen in sorted(state.last_seen.items()):
        if node in state.failed or now - max(seen, state.started) <= state.silence:
            continue
        seq = state.last_seq.get(node)
        silent_s = int((now - seen).total_seconds())
        failed = NodeFailed(
            node=node,
            code="heartbeat_timeout",
            reason=f"no heartbeat from {node} for {silent_s} s (limit {state.silence.total_seconds():g} s)",
            last_seq=seq,
        )
        cause = derived_id(node, "silent", seq if seq is not None else "never")
        envelope = _envelope(failed, cause, "failed", now)
        out.append((state.topics.health, envelope))
        state.fold(envelope)
        out += release_on(state, node, None, now=now)
    return out


def release_on(state: NodeHealthState, node: NodeId, gpu: str | None, *, now: datetime) -> list[Outgoing]:
    """Release every live allocation on ``node`` (or only those using ``gpu`` there) and requeue its job."""
    out: list[Outgoing] = []
    hit = [
        granted
        for granted in state.live.values()
        if any(p.node == node and (gpu is None or gpu in p.gpus) for p in granted.placements)
    ]
    for granted in sorted(hit, key=lambda g: g.allocation_id):
        released = AllocationReleased(
            job_id=granted.job_id, allocation_id=granted.allocation_id, reason="node_failed"
        )
        attempt = len(state.grants_per_job.get(granted.job_id, ())) + 1
        requeued = JobRequeued(
            job_id=granted.job_id,
            reason="node_failed" if gpu is None else "gpu_failed",
            attempt=max(2, attempt),
            resume_from=state.checkpoints.get(granted.job_id),
        )
        release_envelope = _envelope(released, granted.allocation_id, "released-node-failed", now)
        state.fold(release_envelope)
        out.append((state.topics.allocations, release_envelope))
        out.append(
            (state.topics.events, _envelope(requeued, granted.allocation_id, "requeued-node-failed", now))
        )
    return out


def _envelope(event: Event, cause: str, kind: str, now: datetime) -> Envelope:
    return make_envelope(event, event_id=derived_id(cause, kind, event.subject()), source=SOURCE, time=now)
