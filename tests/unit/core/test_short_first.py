"""Shortest first among jobs submitted together (``settings.short_first_weight``): in placement's line
and order a job stands as if submitted its weight times its run bound later (`waiting.line_time`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from gangline.core.actions.queueing import fair_order, open_context, placement_cycle
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.profile import Profile, load_profile
from gangline.core.model import (
    DomainId,
    Gpu,
    GpuId,
    GpuModel,
    Job,
    JobId,
    MiB,
    Node,
    NodeId,
    QueueName,
    Seconds,
)
from gangline.core.snapshot import Snapshot
from gangline.core.waiting import line_time, waiting_line

Q = QueueName("team")


def node(name: str) -> Node:
    gpus = tuple(
        Gpu(id=GpuId(f"{name}/gpu{i}"), index=i, model=GpuModel("H100"), memory_mib=MiB(81_920))
        for i in range(8)
    )
    return Node(id=NodeId(name), gpus=gpus, leaf=DomainId("leaf-a"), spine=DomainId("spine-0"))


def job(name: str, workers: int, gpus: int, hint_s: int | None) -> Job:
    hint = Seconds(hint_s) if hint_s is not None else None
    return Job(id=JobId(name), queue=Q, workers=workers, gpus_per_worker=gpus, duration_hint_s=hint)


def profile(weight: float | None) -> Profile:
    base = default_profile()
    return replace(base, settings=replace(base.settings, short_first_weight=weight))


def placed(nodes: int, jobs: list[Job], admitted: Mapping[str, float], weight: float | None) -> list[str]:
    snap = Snapshot([node(f"n{i}") for i in range(nodes)])
    at = {JobId(k): v for k, v in admitted.items()}
    now = max(at.values())
    plan, _ = placement_cycle(
        snap,
        jobs,
        at,
        profile(weight),
        lambda js: open_context(snap, js, now=now, submit_time=at),
        head=256,
        cycle=1,
    )
    return sorted(p.job.id for p in plan.placed)


def test_the_default_profile_lines_jobs_up_by_their_earliest_end() -> None:
    assert default_profile().settings.short_first_weight == 1.0


def test_of_two_jobs_submitted_together_the_short_one_starts_first() -> None:
    # One node; the hour-long job was submitted half a second before the minute-long one.
    jobs = [job("hour", 1, 8, 3600), job("minute", 1, 8, 60)]
    admitted = {"hour": 0.0, "minute": 0.5}
    assert placed(1, jobs, admitted, None) == ["hour"]
    assert placed(1, jobs, admitted, 1.0) == ["minute"]


def test_a_big_gang_of_short_work_is_not_put_behind_a_small_long_job() -> None:
    # The handicap is the run time, not the size: a 2x8 gang of 10 s goes before a 1-GPU job of 10 min
    # submitted just before it, which would have split the two nodes the gang needs.
    jobs = [job("small-long", 1, 1, 600), job("gang-short", 2, 8, 10)]
    admitted = {"small-long": 0.0, "gang-short": 0.1}
    assert placed(2, jobs, admitted, None) == ["small-long"]
    assert placed(2, jobs, admitted, 1.0) == ["gang-short"]


def test_a_job_that_has_waited_longer_than_the_handicap_stays_ahead() -> None:
    jobs = [job("early", 1, 8, 60), job("later", 1, 8, 1)]
    assert placed(1, jobs, {"early": 0.0, "later": 100.0}, 1.0) == ["early"]


def test_a_job_with_no_run_bound_keeps_its_submit_time() -> None:
    unbounded, hinted = job("unbounded", 1, 8, None), job("hinted", 1, 8, 5)
    assert line_time(unbounded, 7.0, 1.0) == 7.0
    assert line_time(hinted, 7.0, 1.0) == 12.0
    assert line_time(hinted, 7.0, None) == 7.0
    line = waiting_line(
        [hinted, unbounded], {JobId("hinted"): 0.0, JobId("unbounded"): 1.0}, short_first_weight=1.0
    )
    assert [j.id for j in line] == ["unbounded", "hinted"]


def test_a_starving_job_is_served_by_its_submit_time_whatever_its_run_bound() -> None:
    snap = Snapshot([node("n0")])
    jobs = [job("old-long", 1, 8, 10 * 86_400), job("new-short", 1, 8, 1)]
    submitted = {JobId("old-long"): 0.0, JobId("new-short"): 2.0 * 86_400}
    ctx = open_context(snap, jobs, now=2.0 * 86_400, submit_time=submitted)
    order = fair_order(jobs, ctx, snap, short_first_weight=1.0)
    assert [j.id for j in order] == ["new-short", "old-long"]  # ten days of handicap
    order = fair_order(jobs, ctx, snap, starvation_s=86_400.0, short_first_weight=1.0)
    assert [j.id for j in order] == ["old-long", "new-short"]  # waited past the bound: oldest first


@pytest.mark.parametrize("bad", ["-1", "true", "'one'"])
def test_the_weight_must_be_a_non_negative_number(bad: str) -> None:
    text = f"name: p\nactions: [allocate]\nplugins: [gpu-fit]\nsettings: {{short_first_weight: {bad}}}\n"
    with pytest.raises(ValueError, match="short_first_weight"):
        load_profile(text, placement_registry())
