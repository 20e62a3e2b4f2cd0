"""The analytics fold (pure): which measures a job's events complete, in any reading order, once each."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from gangline.events import allocations, jobs
from gangline.events.allocations import MigSlice, Placement
from gangline.events.base import Envelope, Event, make_envelope
from services.analytics import figures

T0 = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
SPEC = jobs.JobSpec(queue="team-a", workers=2, gpus_per_worker=4)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def env(data: Event, event_id: str, time: datetime) -> Envelope:
    return make_envelope(data, event_id=event_id, source="test", time=time)


def grant(allocation_id: str, minutes: float, gpu_type: str | None = "H100") -> Envelope:
    placements = tuple(
        Placement(rank=r, node=f"n{r}", gpus=tuple(f"g{i}" for i in range(4))) for r in range(2)
    )
    data = allocations.AllocationGranted(
        job_id="j1", allocation_id=allocation_id, queue="team-a", gpu_type=gpu_type, placements=placements
    )
    return env(data, f"grant-{allocation_id}", at(minutes))


def release(allocation_id: str, minutes: float, reason: allocations.ReleaseReason = "completed") -> Envelope:
    data = allocations.AllocationReleased(job_id="j1", allocation_id=allocation_id, reason=reason)
    return env(data, f"release-{allocation_id}", at(minutes))


def admitted(minutes: float = 0) -> Envelope:
    return env(jobs.JobAdmitted(job_id="j1", spec=SPEC), "admitted", at(minutes))


def completed(allocation_id: str, minutes: float) -> Envelope:
    return env(jobs.JobCompleted(job_id="j1", allocation_id=allocation_id), "completed", at(minutes))


def fold_all(events: list[Envelope]) -> tuple[figures.JobFacts, list[figures.Measure]]:
    facts: figures.JobFacts | None = None
    out: list[figures.Measure] = []
    for e in events:
        facts, measures = figures.fold_job("j1", facts, e)
        facts = figures.JobFacts.from_json(json.loads(json.dumps(facts.to_json())))  # as the table stores it
        out += measures
    assert facts is not None
    return facts, out


def test_hour_pieces_cut_an_interval_at_hour_boundaries_and_keep_its_length() -> None:
    start, end = at(0).timestamp(), at(150).timestamp()  # 10:30 to 13:00
    pieces = figures.hour_pieces(start, end)
    assert [p[0] % figures.HOUR_S for p in pieces] == [0, 0, 0]
    assert sum(seconds for _, seconds in pieces) == pytest.approx(end - start)
    assert pieces[0] == (start - 30 * 60, 30 * 60)
    assert figures.hour_pieces(start, start) == []


def test_a_job_that_ran_yields_its_gpu_seconds_by_hour_its_wait_and_its_final_state() -> None:
    _, measures = fold_all([admitted(0), grant("a1", 10), release("a1", 130), completed("a1", 130)])
    gpu_seconds = [m for m in measures if m.kind == "gpu_seconds"]
    assert sum(m.value for m in gpu_seconds) == pytest.approx(8 * 120 * 60)  # 8 GPUs for 2 hours
    assert sorted({m.at for m in gpu_seconds}) == [m.at for m in gpu_seconds]
    waits = [m for m in measures if m.kind == "wait"]
    assert [m.value for m in waits] == [10 * 60]
    assert [(m.kind, m.state) for m in measures if m.kind == "final"] == [("final", "completed")]
    assert {m.key for m in measures} == {"team-a|H100"}


def test_any_reading_order_of_the_two_topics_yields_the_same_measures() -> None:
    events = [admitted(0), grant("a1", 10), release("a1", 130), completed("a1", 130)]
    expected = {m.id: m for m in fold_all(events)[1]}
    for order in itertools.permutations(events):
        got = {m.id: m for m in fold_all(list(order))[1]}
        assert got == expected, [e.type for e in order]


def test_an_event_read_twice_emits_nothing_the_second_time() -> None:
    events = [admitted(0), grant("a1", 10), release("a1", 130), completed("a1", 130)]
    once = fold_all(events)[1]
    twice = fold_all([e for e in events for _ in range(2)])[1]
    assert sorted(m.id for m in twice) == sorted(m.id for m in once)


def test_a_preempted_job_counts_the_lost_work_and_waits_again_from_its_requeue() -> None:
    preempted = env(
        jobs.JobPreempted(job_id="j1", allocation_id="a1", checkpointed=True, lost_gpu_seconds=960),
        "preempted",
        at(40),
    )
    requeued = env(jobs.JobRequeued(job_id="j1", reason="preempted", attempt=2), "requeued", at(41))
    events = [
        admitted(0),
        grant("a1", 5),
        preempted,
        release("a1", 40, "preempted"),
        requeued,
        grant("a2", 61),
        release("a2", 70),
        completed("a2", 70),
    ]
    _, measures = fold_all(events)
    assert [m.value for m in measures if m.kind == "preemption"] == [960]
    assert sorted(m.value for m in measures if m.kind == "wait") == [5 * 60, 20 * 60]
    held = sum(m.value for m in measures if m.kind == "gpu_seconds")
    assert held == pytest.approx(8 * (35 + 9) * 60)
    # Read with the second grant before the requeue, its wait waits for the requeue to be known.
    early = [e for e in events if e is not requeued]
    early.insert(early.index(completed("a2", 70)) + 1, requeued)
    assert sorted(m.id for m in fold_all(early)[1]) == sorted(m.id for m in measures)


def test_the_gpu_model_is_the_grants_then_the_one_quota_charged_then_any() -> None:
    queued = env(jobs.JobQueued(job_id="j1", queue="team-a", gpu_type="A100"), "queued", at(1))
    _, charged = fold_all([admitted(0), queued, grant("a1", 10, gpu_type=None), release("a1", 20)])
    assert {m.gpu_model for m in charged} == {"A100"}
    _, unnamed = fold_all([admitted(0), grant("a1", 10, gpu_type=None), release("a1", 20)])
    assert {m.gpu_model for m in unnamed} == {figures.ANY_MODEL}


def test_shared_slots_and_mig_slices_count_as_their_part_of_a_gpu() -> None:
    placements = (
        Placement(rank=0, node="n0", gpus=("g0",), gpu_fraction_milli=250),
        Placement(rank=1, node="n0", gpus=("g1",), mig=MigSlice(gpu="g1", profile="3g.40gb")),
        Placement(rank=2, node="n1", gpus=("g0", "g1")),
    )
    granted = allocations.AllocationGranted(job_id="j1", allocation_id="a1", queue="q", placements=placements)
    assert granted.gpu_share == pytest.approx(0.25 + 3 / 7 + 2)


def test_a_rejected_job_counts_in_the_unknown_queue_once() -> None:
    rejected = env(jobs.JobRejected(job_id="j1", code="unknown_queue", reason="no such queue"), "r", at(0))
    _, measures = fold_all([rejected, rejected])
    assert [(m.queue, m.state) for m in measures] == [(figures.UNKNOWN_QUEUE, "rejected")]


def test_percentiles_interpolate_inside_the_bucket_like_histogram_quantile() -> None:
    counts = figures.empty_histogram()
    for _ in range(10):
        counts = figures.add_to_histogram(counts, 90)  # all in (60, 120]
    lower, upper = 60, 120
    got = figures.percentiles(counts, (0.5, 0.9))
    assert got == {"p50": lower + (upper - lower) * 0.5, "p90": pytest.approx(lower + (upper - lower) * 0.9)}
    assert figures.percentiles(figures.empty_histogram()) == {"p50": None, "p90": None, "p99": None}
    beyond = figures.add_to_histogram(figures.empty_histogram(), 10**7)
    assert figures.percentiles(beyond, (0.5,)) == {"p50": figures.WAIT_BUCKETS_S[-2]}


def test_the_figures_module_imports_no_stream_or_io_client() -> None:
    code = "import sys, services.analytics.figures; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    for name in ("faust", "aiokafka", "asyncpg", "prometheus_client"):
        assert f"'{name}'" not in loaded


def test_an_elastic_resize_counts_each_size_for_its_time_and_waits_once() -> None:
    """2 workers x 4 GPUs from minute 1, resized to 1 worker at minute 11 (released resized, the grant
    naming it), preempted at 31, requeued at 32 and granted again at 40 until 50: 8 GPUs x 10 min +
    4 GPUs x 20 min + 8 GPUs x 10 min; a wait per run (the resize is none), the second from the requeue."""
    one = (Placement(rank=0, node="n0", gpus=tuple(f"g{i}" for i in range(4))),)
    resized = allocations.AllocationGranted(
        job_id="j1", allocation_id="a2", queue="team-a", gpu_type="H100", placements=one, resizes="a1"
    )
    requeued = jobs.JobRequeued(job_id="j1", reason="preempted", attempt=2)
    events = [
        admitted(),
        grant("a1", 1),
        release("a1", 11, "resized"),
        env(resized, "grant-a2", at(11)),
        release("a2", 31, "preempted"),
        env(requeued, "requeued", at(32)),
        grant("a3", 40),
        completed("a3", 50),
        release("a3", 50),
    ]
    for order in (events, events[::-1]):
        _, measures = fold_all(order)
        used = sum(m.value for m in measures if m.kind == "gpu_seconds")
        assert used == pytest.approx(8 * 600 + 4 * 1200 + 8 * 600)
        waits = sorted((m.id, m.value) for m in measures if m.kind == "wait")
        assert waits == [("j1/a1/wait", 60.0), ("j1/a3/wait", 480.0)]
