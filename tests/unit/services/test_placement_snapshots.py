"""A placement state loaded from a snapshot and read on to the end of the log is the state a restore
from the whole log builds, and decides exactly as it does (services.common.snapshots).

The live service is driven as it runs (each batch folded, then its cycle; the agents end some running
jobs, a GPU fails, a job is cancelled), writing its inputs and outputs to one log. At a batch chosen by
hypothesis the live state is snapshotted (encoded, decoded into a fresh state, as a restart loads it),
covering that batch's inputs: its outputs, and everything after, are the tail. Both restarts read the
log topic by topic, as the shell's restore does, and then get the same next events.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from svc_helpers import T0, admitted, cluster, env
from test_placement import TOPICS

from gangline.bus.snapshots import SnapshotUnreadable
from gangline.core.defaults import default_profile
from gangline.events.allocations import AllocationGranted
from gangline.events.base import Envelope
from gangline.events.jobs import JobAdmitted, JobCancelRequested, JobCompleted, JobFailed, JobPending, JobSpec
from gangline.events.nodes import GpuHealthChanged, NodeHeartbeat
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.snapshots import FrozenParts, StateSnapshots, decode_state, encode_state
from services.placement.handlers import PlacementState, end_batch, fold_event

RESTORE_ORDER = (TOPICS.inventory, TOPICS.health, TOPICS.operator, TOPICS.events, TOPICS.allocations)

Log = list[tuple[str, Envelope]]


def fresh() -> PlacementState:
    return PlacementState(topics=TOPICS, profile=default_profile(), gated=False)


def restore(state: PlacementState, log: Log) -> PlacementState:
    """Fold ``log`` topic by topic (each in its order), as the shell's restore reads the topics."""
    for topic in RESTORE_ORDER:
        for where, envelope in log:
            if where == topic:
                state.restore(envelope)
    return state


def loaded(payload: bytes) -> PlacementState:
    state = fresh()
    for name, value in decode_state(payload, PlacementState.SNAPSHOT_FIELDS).items():
        setattr(state, name, value)
    return state


def saved(state: PlacementState) -> object:
    """What a snapshot of ``state`` holds, comparable (caches dropped)."""
    return decode_state(encode_state(state), PlacementState.SNAPSHOT_FIELDS)


class Cluster:
    """The live placement service on a log, with agents that end jobs when told."""

    def __init__(self) -> None:
        self.state = fresh()
        self.log: Log = []
        self.at = 0.0
        self.jobs = 0

    def event(self, envelope: Envelope, topic: str) -> tuple[str, Envelope]:
        return (topic, envelope)

    def batch(self, inputs: list[tuple[str, Envelope]]) -> int:
        """Fold ``inputs`` then run the cycle; the log position after the inputs (before the outputs)."""
        self.at += 1
        now = T0 + timedelta(seconds=self.at)
        self.log += inputs
        covered = len(self.log)
        outputs = []
        for _, envelope in inputs:
            outputs += fold_event(envelope, self.state, now=now)
        outputs += end_batch(self.state, cause=inputs[-1][1].id, now=now)
        self.log += outputs
        return covered

    def live(self) -> list[tuple[JobId, AllocationId]]:
        return sorted(
            (record.job_id, granted.allocation_id)
            for record in self.state.jobs.values()
            if (granted := record.live()) is not None
        )

    def step(self, kind: int, size: int) -> list[tuple[str, Envelope]]:
        """One input event, of a kind drawn by the test."""
        running = self.live()
        if kind == 0 or not running:
            self.jobs += 1
            return [(TOPICS.events, admitted(f"j{self.jobs}", workers=1 + size % 2, gpus_per_worker=2**size))]
        job, allocation = running[size % len(running)]
        if kind == 1:
            return [(TOPICS.events, env(JobCompleted(job_id=job, allocation_id=allocation), at=self.at))]
        if kind == 2:
            return [
                (
                    TOPICS.events,
                    env(
                        JobFailed(job_id=job, allocation_id=allocation, code="crash", reason="x"), at=self.at
                    ),
                )
            ]
        if kind == 3:
            return [(TOPICS.requests, env(JobCancelRequested(job_id=job), at=self.at))]
        node = f"a-{size % 2}"
        failed = GpuHealthChanged.model_validate(
            {
                "node": node,
                "gpu": f"gpu{size}",
                "previous": "healthy",
                "state": "failed",
                "cause": {"kind": "xid", "message": "XID 79", "xid": 79},
            }
        )
        return [(TOPICS.health, env(failed, at=self.at))]


Steps = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3)), min_size=2, max_size=40)


def run(steps: list[tuple[int, int]], snapshot_at: int) -> tuple[Cluster, bytes, int]:
    live = Cluster()
    for node in cluster(("a", 2, 8)).registrations():
        live.log.append((TOPICS.inventory, env(node)))
        live.state.restore(live.log[-1][1])
    payload, covered = b"", 0
    # A snapshot after every batch, as a busy service takes them: each copies the frozen models the last
    # one pickled (FrozenParts), and the one the restart loads is drawn.
    parts = FrozenParts()
    for k, (kind, size) in enumerate(steps):
        position = live.batch(live.step(kind, size))
        encoded = encode_state(live.state, parts)
        if k == snapshot_at % len(steps):
            payload, covered = encoded, position
    return live, payload, covered


def next_decisions(state: PlacementState, live: Cluster) -> list[Envelope]:
    """What the restarted service decides on its first batches: new jobs, then the end of a running one."""
    now = T0 + timedelta(seconds=live.at + 10)
    out = []
    for k in range(3):
        job = JobAdmitted(
            job_id=JobId(f"next{k}"), spec=JobSpec(queue="default", workers=1, gpus_per_worker=2)
        )
        out += [e for _, e in fold_event(env(job, at=live.at + 10, event_id=f"next{k}"), state, now=now)]
    out += [e for _, e in end_batch(state, cause="next-cycle", now=now)]
    running = sorted(
        (granted.allocation_id, record.job_id)
        for record in state.jobs.values()
        if (granted := record.live()) is not None
    )
    if running:
        allocation, job = running[0]
        done = JobCompleted(job_id=job, allocation_id=allocation)
        out += [e for _, e in fold_event(env(done, at=live.at + 11, event_id="done"), state, now=now)]
        out += [e for _, e in end_batch(state, cause="done", now=now)]
    return out


@settings(max_examples=30, deadline=None)
@given(steps=Steps, snapshot_at=st.integers(0, 39))
def test_a_state_loaded_from_a_snapshot_and_the_tail_is_the_state_rebuilt_from_the_whole_log(
    steps: list[tuple[int, int]], snapshot_at: int
) -> None:
    live, payload, covered = run(steps, snapshot_at)
    from_snapshot = restore(loaded(payload), live.log[covered:])
    from_log = restore(fresh(), live.log)
    assert saved(from_snapshot) == saved(from_log)
    assert next_decisions(from_snapshot, live) == next_decisions(from_log, live)
    assert saved(from_snapshot) == saved(from_log)


def test_the_next_decisions_compared_are_real_decisions() -> None:
    # The property above compares grants, not two empty lists.
    live, payload, covered = run([(0, 1), (0, 2), (1, 0), (0, 3)], 1)
    decided = next_decisions(restore(loaded(payload), live.log[covered:]), live)
    assert any(isinstance(e.data, AllocationGranted) for e in decided)
    assert covered < len(live.log)


def test_a_snapshot_saves_the_fold_not_the_settings_nor_what_only_the_running_service_keeps() -> None:
    live, payload, _ = run([(0, 1), (0, 1), (0, 3)], 2)
    assert live.state.cycle > 0 and live.state.last_pending
    state = loaded(payload)
    assert state.cycle == 0 and state.needs_cycle and not state.last_pending
    assert state.profile is not live.state.profile
    assert set(state.jobs) == set(live.state.jobs)
    # One job record in two tables stays one record.
    assert all(state.waiting[job] is state.jobs[job] for job in state.waiting)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("ran code from a snapshot",))


def test_a_snapshot_builds_only_the_projects_classes() -> None:
    payload = pickle.dumps({name: _Evil() for name in PlacementState.SNAPSHOT_FIELDS})
    with pytest.raises(SnapshotUnreadable, match=r"may not build builtins\.print"):
        decode_state(payload, PlacementState.SNAPSHOT_FIELDS)


def test_a_snapshot_of_other_fields_or_garbage_is_unreadable() -> None:
    with pytest.raises(SnapshotUnreadable, match="not the fields"):
        decode_state(pickle.dumps({"nodes": {}}), PlacementState.SNAPSHOT_FIELDS)
    with pytest.raises(SnapshotUnreadable, match="does not unpickle"):
        decode_state(b"\x80\x05garbage", PlacementState.SNAPSHOT_FIELDS)


def test_a_snapshot_is_due_every_n_events_or_t_seconds_when_events_came() -> None:
    clock = [0.0]
    state = fresh()
    snapshots = StateSnapshots(
        state,
        topic="placement.snapshots",
        service="placement",
        restore_topics=RESTORE_ORDER,
        every_events=100,
        every_s=30.0,
        clock=lambda: clock[0],
    )
    positions = {(TOPICS.events, 0): 7, (TOPICS.heartbeats, 0): 3}
    assert snapshots.records(positions, 60, {}) == []
    snapshots.committed(False, 60)
    records = snapshots.records(positions, 40, {})
    assert records and records[-1].key == b"manifest"
    assert b"nodes.heartbeats" not in records[-1].value  # only what the state is a fold of
    snapshots.committed(True, 40)
    assert snapshots.records(positions, 99, {}) == []
    snapshots.committed(False, 0)
    clock[0] = 31.0
    assert snapshots.records(positions, 0, {}) == []  # quiet: nothing new to save
    assert snapshots.records(positions, 1, {}) != []


def test_a_state_slow_to_save_is_saved_less_often() -> None:
    clock = [0.0]
    snapshots = StateSnapshots(
        fresh(),
        topic="placement.snapshots",
        service="placement",
        restore_topics=RESTORE_ORDER,
        every_events=10,
        every_s=30.0,
        max_share=0.5,
        clock=lambda: clock[0],
    )
    positions = {(TOPICS.events, 0): 7}
    clock[0] = 1.0
    assert snapshots.records(positions, 10, {}) != []
    snapshots.committed(True, 10)
    snapshots._cost = 4.0  # as if that one took 4 s: the next waits at least 8 s, whatever came
    clock[0] = 5.0
    assert snapshots.records(positions, 100, {}) == []
    clock[0] = 9.5
    assert snapshots.records(positions, 100, {}) != []


def test_a_snapshot_that_aborts_its_transaction_never_holds_the_outputs_back() -> None:
    clock = [0.0]
    snapshots = StateSnapshots(
        fresh(),
        topic="placement.snapshots",
        service="placement",
        restore_topics=RESTORE_ORDER,
        every_events=1,
        clock=lambda: clock[0],
    )
    positions = {(TOPICS.events, 0): 7}
    for _ in range(3):
        clock[0] += 100.0
        assert snapshots.records(positions, 5, {}) != []
        snapshots.aborted(RuntimeError("refused"))
        assert snapshots.records(positions, 5, {}) == []  # the retry goes without
        snapshots.committed(False, 5)
    assert snapshots.off and snapshots.records(positions, 5, {}) == []


def pending_told(outputs: list[tuple[str, Envelope]]) -> dict[JobId, tuple[str, ...]]:
    """Per job, the reasons a batch's ``job.pending`` told it, as placement remembers them."""
    return {
        e.data.job_id: tuple(f"{r.code}:{r.message}" for r in e.data.reasons)
        for _, e in outputs
        if isinstance(e.data, JobPending)
    }


@settings(max_examples=30, deadline=None)
@given(steps=Steps)
def test_a_restore_in_topic_or_arrival_order_tells_each_waiting_job_its_reasons_once_the_same(
    steps: list[tuple[int, int]],
) -> None:
    # What placement last told a job (last_pending) is no fact of the log: a restore in any order keeps
    # none (nor does a snapshot), and its first cycle tells every waiting job its reasons again, those the
    # live service finds in the same world (what it last told may be a cycle older: a grant made after).
    live, _, _ = run(steps, 0)
    by_topic = restore(fresh(), live.log)
    in_arrival = fresh()
    for _, envelope in live.log:
        in_arrival.restore(envelope)
    assert not by_topic.last_pending and not in_arrival.last_pending
    at = live.at + 1
    now = T0 + timedelta(seconds=at)
    beat = env(NodeHeartbeat(node=NodeId("a-0"), seq=1), at=at, event_id="beat")

    def first_batch(state: PlacementState) -> list[tuple[str, Envelope]]:
        """The first batch after the restart: a heartbeat, which starts the cycle owed to waiting jobs."""
        return fold_event(beat, state, now=now) + end_batch(state, cause=beat.id, now=now)

    told = first_batch(by_topic)
    assert told == first_batch(in_arrival)
    assert set(pending_told(told)) == set(by_topic.waiting) == set(live.state.waiting)
    assert pending_told(told) == by_topic.last_pending
    # The live service, made to forget what it told and to cycle, tells the same.
    forgetful = pickle.loads(pickle.dumps(live.state))
    forgetful.last_pending.clear()
    forgetful.cycle_due = True
    assert pending_told(first_batch(forgetful)) == pending_told(told)


def test_a_snapshot_copies_the_frozen_models_the_last_one_pickled_and_pickles_only_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live, _, _ = run([(0, 1), (0, 2), (0, 3)], 0)
    parts = FrozenParts()
    first = encode_state(live.state, parts)
    pickled: list[type] = []
    getstate = BaseModel.__getstate__

    def counted(model: BaseModel) -> dict[Any, Any]:
        pickled.append(type(model))
        return getstate(model)

    monkeypatch.setattr(BaseModel, "__getstate__", counted)
    assert encode_state(live.state, parts) == first
    assert pickled == []  # nothing changed: every model's bytes copied
    # A node registered again (a new object, other GPUs) is pickled anew, the others are copied.
    node = next(iter(live.state.nodes))
    again = live.state.nodes[node].model_copy(update={"gpus": live.state.nodes[node].gpus[:4]})
    live.state.nodes[node] = again
    payload = encode_state(live.state, parts)
    assert pickled and set(pickled) <= {type(again), type(again.gpus[0])}
    assert decode_state(payload, PlacementState.SNAPSHOT_FIELDS)["nodes"][node] == again
    assert decode_state(payload, PlacementState.SNAPSHOT_FIELDS) == decode_state(
        encode_state(live.state), PlacementState.SNAPSHOT_FIELDS
    )
