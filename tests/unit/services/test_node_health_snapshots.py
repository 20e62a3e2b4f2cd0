"""A node_health state loaded from a snapshot and read on to the end of the log is the state a restore
from the whole log builds, and decides exactly as it does (services.common.snapshots).

node_health runs over a random history: nodes heartbeat, agents report correctable ECC errors and
job-fault XIDs (the error windows drain a GPU at their limit), gangs are granted and released, nodes fail
and register again, operators drain nodes (their jobs are asked to leave), jobs checkpoint. What it
decides is appended to the log. At an event chosen by hypothesis its state is snapshotted, covering the
log up to that event; a later run (its own start) then restores from the snapshot and the tail of each
restore topic, or from the whole log (neither reads heartbeats), and both get the same state and the
same next decisions: which silent nodes fail, which GPUs drain.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from svc_helpers import T0, admitted, cluster, env

from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope, Event
from gangline.events.jobs import JobCheckpointed
from gangline.events.nodes import (
    GpuErrorReported,
    GpuHealthChanged,
    HealthCause,
    NodeCordoned,
    NodeFailed,
    NodeHeartbeat,
    NodeRegistered,
    NodeUncordoned,
)
from gangline.events.types import AllocationId, GpuId, JobId, QueueName
from services.common.snapshots import decode_state, encode_state, load_state
from services.common.topics import TopicNames
from services.node_health.handlers import NodeHealthState, decide
from services.node_health.rates import GpuErrorRates
from services.node_health.wiring import NODE_HEALTH_EVENTS, restore_topics

TOPICS = TopicNames()
RESTORE_ORDER = tuple(restore_topics(TOPICS))
NODES: list[NodeRegistered] = list(cluster(("a", 3, 8)).registrations())
Log = list[tuple[str, Envelope]]
ECC = HealthCause(kind="ecc", message="ecc.sbe: correctable (single-bit) ECC error")
XID = HealthCause(kind="xid", message="xid.13: graphics engine exception", xid=13)


def fresh(started: datetime) -> NodeHealthState:
    return NodeHealthState(
        topics=TOPICS,
        silence=timedelta(seconds=10),
        check_every=timedelta(seconds=1),
        started=started,
        rates=GpuErrorRates(),
    )


def restore(state: NodeHealthState, log: Log) -> NodeHealthState:
    """Read ``log`` topic by topic into ``state``, what the service's select decodes only."""
    for topic in RESTORE_ORDER:
        for where, envelope in log:
            if where == topic and envelope.data.TYPE in NODE_HEALTH_EVENTS:
                state.restore(envelope)
    return state


def loaded(payload: bytes, started: datetime) -> NodeHealthState:
    state = fresh(started)
    load_state(state, decode_state(payload, NodeHealthState.SNAPSHOT_FIELDS))
    return state


def comparable(state: NodeHealthState, at: datetime) -> object:
    """The saved fields, the error windows judged at ``at`` (a query drops what left the window: the
    running service's windows were queried, a restored state's not yet), and what is set besides."""
    windows = state.rates._windows
    for counter in windows._counters.values():
        for key in list(counter._times):
            counter.count(key, at)
    for key in list(windows._xid_times):
        windows.verdict(key, at)
    fields = decode_state(encode_state(state), NodeHealthState.SNAPSHOT_FIELDS)
    # The lifecycle fold, given a registration after a GPU's health change, keeps an empty set and that
    # change's time when it read the change first (the running service), neither when it read the
    # registration first (a restore reads nodes.inventory first): both say no GPU of the node failed or
    # degraded since it registered.
    registered = state.cluster.registered_at
    for name in ("cluster.failed_gpus", "cluster.degraded_gpus"):
        fields[name] = {n: gpus for n, gpus in fields[name].items() if gpus}
    fields["cluster.gpu_health_at"] = {
        k: t
        for k, t in fields["cluster.gpu_health_at"].items()
        if k[0] not in registered or t >= registered[k[0]]
    }
    fields["rates._windows"] = (
        windows.policy,
        {kind: (c._times, c._counts) for kind, c in windows._counters.items()},
        windows._xid_times,
        windows._xids,
    )
    return fields, state.last_seen, state.last_seq, state.hearing.latest, state.last_check


class World:
    def __init__(self) -> None:
        self.state = fresh(T0)
        self.log: Log = []
        self.clock = 0.0
        self.jobs = 0
        self.live: list[AllocationGranted] = []
        for node in NODES:
            self.send(TOPICS.inventory, node)

    def send(self, topic: str, event: Event | Envelope) -> None:
        self.clock += 1.0
        envelope = event if isinstance(event, Envelope) else env(event, at=self.clock)
        self.log.append((topic, envelope))
        for where, out in decide(envelope, self.state, now=T0 + timedelta(seconds=self.clock)):
            self.log.append((where, out))
            if isinstance(out.data, AllocationReleased):
                self.live = [g for g in self.live if g.allocation_id != out.data.allocation_id]

    def step(self, kind: str, k: int) -> None:
        node = NODES[k % len(NODES)].node
        gpu = GpuId(f"gpu{k % 2}")
        if kind == "beat":
            self.send(TOPICS.heartbeats, NodeHeartbeat(node=node, seq=int(self.clock)))
        elif kind == "ecc":
            self.send(
                TOPICS.health,
                GpuErrorReported(node=node, gpu=gpu, state="healthy", cause=ECC, count=1 + k % 3),
            )
        elif kind == "xid":
            self.send(TOPICS.health, GpuErrorReported(node=node, gpu=gpu, state="healthy", cause=XID))
        elif kind == "grant":
            self.jobs += 1
            job = JobId(f"j{self.jobs}")
            spec = {"queue": "default", "workers": 1, "gpus_per_worker": 1, "checkpoint_grace_s": k}
            self.send(TOPICS.events, admitted(job, **spec).model_copy(update={"time": self._now()}))
            granted = AllocationGranted(
                job_id=job,
                allocation_id=AllocationId(f"{job}.1"),
                queue=QueueName("default"),
                placements=(Placement(rank=0, node=node, gpus=(gpu,)),),
            )
            self.live.append(granted)
            self.send(TOPICS.allocations, granted)
        elif kind == "release" and self.live:
            granted = self.live.pop(k % len(self.live))
            done = AllocationReleased(
                job_id=granted.job_id, allocation_id=granted.allocation_id, reason="completed"
            )
            self.send(TOPICS.allocations, done)
        elif kind == "checkpoint" and self.live:
            granted = self.live[k % len(self.live)]
            ack = JobCheckpointed(
                job_id=granted.job_id,
                allocation_id=granted.allocation_id,
                node=granted.placements[0].node,
                checkpoint=f"ckpt://{granted.job_id}/{k}",
            )
            self.send(TOPICS.events, ack)
        elif kind == "fail":
            self.send(TOPICS.health, NodeFailed(node=node, code="agent_reported", reason="it died"))
        elif kind == "register":
            self.send(TOPICS.inventory, NODES[k % len(NODES)])
        elif kind == "drain":
            self.send(TOPICS.operator, NodeCordoned(node=node, mode="drain", drain_grace_s=0, reason="psu"))
        elif kind == "uncordon":
            self.send(TOPICS.operator, NodeUncordoned(node=node))

    def _now(self) -> datetime:
        return T0 + timedelta(seconds=self.clock + 1)


Ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "beat",
                "beat",
                "ecc",
                "xid",
                "grant",
                "grant",
                "release",
                "checkpoint",
                "fail",
                "register",
                "drain",
                "uncordon",
            ]
        ),
        st.integers(0, 30),
    ),
    min_size=1,
    max_size=40,
)


def run(ops: list[tuple[str, int]], snapshot_at: int) -> tuple[World, bytes, int]:
    world = World()
    payload, covered = encode_state(world.state), len(world.log)
    for k, (kind, n) in enumerate(ops):
        before = len(world.log)
        world.step(kind, n)
        if k == snapshot_at % len(ops) and len(world.log) > before:
            payload, covered = encode_state(world.state), before + 1
    return world, payload, covered


def next_decisions(state: NodeHealthState, world: World, started: datetime) -> list[Envelope]:
    """Errors reported on every GPU, one node heard from past the silence: what node_health writes."""
    out: list[Envelope] = []
    at = started + timedelta(seconds=1)
    events: list[Envelope] = []
    for n, node in enumerate(NODES):
        for g in range(2):
            report = GpuErrorReported(node=node.node, gpu=GpuId(f"gpu{g}"), state="healthy", cause=XID)
            events.append(env(report, at=world.clock + 2 + n, event_id=f"next-{n}-{g}"))
    # Beats closer than the outage gap (half the silence), so the bus counts as heard all along.
    for k in range(5):
        beat = NodeHeartbeat(node=NODES[0].node, seq=1000 + k)
        events.append(env(beat, at=(started - T0).total_seconds() + 4 * k, event_id=f"beat{k}"))
    for envelope in events:
        out += [e for _, e in decide(envelope, state, now=max(at, envelope.time))]
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=Ops, snapshot_at=st.integers(0, 39))
def test_a_node_health_state_loaded_from_a_snapshot_and_the_tail_is_the_state_rebuilt_from_the_log(
    ops: list[tuple[str, int]], snapshot_at: int
) -> None:
    world, payload, covered = run(ops, snapshot_at)
    started = T0 + timedelta(seconds=world.clock + 100)  # the restarted run's start
    from_snapshot = restore(loaded(payload, started), world.log[covered:])
    from_log = restore(fresh(started), world.log)
    assert comparable(from_snapshot, started) == comparable(from_log, started)
    assert next_decisions(from_snapshot, world, started) == next_decisions(from_log, world, started)


def test_the_next_decisions_compared_fail_silent_nodes_and_drain_gpus() -> None:
    ops = [("beat", 0), ("grant", 1), ("xid", 2), ("xid", 2), ("beat", 1), ("ecc", 2)]
    world, payload, covered = run(ops, 3)
    started = T0 + timedelta(seconds=world.clock + 100)
    decided = next_decisions(restore(loaded(payload, started), world.log[covered:]), world, started)
    assert any(isinstance(e.data, NodeFailed) for e in decided)
    assert any(e.data.TYPE == "gpu.health_changed" for e in decided)
    assert decided == next_decisions(restore(fresh(started), world.log), world, started)


def test_what_heartbeats_fill_is_not_in_a_snapshot() -> None:
    world, payload, _ = run([("beat", 0), ("beat", 1), ("beat", 0)], 2)
    assert world.state.last_seq and world.state.hearing.latest is not None
    started = T0 + timedelta(hours=1)
    state = loaded(payload, started)
    assert state.last_seq == {} and state.hearing.latest is None and state.last_check is None
    assert state.last_seen == dict.fromkeys((n.node for n in NODES), started)


def test_a_gpu_report_older_than_the_nodes_latest_registration_counts_in_neither_order() -> None:
    # Reported at 5, the node registered again at 6: that registration reset the GPU, whichever of the
    # two is read first (a restore reads nodes.inventory first, the running service reads them in time).
    node = NODES[0]
    report = env(GpuErrorReported(node=node.node, gpu=GpuId("gpu0"), state="healthy", cause=XID), at=5)
    again = env(node, at=6)
    states = []
    for order in ((report, again), (again, report)):
        state = fresh(T0)
        state.restore(env(node, at=0))
        for envelope in order:
            state.restore(envelope)
        states.append(comparable(state, T0 + timedelta(seconds=7)))
        assert state.rates.count("job_fault", node.node, GpuId("gpu0"), T0 + timedelta(seconds=7)) == 0
        assert state.gpu_state == {}
    assert states[0] == states[1]


def test_a_report_handled_again_counts_once() -> None:
    # A batch retried after an aborted transaction hands its records to the handler again.
    state = fresh(T0)
    state.restore(env(NODES[0], at=0))
    report = env(GpuErrorReported(node=NODES[0].node, gpu=GpuId("gpu0"), state="healthy", cause=XID), at=5)
    for _ in range(3):
        decide(report, state, now=T0 + timedelta(seconds=5))
    assert state.rates.count("job_fault", NODES[0].node, GpuId("gpu0"), T0 + timedelta(seconds=6)) == 1


def test_gpu_reports_newer_than_the_nodes_registration_count_in_either_order() -> None:
    # Registered at 0, three job-fault XIDs at 10-12: a restore reads nodes.inventory first; the running
    # service may read nodes.health first (a topic's partition leader elected later, a fetch of one topic
    # answered before another's). The registration resets what came before it, never what came after.
    node = NODES[0]
    gpu = GpuId("gpu0")
    reports = [
        env(GpuErrorReported(node=node.node, gpu=gpu, state="healthy", cause=XID), at=10 + k)
        for k in range(3)
    ]
    at = T0 + timedelta(seconds=20)
    states = []
    for order in ([env(node, at=0), *reports], [*reports, env(node, at=0)]):
        state = fresh(T0)
        decided = [e for envelope in order for _, e in decide(envelope, state, now=at)]
        assert [e.data.state for e in decided if isinstance(e.data, GpuHealthChanged)] == ["degraded"]
        assert state.rates.count("job_fault", node.node, gpu, at) == 3
        assert state.gpu_state == {(node.node, gpu): "healthy"} and set(state.degraded) == {(node.node, gpu)}
        states.append(comparable(state, at))
    assert states[0] == states[1]
