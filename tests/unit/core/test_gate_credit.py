"""The quota gate's backfill (gangline.core.gate_credit): what is charged to a job placement cannot place
yet is lent to short held jobs, in fair order, never to one without a known end, and never more than
the unplaced charges stand for; the ledger's charges do not move."""

from __future__ import annotations

from dataclasses import replace

from gangline.core.charging import QuotaCharges
from gangline.core.fairshare import FairShare, Pending
from gangline.core.gate_credit import CreditPolicy, credit_left, lend
from gangline.core.model import Job, JobId, QueueName, Seconds
from gangline.core.queues import CohortName, QueueSpec, QuotaTree, Resource, ResourceQuota
from gangline.core.quota_gate import Flavour

GPU = Resource("H100")
A, B = QueueName("team-a"), QueueName("team-b")


def flavours(job: Job) -> list[Flavour]:
    return [Flavour("H100", {GPU: job.workers * job.gpus_per_worker})]


def charges(window_s: float | None) -> QuotaCharges[Job]:
    lab = CohortName("lab")
    tree = QuotaTree([QueueSpec(A, {GPU: ResourceQuota(8)}, lab), QueueSpec(B, {GPU: ResourceQuota(8)}, lab)])
    credit = CreditPolicy(window_s) if window_s is not None else None
    return QuotaCharges(
        tree, lambda j: (flavours(j), ()), half_life_s=0.0, credit=credit, run_bound=lambda j: j.run_bound_s
    )


def arrive(c: QuotaCharges[Job], j: Job, admitted: float, at: float) -> Flavour | None:
    return c.arrive(Pending(j.queue, j.priority, admitted, j.id, j), at)


def job(name: str, queue: QueueName, gpus: int, workers: int = 1, hint: int | None = None) -> Job:
    j = Job(id=JobId(name), queue=queue, workers=workers, gpus_per_worker=gpus)
    return replace(j, duration_hint_s=Seconds(hint)) if hint is not None else j


def blocked_gang(c: QuotaCharges[Job]) -> None:
    """A 16-GPU gang takes the whole cohort's quota and placement cannot place it (nodes are busy)."""
    assert arrive(c, job("gang", A, 8, workers=2), 0.0, at=0.0) is not None


def test_without_credit_a_short_job_waits_behind_the_unplaced_gangs_charge() -> None:
    c = charges(None)
    blocked_gang(c)
    assert arrive(c, job("short", B, 2, hint=600), 1.0, at=1.0) is None
    assert c.lend(at=2.0) == []


def test_a_short_job_goes_through_on_the_unplaced_charge_and_the_ledger_stays() -> None:
    c = charges(3600.0)
    blocked_gang(c)
    assert arrive(c, job("short", B, 2, hint=600), 1.0, at=1.0) is None  # the gate itself still holds it
    assert [j.id for j, _ in c.lend(at=2.0)] == ["short"]
    assert c.ledger.usage(A, GPU) == 16 and c.ledger.usage(B, GPU) == 0  # charges did not move
    assert JobId("short") in c.lent
    # Its release gives the credit back (and says which tree to look at again).
    assert c.release(JobId("short"), at=700.0) == "lab"
    assert c.lent == {}


def test_no_credit_for_a_job_without_a_known_end_or_longer_than_the_window() -> None:
    c = charges(3600.0)
    blocked_gang(c)
    arrive(c, job("unknown", B, 1), 1.0, at=1.0)
    arrive(c, job("long", B, 1, hint=7200), 2.0, at=2.0)
    assert c.lend(at=3.0) == []


def test_credit_is_what_unplaced_charges_stand_for_less_what_is_lent() -> None:
    c = charges(3600.0)
    blocked_gang(c)
    for k in range(5):
        arrive(c, job(f"s{k}", B, 4, hint=600), float(k + 1), at=float(k + 1))
    assert [j.id for j, _ in c.lend(at=10.0)] == ["s0", "s1", "s2", "s3"]  # 16 GPUs of credit
    assert c.lend(at=11.0) == []  # all lent
    c.release(JobId("s0"), at=600.0)
    assert [j.id for j, _ in c.lend(at=601.0)] == ["s4"]


def test_once_the_gang_is_placed_its_charge_is_lent_no_more() -> None:
    c = charges(3600.0)
    blocked_gang(c)
    c.placed(JobId("gang"))
    arrive(c, job("short", B, 2, hint=600), 1.0, at=1.0)
    assert c.lend(at=2.0) == []


def test_credit_goes_in_fair_order() -> None:
    credit = credit_left([{GPU: 8}], [{GPU: 2}])
    assert credit == {GPU: 6}
    fair = FairShare(capacity={GPU: 16}, weights={A: 1.0, B: 1.0}, allocation={A: {GPU: 8}})
    held = [
        Pending(A, 0, 0.0, "a1", job("a1", A, 4, hint=60)),
        Pending(B, 0, 5.0, "b1", job("b1", B, 4, hint=60)),
    ]
    # team-a already holds half the cohort: team-b's later job has the lower share and goes first.
    out = lend(held, credit, fair, flavours, CreditPolicy(3600.0), run_bound=lambda j: j.run_bound_s)
    assert [j.id for j, _ in out] == ["b1"]
