"""Which held jobs preemption plans for (`held_to_plan`), and the line placement keeps (`waiting_line`)."""

from __future__ import annotations

from scenarios.dsl import build_snapshot, gpus, held, job

from gangline.core.actions.preempt import HeldJob, held_to_plan, lowest_preemptible_priority
from gangline.core.model import GpuModel, JobId
from gangline.core.waiting import waiting_line


def test_the_lowest_preemptible_priority_per_queue_ignores_work_that_cannot_be_preempted() -> None:
    snap = build_snapshot(
        {"n0": gpus(8, model="H100")},
        [
            held(job("a-low", 2, queue="a", priority=1, preemptible=True), {"n0": 2}),
            held(job("a-fixed", 2, queue="a", priority=0), {"n0": 2}),
        ],
    )
    assert lowest_preemptible_priority(snap) == {"a": 1}


def test_owed_jobs_first_then_those_outranking_preemptible_work_of_their_queue_only() -> None:
    snap = build_snapshot(
        {"n0": gpus(8, model="H100")},
        [
            held(job("a-low", 2, queue="a", priority=1, preemptible=True), {"n0": 2}),
            held(job("b-high", 2, queue="b", priority=5, preemptible=True), {"n0": 2}),
        ],
    )
    waiting = [
        HeldJob(job("a-urgent", queue="a", priority=3), None, owed=False, admitted_at=5.0),
        HeldJob(job("a-peer", queue="a", priority=1), None, owed=False, admitted_at=1.0),  # outranks nothing
        HeldJob(job("b-owed", queue="b", priority=0), GpuModel("H100"), owed=True, admitted_at=9.0),
        HeldJob(job("c-alone", queue="c", priority=9), None, owed=False, admitted_at=0.0),  # nothing to take
        HeldJob(job("a-urgent-2", queue="a", priority=3), None, owed=False, admitted_at=2.0),
    ]

    planned = held_to_plan(waiting, snap)

    assert [j.id for j in planned] == ["b-owed", "a-urgent-2", "a-urgent"]
    assert planned[0].gpu_type == "H100"  # on the model quota would charge it to
    assert [j.id for j in held_to_plan(waiting, snap, limit=1)] == ["b-owed"]


def test_a_job_naming_its_model_keeps_it() -> None:
    named = HeldJob(job("x", gpu_type="A100", queue="a"), GpuModel("H100"), owed=True, admitted_at=0.0)
    assert named.on_model().gpu_type == "A100"


def test_the_line_is_priority_then_admitted_time_then_job_id_with_unknown_admission_last() -> None:
    jobs = [job("late", priority=1), job("b"), job("a"), job("early"), job("unknown")]
    admitted = {JobId("late"): 9.0, JobId("b"): 1.0, JobId("a"): 1.0, JobId("early"): 0.5}
    assert [j.id for j in waiting_line(jobs, admitted)] == ["late", "early", "a", "b", "unknown"]
