"""node_health's decisions replayed from a recorded log: silent nodes declared failed (their gangs released
and requeued) and GPUs drained for repeated errors replay identical across a restart; a tampered
declaration is named, and so is one the heartbeats in the log do not justify."""

from __future__ import annotations

from typing import Any

from replay_recorder import TOPICS, Log, ServiceRun, Wiring, outputs_of, tampered
from svc_helpers import T0, cluster, env

from gangline.events.allocations import AllocationGranted, Placement
from gangline.events.nodes import GpuErrorReported, HealthCause, NodeHeartbeat
from gangline.events.types import AllocationId, GpuId, JobId, NodeId, QueueName
from services.common.select import select_types
from services.node_health.handlers import SOURCE, NodeHealthState
from services.node_health.replay import replay_node_health
from services.node_health.settings import NodeHealthSettings
from services.node_health.wiring import NODE_HEALTH_EVENTS, handler, new_state

SETTINGS = NodeHealthSettings(silence_s=4, check_every_s=0.5)
FAILED = "gangline.node.failed.v1"


def wiring() -> Wiring:
    def decider(state: NodeHealthState, clock: Any) -> Any:
        return handler(state, clock)

    return Wiring(
        live_topics=(TOPICS.inventory, TOPICS.health, TOPICS.allocations, TOPICS.heartbeats, TOPICS.events),
        restore_topics=(TOPICS.inventory, TOPICS.health, TOPICS.allocations, TOPICS.events),
        new_state=lambda now: new_state(SETTINGS, now=now),
        restore=lambda state, envelope: state.restore(envelope),
        decide=decider,
        select=lambda state: select_types(dict.fromkeys(NODE_HEALTH_EVENTS, True)),
    )


def grant(job: str, *nodes: str) -> AllocationGranted:
    return AllocationGranted(
        job_id=JobId(job),
        allocation_id=AllocationId(f"{job}.1"),
        queue=QueueName("default"),
        placements=tuple(
            Placement(rank=r, node=NodeId(n), gpus=(GpuId("gpu0"), GpuId("gpu1")))
            for r, n in enumerate(nodes)
        ),
    )


def now_s(log: Log) -> float:
    return (log.clock - T0).total_seconds()


def beats(log: Log, run: ServiceRun, nodes: list[str], seconds: int, seq: dict[str, int]) -> None:
    """Every node in ``nodes`` beats twice a second for ``seconds``; node_health polls after each round."""
    for _ in range(2 * seconds):
        log.tick(500)
        for node in nodes:
            seq[node] = seq.get(node, 0) + 1
            log.produce(
                TOPICS.heartbeats, env(NodeHeartbeat(node=NodeId(node), seq=seq[node]), at=now_s(log))
            )
        run.drain()


def recorded_log() -> Log:
    """a-1 goes silent and is declared failed; a restart; a-2 goes silent too; three GPUs' errors repeat."""
    log = Log()
    for node in cluster(("a", 4, 8)).registrations():
        log.produce(TOPICS.inventory, env(node, at=now_s(log)))
    log.produce(TOPICS.allocations, env(grant("g1", "a-0", "a-1"), at=now_s(log)))
    log.produce(TOPICS.allocations, env(grant("g2", "a-2"), at=now_s(log)))
    log.produce(TOPICS.allocations, env(grant("g3", "a-3"), at=now_s(log)))
    run = ServiceRun(log, wiring())
    seq: dict[str, int] = {}
    beats(log, run, ["a-0", "a-1", "a-2", "a-3"], 2, seq)
    beats(log, run, ["a-0", "a-2", "a-3"], 6, seq)  # a-1 silent past 4 s
    run.start()
    beats(log, run, ["a-0", "a-2", "a-3"], 2, seq)
    beats(log, run, ["a-0", "a-3"], 6, seq)  # a-2 silent past 4 s
    for k in range(3):  # job-fault XIDs on one GPU: drained
        cause = HealthCause(kind="xid", message="xid 13", xid=13)
        report = GpuErrorReported(node=NodeId("a-3"), gpu=GpuId("gpu1"), state="healthy", cause=cause)
        log.produce(TOPICS.health, env(report, at=now_s(log) + k))
    for k, xid in enumerate((32, 999, 32)):  # warning XIDs on another: drained by their own limit
        cause = HealthCause(kind="xid", message=f"xid.{xid}: warning", xid=xid)
        report = GpuErrorReported(node=NodeId("a-0"), gpu=GpuId("gpu2"), state="healthy", cause=cause)
        log.produce(TOPICS.health, env(report, at=now_s(log) + k))
    jump = GpuErrorReported(  # a correctable ECC counter jump, one report of 100
        node=NodeId("a-0"),
        gpu=GpuId("gpu3"),
        state="healthy",
        cause=HealthCause(kind="ecc", message="ecc.sbe: correctable (single-bit) ECC errors"),
        count=100,
    )
    log.produce(TOPICS.health, env(jump, at=now_s(log)))
    beats(log, run, ["a-0", "a-3"], 1, seq)
    return log


def test_an_untouched_log_replays_identical_across_a_restart() -> None:
    log = recorded_log()
    outputs = outputs_of(log.records, SOURCE)
    failed = [r.envelope["data"]["node"] for r in outputs if r.type == FAILED]
    assert failed == ["a-1", "a-2"]
    drained = [
        (r.envelope["data"]["node"], r.envelope["data"]["gpu"])
        for r in outputs
        if r.type == "gangline.gpu.health_changed.v1"
    ]
    assert drained == [("a-3", "gpu1"), ("a-0", "gpu2"), ("a-0", "gpu3")]

    result = replay_node_health(log.records, SETTINGS)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2
    assert result.compared == len(outputs) >= 7


def test_a_tampered_declaration_is_named() -> None:
    records = recorded_log().records
    target = next(r for r in outputs_of(records, SOURCE) if r.type == FAILED)

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["last_seq"] = 1

    first = replay_node_health(tampered(records, target, forge), SETTINGS).first

    assert first is not None
    assert (first.where, first.job_id, first.field) == (target.where, "a-1", "data.last_seq")


def test_a_declaration_the_heartbeats_do_not_justify_is_named() -> None:
    """With a silence limit longer than the silence seen, the recorded declaration is not re-decided."""
    records = recorded_log().records
    target = next(r for r in outputs_of(records, SOURCE) if r.type == FAILED)

    result = replay_node_health(records, SETTINGS.model_copy(update={"silence_s": 60.0}))

    assert not result.ok
    assert (target.where, "a-1", FAILED, "not decided by the replay") in [
        (d.where, d.job_id, d.field, d.replayed) for d in result.differences
    ]


def test_silence_checks_the_live_run_skipped_while_lagging_are_not_run_by_the_replay() -> None:
    """Beats read 3 s after they were sent (over the 2 s lag limit): no check then, though a-1 was silent by
    then; the first beat read in time finds it silent."""
    log = Log()
    for node in cluster(("a", 2, 8)).registrations():
        log.produce(TOPICS.inventory, env(node, at=now_s(log)))
    run = ServiceRun(log, wiring())
    seq: dict[str, int] = {}
    beats(log, run, ["a-0", "a-1"], 2, seq)
    for k in range(20):  # a-1 silent; a-0's beats arrive late
        log.tick(500)
        beat = NodeHeartbeat(node=NodeId("a-0"), seq=100 + k)
        log.produce(TOPICS.heartbeats, env(beat, at=now_s(log) - 3))
        run.drain()
    assert outputs_of(log.records, SOURCE) == []
    beats(log, run, ["a-0"], 1, seq)
    [failed] = [r for r in outputs_of(log.records, SOURCE) if r.type == FAILED]
    assert failed.envelope["data"]["node"] == "a-1"

    result = replay_node_health(log.records, SETTINGS)

    assert result.ok, [d.message for d in result.differences]
    assert result.compared == 1 and result.inputs > 12
