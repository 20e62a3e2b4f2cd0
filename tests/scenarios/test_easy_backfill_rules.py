"""EASY backfill from the core's own actions: reserve with ``start_ahead``, allocate, backfill.

The profile is `gangline.sim.policies.EASY_BACKFILL_YAML` (what `easy-backfill` runs in the simulator).
"""

from __future__ import annotations

from dataclasses import replace

from scenarios.dsl import gpus, held, job
from scenarios.queue_world import World, queue

from gangline.core.actions.queueing import RunFacts
from gangline.core.defaults import placement_registry
from gangline.core.framework.profile import load_profile
from gangline.core.model import Job, JobId, Seconds
from gangline.sim.policies import EASY_BACKFILL_YAML


def hinted(j: Job, seconds: int) -> Job:
    return replace(j, duration_hint_s=Seconds(seconds))


def _world(profile_yaml: str) -> World:
    return World(
        nodes={"n0": gpus(8), "n1": gpus(8)},
        queues=[queue("q", H100=64)],
        running=[held(hinted(job("r0", gpus=8, queue="q"), 900), {"n0": 8})],
        facts={"r0": RunFacts(100.0)},
        now=100.0,
        profile=load_profile(profile_yaml, placement_registry()),
    )


def test_jobs_ahead_of_the_head_start_first_and_the_reservation_counts_their_end() -> None:
    # "first" is ahead of the blocked gang and fits on n1 now: it starts; the gang's earliest start
    # is then when both r0 (t=1000) and "first" (started now, ends by t=100+5000) are done.
    w = _world(EASY_BACKFILL_YAML)
    jobs = [
        hinted(job("first", gpus=4, queue="q"), 5000),
        hinted(job("gang", gpus=8, workers=2, queue="q"), 60),
    ]
    out = w.cycle(jobs).expect(placed=["first"], pending=["gang"])
    [res] = out.decisions.reservations
    assert res.job_id == "gang" and res.start == 5100.0
    assert {p.node for p in res.placements} == {"n0", "n1"}


def test_without_start_ahead_the_reservation_is_taken_first_and_the_job_ahead_waits() -> None:
    # The same world under the reserve action's default: the gang reserves n1's free GPUs before
    # allocate runs, so "first", ahead of it in line, cannot start (it would not end by t=1000).
    without = EASY_BACKFILL_YAML.replace(", start_ahead: true", "")
    assert without != EASY_BACKFILL_YAML
    w = _world(without)
    jobs = [
        hinted(job("first", gpus=4, queue="q"), 5000),
        hinted(job("gang", gpus=8, workers=2, queue="q"), 60),
    ]
    out = w.cycle(jobs).expect(pending=["first", "gang"])
    [res] = out.decisions.reservations
    assert res.job_id == "gang" and res.start == 1000.0


def test_after_the_head_only_jobs_that_end_before_its_reservation_use_its_gpus() -> None:
    w = World(
        nodes={"n0": gpus(8), "n1": gpus(8), "n2": gpus(4)},
        queues=[queue("q", H100=64)],
        running=[held(hinted(job("r0", gpus=8, queue="q"), 900), {"n0": 8})],
        facts={"r0": RunFacts(100.0)},
        now=100.0,
        profile=load_profile(EASY_BACKFILL_YAML, placement_registry()),
    )
    jobs = [
        hinted(job("gang", gpus=8, workers=2, queue="q"), 60),
        hinted(job("long", gpus=4, queue="q"), 5000),  # n2 is not reserved: it starts there
        hinted(job("long2", gpus=4, queue="q"), 5000),  # only reserved GPUs left, ends after t=1000
        hinted(job("short", gpus=4, queue="q"), 500),  # ends at t=600, before the reservation
    ]
    out = w.cycle(jobs).expect(placed=["long", "short"], pending=["gang", "long2"])
    [res] = out.decisions.reservations
    assert res.job_id == "gang" and res.start == 1000.0
    long = out.plan.placed_job(JobId("long"))
    assert long is not None and {p.node for p in long.allocation.placements} == {"n2"}
    short = out.plan.placed_job(JobId("short"))
    assert short is not None and {p.node for p in short.allocation.placements} == {"n1"}
    assert any("reserved for gang from t=1000" in r for r in out.reasons("long2"))


def limited(j: Job, seconds: int) -> Job:
    return replace(j, time_limit_s=Seconds(seconds))


def test_a_time_limit_is_the_end_backfill_counts_on_whatever_the_hint_says() -> None:
    # The reservation for the gang starts at t=1000 (r0's end). A job with only a limit of 500 s cannot
    # outlast it and is backfilled; one whose hint is short but whose limit is shorter still is too;
    # one with a short hint and a long limit is planned by its hint; one limited past t=1000 waits.
    w = World(
        nodes={"n0": gpus(8), "n1": gpus(8), "n2": gpus(4)},
        queues=[queue("q", H100=64)],
        running=[held(hinted(job("r0", gpus=8, queue="q"), 900), {"n0": 8})],
        facts={"r0": RunFacts(100.0)},
        now=100.0,
        profile=load_profile(EASY_BACKFILL_YAML, placement_registry()),
    )
    jobs = [
        hinted(job("gang", gpus=8, workers=2, queue="q"), 60),
        hinted(job("filler", gpus=4, queue="q"), 5000),  # takes the unreserved n2
        limited(job("bounded", gpus=2, queue="q"), 500),  # no hint: ends by t=600 at the latest
        limited(hinted(job("cut", gpus=1, queue="q"), 5000), 800),  # the limit stops it by t=900
        limited(hinted(job("hinted", gpus=1, queue="q"), 300), 5000),  # expected to end by t=400
        limited(job("too-long", gpus=1, queue="q"), 1200),  # could run to t=1300: past the reservation
    ]
    out = w.cycle(jobs).expect(placed=["filler", "bounded", "cut", "hinted"], pending=["gang", "too-long"])
    [res] = out.decisions.reservations
    assert res.job_id == "gang" and res.start == 1000.0
    for name in ("bounded", "cut", "hinted"):
        placed = out.plan.placed_job(JobId(name))
        assert placed is not None and {p.node for p in placed.allocation.placements} == {"n1"}
    assert any("reserved for gang from t=1000" in r for r in out.reasons("too-long"))
