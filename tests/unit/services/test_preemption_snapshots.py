"""A preemption state loaded from a snapshot and read on to the end of the log is the state a restore
from the whole log builds, and decides exactly as it does (services.common.snapshots).

Placement and preemption run side by side on one log, as the live services do: each event of the log is
folded by both (placement decides per event, preemption folds it and plans at the batch's end), and what
they decide is appended to the log. Low-priority preemptible jobs fill the node, urgent jobs preempt
them, victims checkpoint or miss their deadline, jobs end. At an event chosen by hypothesis preemption's
state is snapshotted, covering the log up to that event; both restarts then read the log topic by topic
and get the same next events.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from svc_helpers import T0, admitted, cluster, env

from gangline.core.defaults import default_profile
from gangline.events.base import Envelope
from gangline.events.jobs import JobCheckpointed, JobCompleted, JobPreempting
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.snapshots import decode_state, encode_state, load_state
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState
from services.placement.handlers import decide as place
from services.preemption.handlers import Mirror, PreemptionState, end_batch, fold_event

TOPICS = TopicNames()
RESTORE_ORDER = (TOPICS.inventory, TOPICS.health, TOPICS.operator, TOPICS.events, TOPICS.allocations)
Log = list[tuple[str, Envelope]]


def fresh() -> PreemptionState:
    return PreemptionState(mirror=Mirror(topics=TOPICS, profile=default_profile(), gated=False))


def restore(state: PreemptionState, log: Log) -> PreemptionState:
    for topic in RESTORE_ORDER:
        for where, envelope in log:
            if where == topic:
                state.restore(envelope)
    return state


def loaded(payload: bytes) -> PreemptionState:
    state = fresh()
    load_state(state, decode_state(payload, PreemptionState.SNAPSHOT_FIELDS))
    return state


def saved(state: PreemptionState) -> object:
    return decode_state(encode_state(state), PreemptionState.SNAPSHOT_FIELDS)


class World:
    def __init__(self) -> None:
        self.placement = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
        self.preemption = fresh()
        self.log: Log = []
        self.at = 0.0
        self.jobs = 0
        for node in cluster(("a", 1, 8)).registrations():
            self.log.append((TOPICS.inventory, env(node)))
            self.placement.restore(self.log[-1][1])
            self.preemption.restore(self.log[-1][1])

    def now(self) -> object:
        return T0 + timedelta(seconds=self.at)

    def feed(self, inputs: Log, snapshot: bool) -> tuple[bytes, int] | None:
        """Append ``inputs`` and run both services over every new record (theirs too) until quiet; with
        ``snapshot``, preemption's state after the first record it handled, and the position it covers."""
        taken = None
        queue = list(inputs)
        while queue:
            self.at += 1
            now = T0 + timedelta(seconds=self.at)
            topic, envelope = queue.pop(0)
            self.log.append((topic, envelope))
            covered = len(self.log)
            out = list(place(envelope, self.placement, now=now)) if topic != TOPICS.requests else []
            out += fold_event(envelope, self.preemption, now=now) + end_batch(self.preemption, now=now)
            if snapshot and taken is None:
                taken = (encode_state(self.preemption), covered)
            queue += out
        return taken

    def step(self, kind: int, size: int) -> Log:
        running = sorted(
            (record.job_id, granted.allocation_id)
            for record in self.placement.jobs.values()
            if (granted := record.live()) is not None
        )
        asked = sorted(self.preemption.in_flight)
        if kind == 0 or (not running and kind != 1):
            self.jobs += 1
            spec = {
                "gpus_per_worker": 2 ** (1 + size % 3),
                "preemptible": True,
                "checkpoint_grace_s": 5 * size,
            }
            return [(TOPICS.events, admitted(f"low{self.jobs}", **spec))]
        if kind == 1:
            self.jobs += 1
            return [
                (
                    TOPICS.events,
                    admitted(f"urgent{self.jobs}", gpus_per_worker=4 + 4 * (size % 2), priority=5),
                )
            ]
        if kind == 2 and asked:
            flight = self.preemption.in_flight[asked[size % len(asked)]]
            ack = JobCheckpointed(
                job_id=flight.job_id,
                allocation_id=flight.allocation_id,
                node=NodeId("a-0"),
                checkpoint=f"ckpt://{flight.job_id}",
            )
            return [(TOPICS.events, env(ack, at=self.at))]
        job, allocation = running[size % len(running)]
        return [(TOPICS.events, env(JobCompleted(job_id=job, allocation_id=allocation), at=self.at))]


Steps = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=2, max_size=30)


def run(steps: list[tuple[int, int]], snapshot_at: int) -> tuple[World, bytes, int]:
    world = World()
    payload, covered = encode_state(world.preemption), len(world.log)
    for k, (kind, size) in enumerate(steps):
        taken = world.feed(world.step(kind, size), snapshot=k == snapshot_at % len(steps))
        if taken is not None:
            payload, covered = taken
    return world, payload, covered


def next_decisions(state: PreemptionState, world: World) -> list[Envelope]:
    """A new urgent job placement says is pending, then the deadlines of those asked pass."""
    out: list[Envelope] = []
    at = world.at + 100
    urgent = admitted("next-urgent", gpus_per_worker=8, priority=9)
    state.restore(urgent)
    pending = [e for _, e in place(urgent, _placement_like(world), now=T0 + timedelta(seconds=at))]
    for envelope in pending:
        out += [e for _, e in fold_event(envelope, state, now=T0 + timedelta(seconds=at))]
    out += [e for _, e in end_batch(state, now=T0 + timedelta(seconds=at))]
    late = T0 + timedelta(seconds=at + 1000)
    tick = env(JobCompleted(job_id=JobId("nobody"), allocation_id=AllocationId("nobody.1")), at=at + 1000)
    out += [e for _, e in fold_event(tick, state, now=late) + end_batch(state, now=late)]
    return out


def _placement_like(world: World) -> PlacementState:
    """Placement as it stands at the end of the log (the same for both restarts)."""
    placement = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    for topic in RESTORE_ORDER:
        for where, envelope in world.log:
            if where == topic:
                placement.restore(envelope)
    placement.needs_cycle = False
    return placement


@settings(max_examples=30, deadline=None)
@given(steps=Steps, snapshot_at=st.integers(0, 29))
def test_a_preemption_state_loaded_from_a_snapshot_and_the_tail_is_the_state_rebuilt_from_the_log(
    steps: list[tuple[int, int]], snapshot_at: int
) -> None:
    world, payload, covered = run(steps, snapshot_at)
    from_snapshot = restore(loaded(payload), world.log[covered:])
    from_log = restore(fresh(), world.log)
    assert saved(from_snapshot) == saved(from_log)
    assert from_snapshot.replan == from_log.replan or not from_log.held
    assert next_decisions(from_snapshot, world) == next_decisions(from_log, world)


def test_the_next_decisions_compared_preempt() -> None:
    # A running preemptible job, an urgent one placement leaves pending: the restarts ask the victim.
    world, payload, covered = run([(0, 2), (0, 2)], 1)
    assert any(isinstance(e.data, JobPreempting) for e in next_decisions(restore(fresh(), world.log), world))
    decided = next_decisions(restore(loaded(payload), world.log[covered:]), world)
    assert any(isinstance(e.data, JobPreempting) for e in decided)
