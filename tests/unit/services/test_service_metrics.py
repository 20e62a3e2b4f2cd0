"""The services' metric figures, computed from their own state: placement's jobs and GPUs, quota's quota
and fair share, preemption's counters, and the shell's decisions; read back as Prometheus text."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from svc_helpers import T0, admitted, env
from test_placement import feed as place
from test_placement import new_state
from test_quota import LAB, admit, feed, grant, quota, run

from gangline.events.allocations import AllocationGranted
from gangline.events.base import Envelope, make_envelope
from gangline.events.jobs import JobPreempted, JobPreempting
from gangline.events.nodes import GpuHealthChanged, HealthCause
from gangline.events.queues import QueueResource, QueueStatus
from gangline.events.types import AllocationId, GpuId, JobId, QueueName
from services.common.metrics import ServiceMetrics
from services.placement import metrics as placement_metrics
from services.preemption import metrics as preemption_metrics
from services.preemption.handlers import RECLAIMS
from services.preemption.settings import PreemptionSettings
from services.preemption.wiring import new_state as preemption_state
from services.quota import metrics as quota_metrics
from services.quota.metrics import lent, quota_figures

H100 = "H100-SXM5-80GB"


def samples(metrics: ServiceMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample the registry serves, by name and labels, parsed back from the exposition text."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def of(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def grant_of(outputs: list[Envelope], job: str) -> AllocationGranted:
    [granted] = [e.data for e in outputs if isinstance(e.data, AllocationGranted) and e.data.job_id == job]
    return granted


def test_placement_serves_jobs_and_gpus_by_state_from_its_fold() -> None:
    state = new_state(("a", 2, 8))
    metrics = ServiceMetrics("placement", process=False)
    placement_metrics.watch(metrics, state)
    # j1 takes 6 GPUs of one node, j2 the other whole node; j3 (4 GPUs) finds 2 free: pending, stranded.
    outputs = [
        *place(state, admitted("j1", gpus_per_worker=6)),
        *place(state, admitted("j2", gpus_per_worker=8)),
    ]
    outputs += place(state, admitted("j3", gpus_per_worker=4))
    metrics.decided([("t", e) for e in outputs], 0.001)
    j1, j2 = grant_of(outputs, "j1"), grant_of(outputs, "j2")
    asked = JobPreempting(
        job_id=JobId("j2"),
        allocation_id=j2.allocation_id,
        deadline=T0,
        reason="job j3 needs the GPUs",
        preemptor_job_id=JobId("j3"),
    )
    place(state, env(asked))
    node = j1.placements[0].node
    free_gpu = next(g.id for g in state.nodes[node].gpus if g.id not in j1.placements[0].gpus)
    degraded = GpuHealthChanged(
        node=node,
        gpu=GpuId(free_gpu),
        previous="healthy",
        state="degraded",
        cause=HealthCause(kind="ecc", message="uncorrectable ECC errors"),
    )
    place(state, env(degraded, at=1))

    found = samples(metrics)
    assert of(found, "gangline_jobs", queue="default", state="running") == 1
    assert of(found, "gangline_jobs", queue="default", state="preempting") == 1
    assert of(found, "gangline_jobs", queue="default", state="pending") == 1
    assert of(found, "gangline_jobs", queue="default", state="waiting") == 0
    [pending] = [k for k in found if k[0] == "gangline_pending_jobs"]
    assert dict(pending[1])["queue"] == "default" and found[pending] == 1
    assert of(found, "gangline_gpus", gpu_model=H100, state="allocated") == 14
    assert of(found, "gangline_gpus", gpu_model=H100, state="degraded") == 1
    assert of(found, "gangline_gpus", gpu_model=H100, state="free") == 1
    assert of(found, "gangline_gpus", gpu_model=H100, state="cordoned") == 0
    # One free GPU left and the waiting worker needs 4: it is stranded.
    assert of(found, "gangline_fragmented_gpus", gpu_model=H100) == 1
    assert of(found, "gangline_request_to_grant_seconds_count", queue="default") == 2
    assert of(found, "gangline_decisions_total", service="placement", kind="allocation.granted") == 2
    assert of(found, "gangline_cycle_seconds_count", service="placement") == 1


def test_nothing_waiting_strands_no_gpu() -> None:
    state = new_state(("a", 1, 8))
    metrics = ServiceMetrics("placement", process=False)
    placement_metrics.watch(metrics, state)
    place(state, admitted("j1", gpus_per_worker=3))
    found = samples(metrics)
    assert of(found, "gangline_fragmented_gpus", gpu_model=H100) == 0
    assert of(found, "gangline_gpus", gpu_model=H100, state="free") == 5


def test_quota_serves_nominal_used_borrowed_lent_and_fair_share() -> None:
    state = quota(LAB)
    metrics = ServiceMetrics("quota", process=False)
    quota_metrics.watch(metrics, state)
    queued = run(state, "b1", queue="team-b", gpus_per_worker=8, workers=1)
    more = feed(state, admit("b2", queue="team-b", gpus_per_worker=4, at=10))
    feed(state, grant("b2", at=10))
    metrics.decided([("t", queued), *(("t", e) for e in more)], 0.001)

    found = samples(metrics)
    assert of(found, "gangline_quota_gpus", queue="team-b", gpu_model=H100, kind="nominal") == 8
    assert of(found, "gangline_quota_gpus", queue="team-b", gpu_model=H100, kind="used") == 12
    assert of(found, "gangline_quota_gpus", queue="team-b", gpu_model=H100, kind="borrowed") == 4
    assert of(found, "gangline_quota_gpus", queue="team-a", gpu_model=H100, kind="lent") == 4
    assert of(found, "gangline_quota_gpus", queue="team-a", gpu_model=H100, kind="used") == 0
    assert of(found, "gangline_quota_gpus", queue="team-b", gpu_model=H100, kind="lent") == 0
    share_a, share_b = (
        of(found, "gangline_fair_share", queue="team-a"),
        of(found, "gangline_fair_share", queue="team-b"),
    )
    assert share_a == 0 and share_b is not None and share_b > 0
    # Both were let through at once: their waits are 0, in the lowest bucket.
    assert of(found, "gangline_admission_wait_seconds_count", queue="team-b") == 2
    assert of(found, "gangline_admission_wait_seconds_bucket", queue="team-b", le="0.1") == 2
    assert [m.name for m in quota_figures(state, T0)] == ["gangline_quota_gpus", "gangline_fair_share"]


def _status(queue: str, nominal: int, used: int, borrowed: int) -> QueueStatus:
    return QueueStatus(
        queue=QueueName(queue),
        cohort="lab",
        weight=1.0,
        dominant_share=0.0,
        position=1,
        of=3,
        resources={H100: QueueResource(used=used, nominal=nominal, borrowed=borrowed, lendable=0)},
        as_of=T0,
    )


def test_what_a_tree_borrowed_is_lent_by_its_idle_queues_in_proportion() -> None:
    statuses = [_status("a", 8, 2, 0), _status("b", 4, 2, 0), _status("c", 4, 10, 6)]
    lends = lent(statuses)
    # a leaves 6 idle, b 2: of c's 6 borrowed GPUs a lends 4.5 and b 1.5; c lends nothing.
    assert lends == {("a", H100): 4.5, ("b", H100): 1.5, ("c", H100): 0.0}
    assert lent([_status("a", 4, 4, 0)]) == {("a", H100): 0.0}


def test_preemption_counts_victims_by_queue_and_why_and_the_gpu_hours_lost() -> None:
    state = preemption_state(PreemptionSettings())
    metrics = ServiceMetrics("preemption", process=False)
    preemption_metrics.watch(metrics, state)
    state.mirror.fold(admitted("v1", queue="team-a"))
    asked = [
        JobPreempting(
            job_id=JobId("v1"), allocation_id=AllocationId("v1.1"), deadline=T0, reason=f"job u {why}"
        )
        for why in ("needs the GPUs (lowest loss)", f"{RECLAIMS} (lowest loss)")
    ]
    lost = JobPreempted(
        job_id=JobId("v1"), allocation_id=AllocationId("v1.1"), checkpointed=False, lost_gpu_seconds=5400
    )
    outputs = [
        ("t", make_envelope(e, event_id=f"p{i}", source="t", time=T0)) for i, e in enumerate([*asked, lost])
    ]
    metrics.decided(outputs, None)

    found = samples(metrics)
    assert of(found, "gangline_preemptions_total", queue="team-a", reason="priority") == 1
    assert of(found, "gangline_preemptions_total", queue="team-a", reason="reclaim") == 1
    assert of(found, "gangline_gpu_hours_lost_total", queue="team-a") == 1.5
    assert of(found, "gangline_decisions_total", service="preemption", kind="job.preempting") == 2
    assert not [k for k in found if k[0] == "gangline_cycle_seconds_count"]  # not timed: a fold


def test_a_service_not_consuming_yet_serves_its_families_without_series() -> None:
    metrics = ServiceMetrics("admission", process=False)
    text = generate_latest(metrics.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"gangline_transactions", "gangline_dead_letters", "gangline_consumer_lag_records"} <= set(
        families
    )
    assert families["gangline_consumer_lag_records"].samples == []


def test_each_service_has_its_own_metrics_port_which_the_environment_moves_or_turns_off() -> None:
    from gangline.telemetry.metrics import METRICS_PORTS
    from services.admission.settings import AdmissionSettings
    from services.api.settings import ApiSettings
    from services.ledger.settings import LedgerSettings
    from services.node_health.settings import NodeHealthSettings
    from services.placement.settings import PlacementSettings
    from services.quota.settings import QuotaSettings

    classes = {
        "admission": AdmissionSettings,
        "quota": QuotaSettings,
        "placement": PlacementSettings,
        "preemption": PreemptionSettings,
        "node_health": NodeHealthSettings,
        "ledger": LedgerSettings,
        "api": ApiSettings,
    }
    for service, cls in classes.items():
        settings = cls.from_env({})
        assert (settings.metrics_host, settings.metrics_port) == ("127.0.0.1", METRICS_PORTS[service])
    assert PlacementSettings.from_env({"GANGLINE_METRICS_PORT": "19473"}).metrics_port == 19473
    assert PlacementSettings.from_env({"GANGLINE_METRICS_PORT": "off"}).metrics_port is None


def test_a_scrape_leaves_placements_fold_as_it_found_it() -> None:
    state = new_state(("a", 1, 8))
    place(state, admitted("j1", gpus_per_worker=6))
    place(state, admitted("j2", gpus_per_worker=4))  # waits: the fragmentation figure needs a snapshot
    state._snapshot = None
    figures = placement_metrics.cluster_figures(state)
    assert state._snapshot is None
    [fragmented] = [m for m in figures if m.name == "gangline_fragmented_gpus"]
    assert [s.value for s in fragmented.samples] == [2]
