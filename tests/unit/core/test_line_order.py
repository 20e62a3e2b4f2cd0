"""A queue's line order at the quota gate (``settings.line_order``): at one priority, after the jobs past
the starvation bound, the shortest run bound (or least expected work) first instead of submit order."""

from __future__ import annotations

import math

import pytest

from gangline.core.charging import QuotaCharges
from gangline.core.defaults import placement_registry
from gangline.core.fairshare import Pending, job_line_work, line_work
from gangline.core.framework.profile import load_profile
from gangline.core.model import Job, JobId, QueueName, Seconds
from gangline.core.queues import QueueSpec, QuotaTree, Resource, ResourceQuota
from gangline.core.quota_gate import Flavour

GPU = Resource("H100")
TEAM = QueueName("team")
HOUR = 3600.0
DAY = 86_400.0


def job(name: str, gpus: int, hint_s: float | None) -> Job:
    hint = None if hint_s is None else Seconds(int(hint_s))
    return Job(id=JobId(name), queue=TEAM, workers=1, gpus_per_worker=gpus, duration_hint_s=hint)


def test_line_work_is_zero_in_submit_order_the_run_bound_or_gpus_times_it() -> None:
    assert line_work("submit", 8, 3600) == 0.0
    assert line_work("shortest-run", 8, 3600) == 3600.0
    assert line_work("shortest-work", 8, 3600) == 8 * 3600.0
    assert line_work("shortest-run", 8, None) == math.inf  # no hint, no limit: behind the known
    assert job_line_work(job("j", 4, HOUR), "shortest-work") == 4 * HOUR
    with pytest.raises(ValueError, match="line_order"):
        line_work("longest", 1, 1)


def gate_order(line_order: str, starvation_s: float | None = None) -> list[str]:
    """Two held jobs of one queue, the long one submitted first; room for one of them is freed."""
    tree = QuotaTree([QueueSpec(TEAM, {GPU: ResourceQuota(8)})])
    c: QuotaCharges[Job] = QuotaCharges(
        tree,
        lambda j: ([Flavour("H100", {GPU: j.gpus_per_worker})], ()),
        half_life_s=0.0,
        starvation_s=starvation_s,
    )

    def arrive(j: Job, at: float) -> Flavour | None:
        return c.arrive(Pending(j.queue, j.priority, at, j.id, j, job_line_work(j, line_order)), at)

    assert arrive(job("runs", 8, HOUR), 0.0) is not None
    assert arrive(job("long", 8, 20 * HOUR), 10.0) is None
    assert arrive(job("short", 8, HOUR), 20.0) is None
    c.release(JobId("runs"), at=2 * DAY)
    return [j.id for j, _ in c.let_through(TEAM, at=2 * DAY)]


def test_the_gate_lets_the_shorter_job_of_a_queue_through_first() -> None:
    assert gate_order("submit") == ["long"]  # submitted first
    assert gate_order("shortest-run") == ["short"]  # ends 19 hours sooner


def test_a_job_past_the_starvation_bound_still_goes_first_whatever_its_run() -> None:
    assert gate_order("shortest-run", starvation_s=DAY) == ["long"]  # both starve: the oldest
    assert gate_order("shortest-run", starvation_s=3 * DAY) == ["short"]  # neither starves yet


def test_the_profile_reads_line_order_and_refuses_an_unknown_one() -> None:
    base = "name: p\nactions: [allocate]\nplugins: [{name: gpu-fit}]\nsettings: {line_order: %s}\n"
    registry = placement_registry()
    assert load_profile(base % "shortest-work", registry).settings.line_order == "shortest-work"
    plain = "name: p\nactions: [allocate]\nplugins: [{name: gpu-fit}]\n"
    assert load_profile(plain, registry).settings.line_order == "submit"
    with pytest.raises(ValueError, match="line_order"):
        load_profile(base % "longest", registry)
