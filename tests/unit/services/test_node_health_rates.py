"""node_health's rolling GPU error rates: repeated job-fault XIDs / correctable ECC drain a GPU."""

from __future__ import annotations

from datetime import timedelta

from svc_helpers import T0, cluster, env

from gangline.core.health import DrainPolicy
from gangline.events.allocations import AllocationGranted, Placement
from gangline.events.base import Envelope
from gangline.events.nodes import GpuErrorReported, GpuHealthChanged, HealthCause, HealthState
from gangline.events.types import AllocationId, GpuId, JobId, NodeId, QueueName
from services.common.topics import TopicNames
from services.node_health.handlers import NodeHealthState, decide
from services.node_health.rates import GpuErrorRates, error_kind
from services.node_health.settings import NodeHealthSettings
from services.node_health.wiring import new_state as new_node_health_state

TOPICS = TopicNames(prefix="t.")
WINDOW = timedelta(seconds=3600)


def new_state(*, job_faults: int = 3, sbe: int = 5) -> NodeHealthState:
    state = NodeHealthState(
        topics=TOPICS,
        silence=timedelta(seconds=10),
        check_every=timedelta(seconds=1),
        started=T0,
        rates=GpuErrorRates(DrainPolicy(window=WINDOW, job_fault_xids=job_faults, correctable_ecc=sbe)),
    )
    for node in cluster(("a", 2, 8)).registrations():
        state.restore(env(node))
    return state


def report(
    node: str, gpu: str, *, xid: int | None = None, sbe: bool = False, state: HealthState = "healthy"
) -> GpuErrorReported:
    if sbe:
        cause = HealthCause(kind="ecc", message="ecc.sbe: correctable (single-bit) ECC error")
    else:
        assert xid is not None
        cause = HealthCause(kind="xid", message=f"xid.{xid}: reported", xid=xid)
    return GpuErrorReported(node=NodeId(node), gpu=GpuId(gpu), state=state, cause=cause)


def degraded_in(out: list[tuple[str, Envelope]]) -> list[tuple[str, GpuHealthChanged]]:
    return [
        (t, e.data) for t, e in out if isinstance(e.data, GpuHealthChanged) and e.data.state == "degraded"
    ]


def feed(state: NodeHealthState, events: list[Envelope]) -> list[tuple[str, Envelope]]:
    out: list[tuple[str, Envelope]] = []
    for e in events:
        out += decide(e, state, now=e.time)
    return out


def test_what_counts_as_a_repeated_error() -> None:
    assert error_kind(report("a-0", "gpu0", xid=13)) == "job_fault"
    assert error_kind(report("a-0", "gpu0", xid=31)) == "job_fault"
    assert error_kind(report("a-0", "gpu0", sbe=True)) == "correctable_ecc"
    assert error_kind(report("a-0", "gpu0", xid=92)) == "correctable_ecc"
    assert error_kind(report("a-0", "gpu0", xid=79, state="failed")) is None  # a failure, not a rate
    assert error_kind(report("a-0", "gpu0", xid=45)) is None  # cleanup noise after a kill
    dbe = GpuHealthChanged(
        node=NodeId("a-0"),
        gpu=GpuId("gpu0"),
        previous="healthy",
        state="failed",
        cause=HealthCause(kind="ecc", message="ecc.dbe: double-bit ECC error event"),
    )
    assert error_kind(dbe) is None


def test_job_fault_xids_above_the_limit_drain_the_gpu_once() -> None:
    state = new_state(job_faults=3)
    first_two = feed(state, [env(report("a-0", "gpu1", xid=13), at=t) for t in (10, 20)])
    assert first_two == []
    out = feed(state, [env(report("a-0", "gpu1", xid=31), at=30)])
    [(topic, changed)] = degraded_in(out)
    assert topic == TOPICS.health
    assert (changed.node, changed.gpu, changed.previous, changed.state) == (
        "a-0",
        "gpu1",
        "healthy",
        "degraded",
    )
    assert changed.cause.kind == "xid" and changed.cause.xid == 31
    assert "3 job-fault XIDs on a-0/gpu1" in changed.cause.message
    assert out[0][1].time == T0 + timedelta(seconds=30)  # the event's time, not a clock
    # Already drained: more faults say nothing new; other GPUs keep their own windows.
    assert feed(state, [env(report("a-0", "gpu1", xid=13), at=40)]) == []
    assert feed(state, [env(report("a-0", "gpu2", xid=13), at=t) for t in (41, 42)]) == []
    assert set(state.degraded) == {("a-0", "gpu1")}


def test_errors_spread_wider_than_the_window_do_not_drain() -> None:
    state = new_state(job_faults=3)
    assert feed(state, [env(report("a-1", "gpu0", xid=13), at=t) for t in (0, 2000, 4000)]) == []
    # (0 fell out of the window at 3600.) One more within the hour of 2000 and 4000 makes three.
    assert len(degraded_in(feed(state, [env(report("a-1", "gpu0", xid=43), at=4100)]))) == 1


def test_correctable_ecc_rate_has_its_own_limit() -> None:
    state = new_state(job_faults=3, sbe=5)
    out = feed(state, [env(report("a-0", "gpu3", sbe=True), at=t) for t in range(4)])
    assert out == []
    assert feed(state, [env(report("a-0", "gpu3", xid=13), at=5)]) == []  # kinds are counted apart
    [(_, changed)] = degraded_in(feed(state, [env(report("a-0", "gpu3", sbe=True), at=6)]))
    assert changed.cause.kind == "ecc" and "5 correctable ECC errors" in changed.cause.message


def test_a_degraded_gpu_keeps_its_running_job_and_a_failed_one_is_not_drained() -> None:
    state = new_state(job_faults=2)
    granted = AllocationGranted(
        job_id=JobId("j"),
        allocation_id=AllocationId("j.c1"),
        queue=QueueName("default"),
        placements=(Placement(rank=0, node=NodeId("a-0"), gpus=(GpuId("gpu0"),)),),
    )
    state.restore(env(granted))
    out = feed(state, [env(report("a-0", "gpu0", xid=13), at=t) for t in (1, 2)])
    assert [t for t, _ in out] == [TOPICS.health]  # drained, nothing released
    assert "j.c1" in state.live
    # A GPU its agent already reports failed is node_failed's business, not a rate's.
    fell_off = HealthCause(kind="xid", message="xid.79: fallen off the bus", xid=79)
    failed = GpuHealthChanged(
        node=NodeId("a-1"), gpu=GpuId("gpu0"), previous="healthy", state="failed", cause=fell_off
    )
    feed(state, [env(failed, at=3)])
    assert feed(state, [env(report("a-1", "gpu0", xid=13, state="failed"), at=t) for t in (4, 5)]) == []


def test_node_healths_own_verdicts_are_not_counted_as_errors() -> None:
    state = new_state(job_faults=2)
    cause = HealthCause(kind="xid", message="2 job-fault XIDs on a-0/gpu5", xid=13)
    verdict = GpuHealthChanged(
        node=NodeId("a-0"), gpu=GpuId("gpu5"), previous="healthy", state="degraded", cause=cause
    )
    ours = env(verdict, at=1).model_copy(update={"source": "gangline/node-health"})
    assert feed(state, [ours, ours.model_copy(update={"id": "again"})]) == []
    assert state.rates.count("job_fault", NodeId("a-0"), GpuId("gpu5"), T0 + timedelta(seconds=2)) == 0


def test_registration_starts_a_nodes_windows_afresh() -> None:
    state = new_state(job_faults=2)
    feed(state, [env(report("a-0", "gpu0", xid=13), at=1)])
    [node] = [n for n in cluster(("a", 2, 8)).registrations() if n.node == "a-0"]
    feed(state, [env(node, at=2)])
    assert feed(state, [env(report("a-0", "gpu0", xid=13), at=3)]) == []
    assert len(degraded_in(feed(state, [env(report("a-0", "gpu0", xid=13), at=4)]))) == 1
    feed(state, [env(node, at=5)])  # after a reset the GPU is schedulable, its history gone
    assert state.degraded == {}


def test_restoring_from_the_log_rebuilds_windows_and_verdicts() -> None:
    log = [env(report("a-0", "gpu1", xid=13), at=t) for t in (1, 2, 3)]
    live = new_state(job_faults=3)
    out = feed(live, log)
    [(_, drained)] = [(t, e) for t, e in out]
    # A restarted node_health folds the same log, its own verdict included: nothing is decided twice.
    restored = new_state(job_faults=3)
    for e in [*log, drained]:
        restored.restore(e)
    assert set(restored.degraded) == {("a-0", "gpu1")}
    assert feed(restored, [env(report("a-0", "gpu1", xid=13), at=4)]) == []
    # Restored from the reports only (its verdict not yet written), the next report decides the same.
    partial = new_state(job_faults=3)
    for e in log[:2]:
        partial.restore(e)
    again = feed(partial, [log[2]])
    assert [e.id for _, e in again] == [drained.id]


def test_rolling_windows_accept_out_of_order_times() -> None:
    rates = GpuErrorRates(DrainPolicy(window=WINDOW, job_fault_xids=2, correctable_ecc=10))
    r = report("a-0", "gpu0", xid=13)
    rates.record(r, T0 + timedelta(seconds=3000))
    rates.record(r, T0 + timedelta(seconds=100))
    node, gpu = NodeId("a-0"), GpuId("gpu0")
    assert rates.count("job_fault", node, gpu, T0 + timedelta(seconds=3500)) == 2
    assert rates.over_limit(node, gpu, T0 + timedelta(seconds=3500)) is not None
    assert rates.count("job_fault", node, gpu, T0 + timedelta(seconds=3800)) == 1
    assert rates.over_limit(node, gpu, T0 + timedelta(seconds=3800)) is None


def test_warning_xids_have_their_own_limit() -> None:
    state = new_state(job_faults=3, sbe=5)
    assert error_kind(report("a-0", "gpu0", xid=32)) == "warning_xid"
    assert feed(state, [env(report("a-0", "gpu4", xid=32), at=t) for t in (1, 2)]) == []
    [(_, changed)] = degraded_in(feed(state, [env(report("a-0", "gpu4", xid=999), at=3)]))
    assert changed.cause.kind == "xid" and changed.cause.xid == 999
    assert "3 warning XIDs on a-0/gpu4" in changed.cause.message


def test_a_report_counts_as_many_errors_as_it_carries() -> None:
    state = new_state(sbe=100)
    jump = report("a-1", "gpu2", sbe=True).model_copy(update={"count": 99})
    assert feed(state, [env(jump, at=1)]) == []
    [(_, changed)] = degraded_in(feed(state, [env(report("a-1", "gpu2", sbe=True), at=2)]))
    assert "100 correctable ECC errors" in changed.cause.message


def test_the_settings_are_the_core_policys_numbers_read_from_the_environment() -> None:
    assert NodeHealthSettings.from_env({}).drain_policy() == DrainPolicy()
    policy = NodeHealthSettings.from_env(
        {
            "GANGLINE_ERROR_WINDOW_S": "600",
            "GANGLINE_JOB_FAULT_XIDS_LIMIT": "2",
            "GANGLINE_WARNING_XIDS_LIMIT": "4",
            "GANGLINE_CORRECTABLE_ECC_LIMIT": "50",
        }
    ).drain_policy()
    assert policy == DrainPolicy(
        window=timedelta(minutes=10), job_fault_xids=2, warning_xids=4, correctable_ecc=50
    )
    assert new_node_health_state(NodeHealthSettings.from_env({}), now=T0).rates.policy == DrainPolicy()
