"""The demo's table (services.agent.demo_view): fed envelopes, it shows queues, GPUs, events, counters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import JobAdmitted, JobCompleted, JobPending, JobQueued, JobRequested, PendingReason
from gangline.events.nodes import GpuHealthChanged, GpuInfo, HealthCause, NodeFailed, NodeRegistered
from gangline.events.queues import QueueResource, QueueStatus
from gangline.fold.cluster import ClusterFold
from services.agent.demo import where_to_look
from services.agent.demo_view import DemoView, counters_row, every_s, frame, render
from services.common.env import ServiceSettings

START = datetime(2026, 1, 5, 10, 0, 0, tzinfo=UTC)
H100 = "H100-SXM5-80GB"
L40S = "L40S-48GB"
_ids = iter(range(1_000_000))


def env(event: Event, at_s: float) -> Envelope:
    return make_envelope(
        event, event_id=f"e{next(_ids)}", source="test", time=START + timedelta(seconds=at_s)
    )


def node(name: str, model: str, gpus: int) -> NodeRegistered:
    return NodeRegistered(
        node=name,
        address="10.0.0.1",
        gpus=tuple(
            GpuInfo(id=f"gpu{i}", index=i, uuid=f"{name}-{i}", model=model, memory_mib=81_000)
            for i in range(gpus)
        ),
        nvlink_domain=name,
        leaf="l0",
        spine="s0",
    )


def request(job: str, queue: str = "default", gpus: int = 2) -> JobRequested:
    return JobRequested(job_id=job, queue=queue, workers=1, gpus_per_worker=gpus, gpu_type=H100)


def grant(job: str, queue: str, node_name: str, gpus: range) -> AllocationGranted:
    return AllocationGranted(
        job_id=job,
        allocation_id=f"{job}.1",
        queue=queue,
        placements=(Placement(rank=0, node=node_name, gpus=tuple(f"gpu{i}" for i in gpus)),),
    )


def section(text: str, header: str) -> list[list[str]]:
    """The rows (split on blanks) of the table whose header line starts with ``header``."""
    blocks = text.split("\n\n")
    block = next(b for b in blocks if b.startswith(header))
    return [line.split() for line in block.splitlines()[1:]]


def cluster_view() -> DemoView:
    """Two H100 nodes and one L40S node registered before the demo; three demo jobs in two queues."""
    view = DemoView(started=START, sent={"a": "default", "b": "default", "c": "research"})
    for n in (node("h100-0", H100, 8), node("h100-1", H100, 8), node("l40s-0", L40S, 4)):
        view.read(env(n, -60))
    for job, queue in view.sent.items():
        spec = request(job, queue)
        view.requested(env(spec, 1))
        view.read(env(JobAdmitted(job_id=job, spec=spec.spec()), 2))
        view.read(env(JobQueued(job_id=job, queue=queue), 3))
    return view


def test_queues_show_waiting_running_done_and_gpus_used() -> None:
    view = cluster_view()
    view.read(env(grant("a", "default", "h100-0", range(2)), 4))
    view.read(env(grant("b", "default", "h100-0", range(2, 4)), 4))
    view.read(env(JobCompleted(job_id="b", allocation_id="b.1"), 10))
    view.read(env(AllocationReleased(job_id="b", allocation_id="b.1", reason="completed"), 11))

    rows = {r[0]: r[1:5] for r in section(render(view, 12.0), "QUEUE")}
    # default: a running on 2 GPUs, b done; research: c waits for GPUs
    assert rows["default"] == ["0", "1", "1", "2"]
    assert rows["research"] == ["1", "0", "0", "0"]


def test_quota_figures_come_from_queue_status() -> None:
    view = cluster_view()
    status = QueueStatus(
        queue="research",
        cohort="root",
        weight=1.0,
        dominant_share=0.25,
        position=2,
        of=3,
        resources={H100: QueueResource(used=6, nominal=8, borrowed=0, lendable=0)},
        as_of=START,
    )
    view.read(env(status, 5))
    older = status.model_copy(update={"position": 1, "as_of": START - timedelta(seconds=30)})
    view.read(env(older, 6))  # an older figure read later does not replace the newer one
    rows = {r[0]: r for r in section(render(view, 6.0), "QUEUE")}
    assert rows["research"][-2:] == ["6/8", "2/3"]
    assert rows["default"][-2:] == ["-", "-"]  # quota said nothing about it


def test_gpus_by_state_per_model() -> None:
    view = cluster_view()
    view.read(env(grant("a", "default", "h100-0", range(2)), 4))
    cause = HealthCause(kind="xid", message="Xid 48: double-bit ECC error.", xid=48)
    changed = GpuHealthChanged(node="h100-0", gpu="gpu7", previous="healthy", state="degraded", cause=cause)
    view.read(env(changed, 5))
    view.read(env(NodeFailed(node="h100-1", code="heartbeat_timeout", reason="No heartbeat for 5 s."), 6))

    rows = {r[0]: r[1:] for r in section(render(view, 7.0), "GPU MODEL")}
    # FREE ALLOCATED CORDONED DEGRADED TOTAL
    assert rows[H100] == ["5", "2", "8", "1", "16"]
    assert rows[L40S] == ["4", "0", "0", "0", "4"]
    assert rows["all"] == ["9", "2", "8", "1", "20"]


def test_last_events_are_the_newest_since_the_start_without_the_noisy_ones() -> None:
    view = cluster_view()
    view.read(env(grant("a", "default", "h100-0", range(2)), 4))
    reason = PendingReason(code="quota", constraint="quota", message="Over quota.")
    view.read(env(JobPending(job_id="c", reasons=(reason,)), 5))
    view.read(env(NodeFailed(node="h100-1", code="heartbeat_timeout", reason="No heartbeat for 5 s."), 6))

    events = section(render(view, 7.0), "TIME")
    assert len(events) == 6
    assert [e[1] for e in events] == [
        "job.queued",
        "job.requested",
        "job.admitted",
        "job.queued",
        "allocation.granted",
        "node.failed",
    ]
    assert events[-2][2:] == ["a", "2", "GPUs", "on", "h100-0"]
    assert events[-1][:3] == ["10:00:06", "node.failed", "h100-1"]
    assert events[-1][3] == "heartbeat_timeout:"
    # the nodes registered before the demo started are folded but not listed
    assert all(e[1] != "node.registered" for e in events)


def test_counters_row_counts_only_the_demos_jobs_since_it_started() -> None:
    view = cluster_view()
    view.read(env(grant("a", "default", "h100-0", range(2)), 4))
    view.read(env(grant("other", "default", "h100-1", range(2)), 4))  # not the demo's
    view.read(env(JobCompleted(job_id="a", allocation_id="a.1"), -5))  # before the start: not counted
    row = counters_row(view, 76.8)
    assert row.startswith("[  76.8s] requested=3 admitted=3 rejected=0 granted=1 ")
    assert row.endswith("completed=0  finished 0/3")
    assert not view.all_finished


def test_all_finished_once_every_sent_job_ended() -> None:
    view = cluster_view()
    for k, job in enumerate(("a", "b", "c")):
        view.read(env(grant(job, view.sent[job], "h100-0", range(2 * k, 2 * k + 2)), 4))
        view.read(env(JobCompleted(job_id=job, allocation_id=f"{job}.1"), 9))
    assert view.all_finished
    assert render(view, 9.0).splitlines()[0] == "gangline demo  9s  jobs finished 3/3"


def test_a_terminal_gets_the_view_redrawn_in_place_a_log_a_plain_table_less_often() -> None:
    text = render(cluster_view(), 3.0)
    on_terminal = frame(text, tty=True)
    assert on_terminal.startswith("\x1b[H\x1b[2J") and on_terminal.endswith(text)
    in_log = frame(text, tty=False)
    assert "\x1b" not in in_log and in_log.startswith(text)
    assert every_s(tty=True) < every_s(tty=False) <= 10


def test_where_to_look_stays_under_the_title() -> None:
    text = render(cluster_view(), 3.0, links="API: http://127.0.0.1:8080")
    assert text.splitlines()[:2] == ["gangline demo  3s  jobs finished 0/3", "API: http://127.0.0.1:8080"]


def test_where_to_look_starts_with_the_dashboard_on_the_apis_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANGLINE_API_PORT", "18080")
    first = where_to_look(ServiceSettings.from_env({})).splitlines()[0]
    assert first.startswith("Dashboard: http://127.0.0.1:18080/dashboard/#token=")


def test_an_unlimited_queue_says_so_where_quota_reports_nothing() -> None:
    view = DemoView(
        started=START, sent={"a": "default"}, fold=ClusterFold(unlimited_queues=frozenset({"default"}))
    )
    view.read(env(node("h100-0", H100, 8), -60))
    spec = request("a")
    view.read(env(JobAdmitted(job_id="a", spec=spec.spec()), 2))  # placed with no job.queued: unlimited
    view.read(env(grant("a", "default", "h100-0", range(2)), 3))
    rows = {r[0]: r for r in section(render(view, 4.0), "QUEUE")}
    assert rows["default"][1:] == ["0", "1", "0", "2", "unlimited", "-"]
