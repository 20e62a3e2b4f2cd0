"""The charge point (gangline.core.charging): a job is charged when the gate lets it through, placed or
not, and keeps the charge until its release; held jobs go through in fair order when usage drops."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gangline.core.charging import QuotaCharges
from gangline.core.fairshare import Pending
from gangline.core.framework.status import Reason
from gangline.core.model import Job, JobId, QueueName
from gangline.core.queues import CohortName, QueueSpec, QuotaTree, Resource, ResourceQuota
from gangline.core.quota_gate import Flavour, let_through

GPU = Resource("H100")
A, B = QueueName("team-a"), QueueName("team-b")


def charges(half_life_s: float = 0.0) -> QuotaCharges[Job]:
    lab = CohortName("lab")
    tree = QuotaTree([QueueSpec(A, {GPU: ResourceQuota(8)}, lab), QueueSpec(B, {GPU: ResourceQuota(8)}, lab)])
    return QuotaCharges(
        tree,
        lambda job: ([Flavour("H100", {GPU: job.workers * job.gpus_per_worker})], ()),
        half_life_s=half_life_s,
    )


def arrive(c: QuotaCharges[Job], j: Job, admitted: float, at: float) -> Flavour | None:
    return c.arrive(Pending(j.queue, j.priority, admitted, j.id, j), at)


def job(name: str, queue: QueueName, gpus: int, workers: int = 1) -> Job:
    return Job(id=JobId(name), queue=queue, workers=workers, gpus_per_worker=gpus)


def test_a_job_let_through_holds_its_quota_until_released_placed_or_not() -> None:
    c = charges()
    gang = job("gang", A, 8, workers=2)  # 16: all of team-a's 8 and team-b's idle 8
    assert arrive(c, gang, 0.0, at=0.0) == Flavour("H100", {GPU: 16})
    assert c.ledger.usage(A, GPU) == 16
    small = job("small", B, 1)
    assert arrive(c, small, 1.0, at=1.0) is None  # nothing placed yet, and still nothing left to charge
    assert c.let_through("lab", at=2.0) == []
    assert c.release(JobId("gang"), at=3.0) == "lab"
    assert [j.id for j, _ in c.let_through("lab", at=3.0)] == ["small"]
    assert c.ledger.usage(B, GPU) == 1 and c.ledger.usage(A, GPU) == 0


def test_held_jobs_go_through_in_fair_order_when_usage_drops() -> None:
    c = charges()
    big = job("big", A, 8, workers=2)
    assert arrive(c, big, 0.0, at=0.0) is not None
    a2, b1 = job("a2", A, 4), job("b1", B, 4)
    assert arrive(c, a2, 1.0, at=1.0) is None
    assert arrive(c, b1, 2.0, at=2.0) is None
    c.release(JobId("big"), at=5.0)
    # Same priority, both shares 0: the earlier admitted first; then team-b's share is the lower one.
    through = [j.id for j, _ in c.let_through("lab", at=5.0)]
    assert through == ["a2", "b1"]
    assert c.release(JobId("nobody"), at=6.0) is None


def order_after_a_hog(half_life_s: float) -> list[str]:
    c = charges(half_life_s)
    assert arrive(c, job("hog", A, 8, workers=2), 0.0, at=0.0) is not None  # the whole cohort, 2 h
    assert arrive(c, job("a", A, 8), 100.0, at=100.0) is None
    assert arrive(c, job("b", B, 8), 200.0, at=200.0) is None
    c.release(JobId("hog"), at=7200.0)
    return [j.id for j, _ in c.let_through("lab", at=7200.0)]


def test_past_usage_decays_into_the_fair_order() -> None:
    # Nothing charged when they go through: without a history the earlier admitted goes first; with
    # one, team-a's two hours of the whole cohort put team-b's job ahead.
    assert order_after_a_hog(0.0) == ["a", "b"]
    assert order_after_a_hog(3600.0) == ["b", "a"]


ops = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "release", "let_through"]), st.sampled_from([A, B]), st.integers(1, 8)
    ),
    min_size=1,
    max_size=60,
)


SECOND_PASS = [("arrive", A, 8)] * 3 + [("release", A, 1), ("let_through", A, 1)]
"""The whole cohort charged, a third job held, let through on a release; then the same again (a job let
through in the first pass must not be in the lines of the second)."""


@settings(max_examples=200, deadline=None)
@example(ops=[*SECOND_PASS, ("arrive", A, 8), ("release", A, 1), ("let_through", A, 1)], half_life_s=0.0)
@given(ops=ops, half_life_s=st.sampled_from([0.0, 600.0]))
def test_the_kept_lines_let_through_what_a_pass_over_every_held_job_does(
    ops: list[tuple[str, QueueName, int]], half_life_s: float
) -> None:
    # The held jobs stay in sorted lines between passes; the gate over a fresh list of them each time
    # (what the core's simulator ran before) decides the same jobs, in the same order.
    c = charges(half_life_s)
    held: dict[str, Pending[Job]] = {}
    running: list[JobId] = []
    for k, (kind, queue, gpus) in enumerate(ops):
        at = float(k)
        if kind == "arrive":
            j = job(f"j{k}", queue, gpus)
            p = Pending(j.queue, j.priority, at, j.id, j)
            if c.arrive(p, at) is None:
                held[j.id] = p
            else:
                running.append(j.id)
        elif kind == "release" and running:
            c.release(running.pop(gpus % len(running)), at)
        elif kind == "let_through":
            fresh = let_through(
                list(held.values()), c.ledger.copy(), c.fair_share("lab", at), c.tree, lambda j: c_options(j)
            )
            through = c.let_through("lab", at)
            assert [(j.id, f) for j, f in through] == [(j.id, f) for j, f in fresh.admitted]
            for j, _ in through:
                del held[j.id]
                running.append(j.id)


def c_options(j: Job) -> tuple[list[Flavour], list[Reason]]:
    return [Flavour("H100", {GPU: j.workers * j.gpus_per_worker})], []
