"""The gate's reservation for a starving job (``settings.gate_reserve``): quota is held for the oldest job
past the starvation bound that the gate holds, and later jobs go only if they end before its expected
start or leave it enough then (EASY backfill on quota)."""

from __future__ import annotations

from gangline.core.charging import QuotaCharges
from gangline.core.fairshare import Pending
from gangline.core.model import Job, JobId, QueueName, Seconds
from gangline.core.queues import QueueSpec, QuotaTree, Resource, ResourceQuota
from gangline.core.quota_gate import Flavour

GPU = Resource("H100")
TEAM = QueueName("team")
DAY = 86_400.0


def job(name: str, gpus: int, hint_s: float) -> Job:
    return Job(
        id=JobId(name), queue=TEAM, workers=1, gpus_per_worker=gpus, duration_hint_s=Seconds(int(hint_s))
    )


class Gate:
    """One queue of 16 GPUs; charged jobs end at their start plus their hint, as placed at once."""

    def __init__(self, *, reserve: bool) -> None:
        self.started: dict[JobId, float] = {}
        self.hints: dict[JobId, float] = {}
        self.charges: QuotaCharges[Job] = QuotaCharges(
            QuotaTree([QueueSpec(TEAM, {GPU: ResourceQuota(16)})]),
            lambda j: ([Flavour("H100", {GPU: j.gpus_per_worker})], ()),
            half_life_s=0.0,
            starvation_s=DAY,
            run_bound=lambda j: j.run_bound_s,
            expected_release=self.expected_release if reserve else None,
        )

    def expected_release(self, job_id: JobId, at: float) -> float | None:
        at = self.started.get(job_id)
        return None if at is None else at + self.hints[job_id]

    def arrive(self, j: Job, submitted: float, at: float) -> list[str]:
        p = Pending(j.queue, j.priority, submitted, j.id, j)
        self.hints[j.id] = float(j.duration_hint_s or 0)
        if self.charges.reserves(TEAM, at):
            went = [x for x, _ in self.charges.arrive_in_turn(p, at)]
        else:
            went = [j] if self.charges.arrive(p, at) is not None else []
        for x in went:
            self.started[x.id] = at
        return [x.id for x in went]

    def release(self, job_id: str, at: float) -> list[str]:
        self.charges.release(JobId(job_id), at)
        went = [x for x, _ in self.charges.let_through(TEAM, at)]
        for x in went:
            self.started[x.id] = at
        return [x.id for x in went]


def story(reserve: bool) -> tuple[Gate, list[str]]:
    """Two 8-GPU jobs run (one ends at day 2, the other at day 3); a 16-GPU gang has waited past the
    one-day bound, and a newer 8-GPU job that runs a day and a half waits too; the first run ends."""
    g = Gate(reserve=reserve)
    assert g.arrive(job("r1", 8, 2 * DAY), 0.0, at=0.0) == ["r1"]
    assert g.arrive(job("r2", 8, 3 * DAY), 0.0, at=0.0) == ["r2"]
    assert g.arrive(job("big", 16, DAY), 10.0, at=10.0) == []
    assert g.arrive(job("small", 8, 1.5 * DAY), 1.5 * DAY, at=1.5 * DAY) == []
    return g, g.release("r1", at=2 * DAY)


def test_without_the_reservation_a_smaller_job_takes_the_quota_the_starving_gang_waits_for() -> None:
    _, went = story(reserve=False)
    assert went == ["small"]  # the gang needs 16 at once: it never fits while 8-GPU jobs take turns


def test_the_starving_gangs_quota_is_held_from_a_job_that_would_not_end_before_its_start() -> None:
    g, went = story(reserve=True)
    assert went == []  # "small" would run until day 3.5, past the gang's start at day 3 (r2's end)
    gate = g.charges.gate(TEAM, 2 * DAY, explain=None)
    why = dict((j.id, r) for j, r in gate.held)
    assert why[JobId("small")].constraint == "reservation"
    assert "big" in why[JobId("small")].message
    assert g.release("r2", at=3 * DAY) == ["big"]  # the gang goes at its start


def test_a_job_that_ends_before_the_reserved_start_still_goes() -> None:
    g, _ = story(reserve=True)
    assert g.arrive(job("quick", 8, 0.5 * DAY), 2 * DAY, at=2 * DAY) == ["quick"]  # ends at day 2.5


def test_an_arrival_does_not_take_the_reserved_quota() -> None:
    g, _ = story(reserve=True)
    assert g.arrive(job("late", 8, 1.5 * DAY), 2 * DAY, at=2 * DAY) == []  # fits now, would delay "big"


def test_nothing_is_reserved_for_a_job_not_past_the_bound() -> None:
    g = Gate(reserve=True)
    assert g.arrive(job("r1", 8, 2 * DAY), 0.0, at=0.0) == ["r1"]
    assert g.arrive(job("r2", 8, 3 * DAY), 0.0, at=0.0) == ["r2"]
    assert g.arrive(job("big", 16, DAY), 0.5 * DAY, at=0.5 * DAY) == []
    assert g.arrive(job("small", 8, DAY), 0.6 * DAY, at=0.6 * DAY) == []
    assert g.release("r1", at=DAY) == ["small"]  # "big" has waited half a day: no reservation yet
