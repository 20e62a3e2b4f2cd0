"""A quota state loaded from a snapshot and read on to the end of the log is the state a restore from
the whole log builds, and decides exactly as it does (services.common.snapshots).

Quota runs over a random history, as the other services would answer it: jobs of limited and unlimited
queues are admitted, granted, released, preempted and requeued, fail; nodes are cordoned, drained,
uncordoned, fail and register again (so jobs queued on a model move, or are stranded). What quota
decides (its ``job.queued``, ``job.pending``, ``job.failed`` and ``queue.status``) is appended to the
log. At an event chosen by hypothesis its state is snapshotted, covering the log up to that event (its
outputs of that event come after, as in its transaction); both restarts then read the log topic by topic,
the snapshot's the tail of each input and queues.status whole (the status board is not in a snapshot),
and get the same state and the same next decisions.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from svc_helpers import T0, cluster, env

from gangline.core.queues import QueueName
from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope
from gangline.events.jobs import (
    JobAdmitted,
    JobCompleted,
    JobFailed,
    JobPending,
    JobQueued,
    JobRequeued,
    JobSpec,
)
from gangline.events.nodes import NodeCordoned, NodeFailed, NodeRegistered, NodeUncordoned
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.queues import QueuesFile, queues_of
from services.common.snapshots import decode_state, encode_state, load_state
from services.common.topics import TopicNames
from services.quota.handlers import QuotaState, decide
from services.quota.settings import QuotaSettings
from services.quota.status import StatusBoard
from services.quota.wiring import new_state, snapshot_config, state_snapshots

TOPICS = TopicNames()
RESTORE_ORDER = (
    TOPICS.events,
    TOPICS.allocations,
    TOPICS.inventory,
    TOPICS.health,
    TOPICS.operator,
    TOPICS.queue_status,
)
"""As services/quota/wiring.restore_topics."""
H100 = "H100-SXM5-80GB"
A100 = "A100-SXM4-80GB"
DOC: dict[str, Any] = {
    "cohorts": [{"name": "lab"}],
    "queues": [
        {
            "name": "team-a",
            "cohort": "lab",
            "weight": 2,
            "quotas": {H100: {"nominal": 8, "borrowing_limit": 4}, A100: {"nominal": 8}},
        },
        {"name": "team-b", "cohort": "lab", "quotas": {H100: {"nominal": 8, "lending_limit": 2}}},
        {"name": "team-c", "cohort": "lab", "quotas": {A100: {"nominal": 4}}},
        {"name": "default", "unlimited": True},
    ],
}
QUEUE_NAMES = ["team-a", "team-b", "team-c", "default"]
QUEUES = queues_of(QueuesFile.model_validate(DOC))
NODES: list[NodeRegistered] = [
    *cluster(("h", 2, 8)).registrations(),
    *cluster(("a", 1, 8, A100)).registrations(),
]
Log = list[tuple[str, Envelope]]


def fresh(half_life_s: float) -> QuotaState:
    return QuotaState(
        topics=TOPICS, queues=QUEUES, half_life_s=half_life_s, status=StatusBoard(interval_s=3.0)
    )


def restore(state: QuotaState, log: Log, *, whole: Log) -> QuotaState:
    """Read ``log`` topic by topic into ``state`` (queues.status from ``whole``: read whole at a start)."""
    for topic in RESTORE_ORDER:
        for where, envelope in whole if topic == TOPICS.queue_status else log:
            if where == topic:
                state.restore(envelope)
    return state


def loaded(payload: bytes, half_life_s: float) -> QuotaState:
    state = fresh(half_life_s)
    load_state(state, decode_state(payload, QuotaState.SNAPSHOT_FIELDS))
    return state


def saved(state: QuotaState) -> object:
    return decode_state(encode_state(state), QuotaState.SNAPSHOT_FIELDS)


def derived(state: QuotaState) -> object:
    """What a snapshot does not hold but the state works out or reads besides: it must agree too."""
    ledger = {q: state.ledger.usage_vector(q) for q in QUEUES.tree.queue_names()}
    hardware = {m: state.inventory.hardware.largest_node(m) for m in (H100, A100)}
    board = (state.status.published, state.status.published_at)
    return ledger, hardware, sorted(state.stranded), sorted(state.retired), board


class World:
    """Drives quota through a random history, as the other services would answer its decisions."""

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.state = fresh(half_life_s)
        self.log: Log = []
        self.jobs: list[JobId] = []
        self.queued: dict[JobId, int] = {}
        self.granted: dict[JobId, int] = {}
        self.failed: set[JobId] = set()
        self.clock = 0.0
        for node in NODES:
            self.send(TOPICS.inventory, node)

    def send(self, topic: str, event: Any, *, same_time: bool = False) -> None:
        if not same_time:
            self.clock += 1.0
        self.handle(topic, env(event, at=self.clock))

    def handle(self, topic: str, envelope: Envelope) -> None:
        self.log.append((topic, envelope))
        for where, out in decide(envelope, self.state, now=envelope.time):
            self.log.append((where, out))
            if isinstance(out.data, JobQueued) and out.data.replaces is None:
                self.queued[out.data.job_id] = self.queued.get(out.data.job_id, 0) + 1

    def step(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "admit":
            _, queue, gpus, gpu_type, priority = op
            job = JobId(f"j{len(self.jobs)}")
            self.jobs.append(job)
            spec = JobSpec(queue=queue, workers=1, gpus_per_worker=gpus, gpu_type=gpu_type, priority=priority)
            self.send(TOPICS.events, JobAdmitted(job_id=job, spec=spec))
            return
        if kind in ("cordon", "drain", "uncordon", "fail-node", "register"):
            node = NODES[op[1] % len(NODES)]
            if kind == "cordon":
                self.send(TOPICS.operator, NodeCordoned(node=node.node, reason="bios update"))
            elif kind == "drain":
                drain = NodeCordoned(node=node.node, mode="drain", drain_grace_s=0, reason="psu")
                self.send(TOPICS.operator, drain)
            elif kind == "uncordon":
                self.send(TOPICS.operator, NodeUncordoned(node=node.node))
            elif kind == "fail-node":
                self.send(TOPICS.health, NodeFailed(node=node.node, code="operator", reason="it died"))
            else:
                self.send(TOPICS.inventory, node)
            return
        if not self.jobs:
            return
        job = self.jobs[op[1] % len(self.jobs)]
        if job in self.failed:
            return  # a failed job runs no more (its GPUs were released with the failure)
        attempt = self.queued.get(job, 0)
        allocation = AllocationId(f"{job}.{attempt}")
        if kind == "grant" and attempt > self.granted.get(job, 0):
            self.granted[job] = attempt
            placement = Placement(rank=0, node=NodeId("h-0"), gpus=("g0",))
            granted = AllocationGranted(
                job_id=job, allocation_id=allocation, queue="team-a", placements=(placement,)
            )
            self.send(TOPICS.allocations, granted)
        elif kind in ("release", "preempt") and self.granted.get(job, 0) == attempt > 0:
            self.granted[job] = -attempt
            reason = "completed" if kind == "release" else "preempted"
            if kind == "release":  # the agent's report first: placement releases the GPUs once it reads it
                self.send(TOPICS.events, JobCompleted(job_id=job, allocation_id=allocation))
            self.send(
                TOPICS.allocations, AllocationReleased(job_id=job, allocation_id=allocation, reason=reason)
            )
            if kind == "preempt":  # written with the release, at its time (one transaction)
                requeued = JobRequeued(job_id=job, reason="preempted", attempt=attempt + 1)
                self.send(TOPICS.events, requeued, same_time=True)
        elif kind == "fail":
            # The agent names the allocation that failed when the job holds one (libs/gangline/agent).
            held = allocation if self.granted.get(job, 0) == attempt > 0 else None
            self.failed.add(job)
            failed = JobFailed(job_id=job, allocation_id=held, code="worker_exit", reason="it died")
            self.send(TOPICS.events, failed)
            if held is not None:  # placement takes its GPUs back
                self.granted[job] = -attempt
                released = AllocationReleased(job_id=job, allocation_id=allocation, reason="failed")
                self.send(TOPICS.allocations, released)


admit_op = st.tuples(
    st.just("admit"),
    st.sampled_from(QUEUE_NAMES),
    st.integers(1, 8),
    st.sampled_from([None, H100, A100]),
    st.integers(0, 3),
)
other_op = st.tuples(
    st.sampled_from(
        ["grant", "release", "preempt", "fail", "cordon", "drain", "uncordon", "fail-node", "register"]
    ),
    st.integers(0, 40),
)
Ops = st.lists(st.one_of(admit_op, admit_op, other_op), min_size=1, max_size=40)


def run(ops: list[tuple[Any, ...]], snapshot_at: int, half_life_s: float) -> tuple[World, bytes, int]:
    """The history, and quota's snapshot after the record ``snapshot_at`` of it with the log it covers."""
    world = World(half_life_s)
    payload, covered = encode_state(world.state), len(world.log)
    for k, op in enumerate(ops):
        before = len(world.log)
        world.step(op)
        if k == snapshot_at % len(ops) and len(world.log) > before:
            # The snapshot goes with the batch of the record's outputs; it covers the record read.
            payload, covered = encode_state(world.state), before + 1
    return world, payload, covered


def next_decisions(state: QuotaState, world: World) -> list[Envelope]:
    """More jobs, a node that comes back and one that goes, releases: what quota writes for them."""
    events: Log = []
    at = world.clock + 10
    for k, (queue, gpus, gpu_type) in enumerate(
        [("team-a", 8, None), ("team-b", 4, H100), ("team-c", 4, None)]
    ):
        spec = JobSpec(queue=queue, workers=1, gpus_per_worker=gpus, gpu_type=gpu_type)
        events.append(
            (
                TOPICS.events,
                env(JobAdmitted(job_id=JobId(f"next{k}"), spec=spec), at=at + k, event_id=f"n{k}"),
            )
        )
    events.append((TOPICS.operator, env(NodeUncordoned(node=NODES[0].node), at=at + 5, event_id="n-up")))
    events.append((TOPICS.inventory, env(NODES[1], at=at + 6, event_id="n-reg")))
    events.append(
        (TOPICS.operator, env(NodeCordoned(node=NODES[2].node, reason="x"), at=at + 7, event_id="n-down"))
    )
    for k, job in enumerate(sorted(state.jobs)[:3]):
        done = AllocationReleased(job_id=job, allocation_id=AllocationId(f"{job}.x"), reason="completed")
        events.append((TOPICS.allocations, env(done, at=at + 10 + k, event_id=f"n-rel{k}")))
        events.append(
            (
                TOPICS.events,
                env(
                    JobFailed(job_id=job, code="worker_exit", reason="x"),
                    at=at + 10 + k,
                    event_id=f"n-end{k}",
                ),
            )
        )
    out: list[Envelope] = []
    for _, envelope in events:
        out += [e for _, e in decide(envelope, state, now=envelope.time)]
    return out


def comparable(state: QuotaState) -> dict[str, object]:
    """The saved fields as quota reads them (the decayed usage's sums exactly: they depend only on when
    each charge began and ended, not on the order the restore read that in)."""
    fields = dict(saved(state))  # type: ignore[call-overload]
    # Quota skips every record of a retired job before the fold sees it: it reads whether a job is
    # retired, never the releases the fold kept of it, which depend on whether the job's end was read
    # before its grant (a restore reads jobs.events first) or after it (the running service).
    fields["cluster.retired"] = sorted(state.cluster.retired)
    return fields


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=Ops, snapshot_at=st.integers(0, 39), half_life_s=st.sampled_from([0.0, 30.0]))
def test_a_quota_state_loaded_from_a_snapshot_and_the_tail_is_the_state_rebuilt_from_the_log(
    ops: list[tuple[Any, ...]], snapshot_at: int, half_life_s: float
) -> None:
    world, payload, covered = run(ops, snapshot_at, half_life_s)
    from_snapshot = restore(loaded(payload, half_life_s), world.log[covered:], whole=world.log)
    from_log = restore(fresh(half_life_s), world.log, whole=world.log)
    assert comparable(from_snapshot) == comparable(from_log)
    assert derived(from_snapshot) == derived(from_log)
    assert next_decisions(from_snapshot, world) == next_decisions(from_log, world)


def test_under_a_half_life_a_restore_dates_a_requeued_jobs_gap_so_quota_takes_snapshots(
    tmp_path: Path,
) -> None:
    # Released, then requeued a second later: the running quota did not charge the job in between; a restore
    # reads the requeue and its job.queued (jobs.events) before the release (allocations.log), and
    # dates each charge by its own facts' times, so it does not charge that gap either.
    ops: list[tuple[Any, ...]] = [("admit", "team-a", 1, None, 0), ("grant", 0)]
    world, payload, covered = run(ops, 1, 30.0)
    job, allocation = world.jobs[0], AllocationId(f"{world.jobs[0]}.1")
    world.send(
        TOPICS.allocations, AllocationReleased(job_id=job, allocation_id=allocation, reason="preempted")
    )
    world.send(TOPICS.events, JobRequeued(job_id=job, reason="preempted", attempt=2))
    assert sum(isinstance(e.data, JobQueued) for _, e in world.log) == 2  # queued again, after the gap
    from_snapshot = restore(loaded(payload, 30.0), world.log[covered:], whole=world.log)
    from_log = restore(fresh(30.0), world.log, whole=world.log)
    assert from_snapshot.charges.usage == world.state.charges.usage == from_log.charges.usage
    later = T0 + timedelta(seconds=world.clock + 5)
    assert from_log.fair_share((True, "lab"), later).usage(QueueName("team-a"))  # some usage left
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(yaml.safe_dump(DOC))
    for half_life_s in (30.0, 0.0):
        quota = QuotaSettings(queues_file=queues_file, fair_share_half_life_s=half_life_s, metrics_port=None)
        found = state_snapshots(quota, new_state(quota))
        assert found is not None and found.topic == TOPICS.snapshots("quota")


def test_a_snapshot_written_under_another_queue_configuration_or_half_life_is_not_loaded(
    tmp_path: Path,
) -> None:
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(yaml.safe_dump(DOC))
    quota = QuotaSettings(queues_file=queues_file, fair_share_half_life_s=0, metrics_port=None)
    before = snapshot_config(quota)
    assert snapshot_config(quota) == before
    assert snapshot_config(quota.model_copy(update={"fair_share_half_life_s": 1.0})) != before
    other = {
        **DOC,
        "queues": [*DOC["queues"], {"name": "team-d", "cohort": "lab", "quotas": {H100: {"nominal": 1}}}],
    }
    queues_file.write_text(yaml.safe_dump(other))
    assert snapshot_config(quota) != before


def test_the_next_decisions_compared_queue_hold_and_move_jobs() -> None:
    # team-a fills its H100 quota and borrows; the snapshot is taken midway, and the restarts let the
    # next jobs through, hold the others, and publish statuses alike.
    ops: list[tuple[Any, ...]] = [
        ("admit", "team-a", 8, H100, 0),
        ("grant", 0),
        ("admit", "team-a", 4, None, 1),
    ]
    ops += [("admit", "team-b", 8, H100, 0), ("cordon", 2), ("admit", "team-c", 4, None, 0)]
    world, payload, covered = run(ops, 3, 0.0)
    assert covered < len(world.log)
    decided = next_decisions(restore(loaded(payload, 0.0), world.log[covered:], whole=world.log), world)
    kinds = {e.data.TYPE for e in decided}
    assert {"job.queued", "job.pending", "queue.status"} <= kinds
    assert decided == next_decisions(restore(fresh(0.0), world.log, whole=world.log), world)


def test_a_loaded_state_skips_what_the_select_was_told_is_retired() -> None:
    # The select holds the state's `retired` from before the load: it must see the loaded jobs.
    _, payload, _ = run([("admit", "default", 1, None, 0), ("admit", "team-a", 1, None, 0)], 1, 0.0)
    state = fresh(0.0)
    retired = state.retired
    load_state(state, decode_state(payload, QuotaState.SNAPSHOT_FIELDS))
    assert JobId("j0") in retired and JobId("j1") not in retired


def test_a_restore_remembers_the_pending_told_a_requeued_job_though_it_reads_the_release_later() -> None:
    # j0 is preempted: j1 takes its quota, and j0, requeued, is told why it waits. A restore reads that
    # pending (jobs.events) before j0's release (allocations.log): j0 is owed a job.queued but still
    # charged then; it is what quota last told j0 all the same, and a restart does not tell it again.
    ops: list[tuple[Any, ...]] = [
        ("admit", "team-a", 8, A100, 0),
        ("grant", 0),
        ("admit", "team-a", 8, A100, 0),
        ("preempt", 0),
    ]
    world, _, _ = run(ops, 0, 0.0)
    told = [e for _, e in world.log if isinstance(e.data, JobPending) and e.data.job_id == JobId("j0")]
    assert len(told) == 1 and JobId("j0") in world.state.last_pending
    from_log = restore(fresh(0.0), world.log, whole=world.log)
    assert from_log.last_pending == world.state.last_pending
    assert next_decisions(from_log, world) == next_decisions(world.state, world)
