"""Preemption's decisions replayed from a recorded log: victims asked to checkpoint, finished on their
checkpoint or past their deadline, across a restart, replay identical; a tampered deadline and a
dropped checkpoint are named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay_recorder import TOPICS, Log, ServiceRun, Wiring, outputs_of, tampered
from svc_helpers import cluster, env

from gangline.core.defaults import default_profile
from gangline.events.base import Envelope
from gangline.events.jobs import JobAdmitted, JobCheckpointed, JobPending, JobSpec, PendingReason
from gangline.events.nodes import NodeHeartbeat
from gangline.events.types import AllocationId, JobId, NodeId
from gangline.fold.cluster import FOLDED_EVENTS
from services.common.select import select_types
from services.placement.handlers import PlacementState
from services.placement.handlers import decide as place
from services.preemption.handlers import SOURCE, PreemptionState, end_batch, fold_event
from services.preemption.replay import replay_preemption
from services.preemption.settings import PreemptionSettings
from services.preemption.wiring import new_state

SETTINGS = PreemptionSettings(gated=False)
PREEMPTING = "gangline.job.preempting.v1"


def wiring(settings: PreemptionSettings = SETTINGS) -> Wiring:
    def decider(state: PreemptionState, clock: Any) -> Any:
        return lambda envelope, meta: fold_event(envelope, state, now=clock())

    def search(state: PreemptionState, clock: Any) -> Any:
        return lambda cause: end_batch(state, now=clock())

    def select(state: PreemptionState) -> Any:
        wanted: dict[str, Any] = {
            **dict.fromkeys(FOLDED_EVENTS, True),
            "job.pending": True,
            "job.checkpointed": True,
            "node.heartbeat": lambda: bool(state.in_flight),
        }
        return select_types(wanted)

    inputs = (TOPICS.inventory, TOPICS.health, TOPICS.events, TOPICS.allocations)
    return Wiring(
        live_topics=(*inputs, TOPICS.heartbeats),
        restore_topics=inputs,
        new_state=lambda now: new_state(settings),
        restore=lambda state, envelope: state.restore(envelope),
        decide=decider,
        end_batch=search,
        select=select,
    )


class Placement:
    """Placement deciding in-process on what it is given, its outputs written to the log."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.state = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)

    def feed(self, envelope: Envelope) -> None:
        for topic, out in place(envelope, self.state, now=self.log.tick()):
            self.log.produce(topic, out.model_copy(update={"causationid": envelope.id}))


def recorded_log() -> Log:
    log = Log()
    placement = Placement(log)
    for node in cluster(("a", 2, 8)).registrations():
        placement.feed(env(node))
        log.produce(TOPICS.inventory, env(node))
    run = ServiceRun(log, wiring())
    for k in range(4):
        spec = JobSpec(queue="default", workers=1, gpus_per_worker=4, preemptible=True, checkpoint_grace_s=2)
        admitted = env(JobAdmitted(job_id=JobId(f"low-{k}"), spec=spec), at=k)
        log.produce(TOPICS.events, admitted)
        placement.feed(admitted)
    run.drain()
    big = JobSpec(queue="default", workers=2, gpus_per_worker=8, priority=9)
    urgent = env(JobAdmitted(job_id=JobId("urgent"), spec=big), at=10)
    log.produce(TOPICS.events, urgent)
    placement.feed(urgent)  # it does not fit: job.pending
    run.drain()
    asked = [r for r in log.records if r.type == PREEMPTING]
    for r in asked[:2]:
        data = r.envelope["data"]
        ack = JobCheckpointed(
            job_id=JobId(data["job_id"]),
            allocation_id=AllocationId(data["allocation_id"]),
            node=NodeId("a-0"),
            checkpoint=f"ckpt://{data['job_id']}/1",
        )
        log.produce(TOPICS.events, env(ack))
    run.drain(max_per_partition=1)
    run.start()  # restored: the victims still asked are in flight again
    log.tick(3000)  # past the other victims' deadlines: the next heartbeat finishes them
    log.produce(TOPICS.heartbeats, env(NodeHeartbeat(node=NodeId("a-1"), seq=1)))
    run.drain()
    return log


def test_an_untouched_log_replays_identical_across_a_restart() -> None:
    log = recorded_log()
    outputs = outputs_of(log.records, SOURCE)
    preempted = [r.envelope["data"] for r in outputs if r.type == "gangline.job.preempted.v1"]
    assert len([r for r in outputs if r.type == PREEMPTING]) == 4
    assert sorted(p["checkpointed"] for p in preempted) == [False, False, True, True]

    result = replay_preemption(log.records, SETTINGS)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2
    assert result.compared == len(outputs) == 16


def test_a_tampered_deadline_is_named() -> None:
    records = recorded_log().records
    target = next(r for r in outputs_of(records, SOURCE) if r.type == PREEMPTING)

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["deadline"] = "2030-01-01T00:00:00Z"

    first = replay_preemption(tampered(records, target, forge), SETTINGS).first

    assert first is not None
    victim = target.envelope["data"]["job_id"]
    assert (first.where, first.job_id, first.field) == (target.where, victim, "data.deadline")


def test_a_dropped_checkpoint_is_named_as_the_finish_it_caused() -> None:
    records = recorded_log().records
    dropped = next(r for r in records if r.type == "gangline.job.checkpointed.v1")
    victim = dropped.envelope["data"]["job_id"]
    finished = [
        r for r in outputs_of(records, SOURCE) if r.key == victim and r.type != PREEMPTING
    ]  # released, preempted, requeued: at the end of the checkpoint's batch
    assert len(finished) == 3

    result = replay_preemption([r for r in records if r is not dropped], SETTINGS)

    named = {(d.where, d.replayed) for d in result.differences}
    assert {(r.where, "not decided by the replay") for r in finished} <= named


LAB = """
cohorts: [{name: lab}]
queues:
  - {name: team-a, cohort: lab, quotas: {H100-SXM5-80GB: {nominal: 8, borrowing_limit: 0}}}
  - {name: team-b, cohort: lab, quotas: {H100-SXM5-80GB: {nominal: 8}}}
"""


def quota_hold(job: str, constraint: str) -> Envelope:
    reason = PendingReason(
        code="quota",
        constraint=constraint,
        message="team-a uses 0 of its 8 H100-SXM5-80GB; cohort has 0 to lend; needs 8",
        details={"queue": "team-a", "gpu_type": "H100-SXM5-80GB"},
    )
    return env(JobPending(job_id=JobId(job), reasons=(reason,)))


def test_a_reclaim_for_a_job_quota_holds_replays_identical_across_a_restart(tmp_path: Path) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(LAB, encoding="utf-8")
    settings = PreemptionSettings(gated=False, queues_file=queues)
    log = Log()
    placement = Placement(log)
    for node in cluster(("a", 2, 8)).registrations():
        placement.feed(env(node))
        log.produce(TOPICS.inventory, env(node))
    run = ServiceRun(log, wiring(settings))
    for k in range(2):
        spec = JobSpec(queue="team-b", workers=1, gpus_per_worker=8, preemptible=True, checkpoint_grace_s=2)
        admitted = env(JobAdmitted(job_id=JobId(f"b-{k}"), spec=spec), at=k)
        log.produce(TOPICS.events, admitted)
        placement.feed(admitted)
    run.drain()
    owed = JobSpec(queue="team-a", workers=1, gpus_per_worker=8)
    log.produce(TOPICS.events, env(JobAdmitted(job_id=JobId("a-1"), spec=owed), at=5))
    log.tick(60_000)
    log.produce(TOPICS.events, quota_hold("a-1", "reclaim"))  # as quota says it: owed its nominal quota
    run.drain()
    [asking] = [r for r in log.records if r.type == PREEMPTING]
    assert asking.envelope["data"]["preemptor_job_id"] == "a-1"
    run.start()  # restored: the victim still asked is in flight again, the hold is not planned twice
    log.tick(3000)  # past the victim's deadline: the next heartbeat finishes it
    log.produce(TOPICS.heartbeats, env(NodeHeartbeat(node=NodeId("a-1"), seq=1)))
    run.drain()
    outputs = outputs_of(log.records, SOURCE)
    assert [r.type for r in outputs].count(PREEMPTING) == 1 and len(outputs) == 4

    result = replay_preemption(log.records, settings)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2 and result.compared == len(outputs)
