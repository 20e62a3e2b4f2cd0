"""Queueing scenarios, one rule each: quota, borrowing, order, preemption, reclaim, reservation, elastic."""

from __future__ import annotations

from dataclasses import replace

from scenarios.dsl import fabric, gpus, held, job
from scenarios.queue_world import H100, World, queue

from gangline.core.actions.queueing import PreemptionPolicy, RunFacts
from gangline.core.fairshare import UsageHistory
from gangline.core.framework.status import StatusCode
from gangline.core.model import Job, JobId, Seconds
from gangline.core.queues import QueueName, gpu_resource


def hinted(j: Job, seconds: int) -> Job:
    return replace(j, duration_hint_s=Seconds(seconds))


def two_nodes() -> dict[str, object]:
    return {"n0": gpus(8), "n1": gpus(8)}


# ---- 1. queues and quota ----


def test_job_runs_within_its_queue_quota() -> None:
    w = World(nodes={"n0": gpus(8)}, queues=[queue("a", H100=8)])
    w.cycle([job("j1", gpus=8, queue="a")]).expect(placed=["j1"])


def test_job_over_quota_waits_with_the_quota_sentence() -> None:
    w = World(
        nodes={"n0": gpus(8), "n1": gpus(8)},
        queues=[queue("a", H100=8, cohort="lab"), queue("b", H100=8, cohort="lab")],
        running=[
            held(job("a-run", gpus=8, queue="a"), {"n0": 8}),
            held(job("b-run", gpus=8, queue="b"), {"n1": 8}),
        ],
    )
    out = w.cycle([job("j1", gpus=8, queue="a")]).expect(pending=["j1"])
    assert "a uses 8 of its 8 H100-80GB; cohort has 0 to lend; needs 8" in out.reasons("j1")


def test_queue_borrows_idle_quota_of_its_cohort() -> None:
    w = World(nodes=two_nodes(), queues=[queue("a", H100=8, cohort="lab"), queue("b", H100=8, cohort="lab")])
    w.cycle([job("j1", gpus=8, workers=2, queue="a")]).expect(placed=["j1"])


def test_borrowing_limit_stops_a_queue_from_taking_the_whole_cohort() -> None:
    w = World(
        nodes=two_nodes(),
        queues=[queue("a", H100=8, cohort="lab", borrowing_limit=4), queue("b", H100=8, cohort="lab")],
    )
    out = w.cycle([job("j1", gpus=8, workers=2, queue="a")]).expect(pending=["j1"])
    assert any("borrowing limit" in r for r in out.reasons("j1"))


def test_queue_without_cohort_cannot_borrow() -> None:
    w = World(nodes=two_nodes(), queues=[queue("a", H100=8), queue("b", H100=8)])
    w.cycle([job("j1", gpus=8, workers=2, queue="a")]).expect(pending=["j1"])


# ---- 2. ordering ----


def test_priority_first_then_fair_share_then_submit_time() -> None:
    w = World(
        nodes={"n0": gpus(8)},
        queues=[queue("a", H100=8, cohort="lab"), queue("b", H100=8, cohort="lab")],
        history=UsageHistory(as_of=0.0, decayed={QueueName("a"): {gpu_resource(H100): 8.0}}),
    )
    jobs = [
        job("a-old", gpus=8, queue="a"),
        job("b-new", gpus=8, queue="b"),
        job("a-urgent", gpus=8, queue="a", priority=5),
    ]
    # Priority wins over everything.
    w.cycle(jobs, submit={"a-old": 0, "b-new": 10, "a-urgent": 20}).expect(placed=["a-urgent"])
    # Without it, b's lower (decayed) usage wins over a's earlier submit time.
    w.cycle(jobs[:2], submit={"a-old": 0, "b-new": 10}).expect(placed=["b-new"], pending=["a-old"])
    # With equal shares, submit time decides.
    w2 = World(nodes={"n0": gpus(8)}, queues=w.queues)
    w2.cycle(jobs[:2], submit={"a-old": 0, "b-new": 10}).expect(placed=["a-old"], pending=["b-new"])


def test_weights_scale_the_fair_share() -> None:
    qs = [queue("a", H100=8, cohort="lab", weight=4.0), queue("b", H100=8, cohort="lab")]
    hist = UsageHistory(
        as_of=0.0,
        decayed={QueueName("a"): {gpu_resource(H100): 8.0}, QueueName("b"): {gpu_resource(H100): 4.0}},
    )
    w = World(nodes={"n0": gpus(8)}, queues=qs, history=hist)
    # a used twice as much as b but is weighted 4x: its share is lower, so it goes first.
    w.cycle([job("b1", gpus=8, queue="b"), job("a1", gpus=8, queue="a")]).expect(placed=["a1"])


# ---- 3. preemption ----


def test_higher_priority_preempts_the_cheapest_lower_priority_job_of_its_queue() -> None:
    low_old = job("low-old", gpus=8, queue="a", preemptible=True)
    low_new = job("low-new", gpus=8, queue="a", preemptible=True)
    w = World(
        nodes=two_nodes(),
        queues=[queue("a", H100=16)],
        running=[held(low_old, {"n0": 8}), held(low_new, {"n1": 8})],
        facts={"low-old": RunFacts(0.0, last_checkpoint_at=0.0), "low-new": RunFacts(3000.0)},
        now=3600.0,
    )
    out = w.cycle([job("urgent", gpus=8, queue="a", priority=10)])
    plan = out.preemption("urgent")
    assert [v.job_id for v in plan.victims] == ["low-new"]  # 1/6 h lost x 8 GPUs, not 1 h x 8
    assert plan.victims[0].lost_gpu_hours == round(8 * 600 / 3600, 6)
    assert plan.victims[0].checkpoint_deadline == 3600.0 + 30.0
    assert {p.node for p in plan.reservation} == {"n1"}
    assert out.evicted == {"low-new"}
    assert out.plan.pending_job(JobId("urgent")).code is StatusCode.WAIT  # type: ignore[union-attr]


def test_non_preemptible_equal_priority_and_too_young_jobs_are_never_victims() -> None:
    w = World(
        nodes=two_nodes(),
        queues=[queue("a", H100=16)],
        running=[
            held(job("pinned", gpus=8, queue="a"), {"n0": 8}),
            held(job("young", gpus=8, queue="a", preemptible=True), {"n1": 8}),
        ],
        facts={"young": RunFacts(3500.0)},
        now=3600.0,
        policy=PreemptionPolicy(min_runtime_s=600.0),
    )
    out = w.cycle([job("urgent", gpus=8, queue="a", priority=10)])
    assert out.decisions.preemptions == [] and out.evicted == set()
    w2 = replace(
        w, running=[held(job("peer", gpus=8, workers=2, queue="a", preemptible=True), {"n0": 8, "n1": 8})]
    )
    assert w2.cycle([job("urgent", gpus=8, queue="a")]).decisions.preemptions == []


def test_preemption_frees_a_placement_that_fits_the_gang_topology() -> None:
    # The cheapest victims are spread over two leaves; the gang needs one leaf, so the plan
    # must take the (dearer) jobs that free a whole leaf.
    nodes = {f"a{k}": gpus(8, leaf="A") for k in range(2)} | {f"b{k}": gpus(8, leaf="B") for k in range(2)}
    running = [
        held(job("cheap-a", gpus=8, queue="q", preemptible=True), {"a0": 8}),
        held(job("cheap-b", gpus=8, queue="q", preemptible=True), {"b0": 8}),
        held(job("dear-a", gpus=8, queue="q", preemptible=True), {"a1": 8}),
        held(job("pinned-b", gpus=8, queue="q"), {"b1": 8}),
    ]
    facts = {"cheap-a": RunFacts(3000.0), "cheap-b": RunFacts(3000.0), "dear-a": RunFacts(0.0)}
    w = World(nodes=nodes, queues=[queue("q", H100=64)], running=running, facts=facts, now=3600.0)
    out = w.cycle([job("gang", gpus=8, workers=2, topology="leaf", queue="q", priority=5)])
    plan = out.preemption("gang")
    assert {v.job_id for v in plan.victims} == {"cheap-a", "dear-a"}
    assert {p.node for p in plan.reservation} == {"a0", "a1"}


def test_never_more_victims_than_needed() -> None:
    nodes = {"n0": gpus(8)}
    running = [held(job(f"v{k}", gpus=2, queue="q", preemptible=True), {"n0": 2}) for k in range(4)]
    facts = {f"v{k}": RunFacts(float(k * 100)) for k in range(4)}
    w = World(nodes=nodes, queues=[queue("q", H100=8)], running=running, facts=facts, now=1000.0)
    plan = w.cycle([job("need4", gpus=4, queue="q", priority=1)]).preemption("need4")
    # The two most recently started (least work lost) go; no third.
    assert sorted(v.job_id for v in plan.victims) == ["v2", "v3"]


# ---- 3b. reclaim ----


def test_queue_below_nominal_reclaims_gpus_lent_to_a_borrower() -> None:
    w = World(
        nodes=two_nodes(),
        queues=[queue("a", H100=8, cohort="lab"), queue("b", H100=8, cohort="lab")],
        running=[
            held(job("b-own", gpus=8, queue="b", preemptible=True), {"n0": 8}),
            held(job("b-borrowed", gpus=8, queue="b", preemptible=True), {"n1": 8}),
        ],
        facts={"b-own": RunFacts(1000.0), "b-borrowed": RunFacts(0.0)},
        now=3600.0,
    )
    out = w.cycle([job("a1", gpus=8, queue="a")])
    plan = out.preemption("a1")
    assert plan.kind == "reclaim"
    # b-own is the cheaper victim, but taking one job is enough and b keeps its nominal 8 either way;
    # the cheaper one goes.
    assert len(plan.victims) == 1
    assert "borrows" in plan.victims[0].reason


def test_reclaim_never_takes_a_queue_below_its_nominal_quota() -> None:
    w = World(
        nodes=two_nodes(),
        queues=[
            queue("a", H100=8, cohort="lab"),
            queue("b", H100=8, cohort="lab"),
            queue("c", H100=0, cohort="lab"),
        ],
        running=[
            held(job("b-own", gpus=8, queue="b", preemptible=True), {"n0": 8}),
            held(job("a-busy", gpus=8, queue="a"), {"n1": 8}),
        ],
        now=3600.0,
    )
    # c has no nominal quota: it is owed nothing, so it reclaims nothing; and b is within its quota.
    out = w.cycle([job("c1", gpus=8, queue="c")])
    assert out.decisions.preemptions == []


def test_no_team_keeps_all_gpus_while_another_with_unused_quota_waits() -> None:
    # The research lab's rule: b borrowed everything while a was idle; a's job arrives.
    w = World(
        nodes={f"n{k}": gpus(8) for k in range(4)},
        queues=[queue("a", H100=16, cohort="lab"), queue("b", H100=16, cohort="lab")],
        running=[held(job(f"b{k}", gpus=8, queue="b", preemptible=True), {f"n{k}": 8}) for k in range(4)],
        now=100.0,
    )
    out = w.cycle([job("a-big", gpus=8, workers=2, queue="a")])
    plan = out.preemption("a-big")
    assert len(plan.victims) == 2 and all(v.queue == "b" for v in plan.victims)


# ---- 4. reservation and backfill ----


def test_blocked_gang_reserves_gpus_and_only_short_or_preemptible_jobs_backfill_them() -> None:
    nodes = {f"n{k}": gpus(8) for k in range(4)}
    running = [
        held(job("r0", gpus=8, queue="q"), {"n0": 8}),
        held(job("r1", gpus=8, queue="q"), {"n1": 8}),
        held(job("r2", gpus=8, queue="q"), {"n2": 8}),
    ]
    facts = {
        "r0": RunFacts(0.0, expected_end=1000.0),
        "r1": RunFacts(0.0, expected_end=5000.0),
        "r2": RunFacts(0.0),
    }
    w = World(nodes=nodes, queues=[queue("q", H100=64)], running=running, facts=facts, now=100.0)
    jobs = [
        job("gang", gpus=8, workers=2, queue="q"),
        hinted(job("long", gpus=4, queue="q"), 5000),
        hinted(job("short", gpus=4, queue="q"), 500),
        job("spot", gpus=4, queue="q", preemptible=True),
    ]
    out = w.cycle(jobs)
    [res] = out.decisions.reservations
    assert res.job_id == "gang" and res.start == 1000.0
    assert {p.node for p in res.placements} == {"n0", "n3"}
    out.expect(placed=["short", "spot"], pending=["gang", "long"])
    short = out.plan.placed_job(JobId("short"))
    assert short is not None and {p.node for p in short.allocation.placements} == {"n3"}
    assert any("waiting for reservation at t=1000" in r for r in out.reasons("gang"))
    assert any("reserved for gang from t=1000" in r for r in out.reasons("long"))


def test_due_reservation_preempts_preemptible_backfill() -> None:
    nodes = {"n0": gpus(8), "n1": gpus(8)}
    running = [
        held(job("spot0", gpus=8, queue="q", preemptible=True), {"n0": 8}),
        held(job("spot1", gpus=8, queue="q", preemptible=True), {"n1": 8}),
    ]
    w = World(nodes=nodes, queues=[queue("q", H100=32)], running=running, now=10.0)
    out = w.cycle([job("gang", gpus=8, workers=2, queue="q", priority=1)])
    plan = out.preemption("gang")
    assert plan.kind == "reserve" and {v.job_id for v in plan.victims} == {"spot0", "spot1"}


# ---- 5. elastic ----


def test_elastic_job_shrinks_toward_min_when_another_waits() -> None:
    elastic = job("el", gpus=8, workers=4, min_workers=1, queue="q", preemptible=True)
    w = World(
        nodes={f"n{k}": gpus(8) for k in range(4)},
        queues=[queue("q", H100=32)],
        running=[held(elastic, {f"n{k}": 8 for k in range(4)})],
        now=10.0,
    )
    out = w.cycle([job("other", gpus=8, workers=2, queue="q", priority=1)])
    plan = out.preemption("other")
    assert plan.kind == "shrink"
    [resize] = out.decisions.resizes
    # It gives up the 2 nodes the waiting job needs, not 3: its first 2 ranks keep running.
    assert resize.job_id == "el" and resize.from_workers == 4 and resize.to_workers == 2
    assert len(plan.reservation) == 2 and not {"n0", "n1"} & {p.node for p in plan.reservation}


def test_elastic_job_grows_on_idle_gpus_when_nothing_waits() -> None:
    elastic = job("el", gpus=8, workers=4, min_workers=1, queue="q")
    w = World(
        nodes={f"n{k}": gpus(8) for k in range(3)},
        queues=[queue("q", H100=32)],
        running=[held(elastic, {"n0": 8})],
    )
    out = w.cycle([])
    [resize] = out.decisions.resizes
    assert (resize.from_workers, resize.to_workers) == (1, 3)


def test_elastic_growth_stays_within_quota() -> None:
    elastic = job("el", gpus=8, workers=4, min_workers=1, queue="q")
    w = World(
        nodes={f"n{k}": gpus(8) for k in range(3)},
        queues=[queue("q", H100=16)],
        running=[held(elastic, {"n0": 8})],
    )
    [resize] = w.cycle([]).decisions.resizes
    assert resize.to_workers == 2


# ---- 6. explanations ----


def test_fabric_helper_builds_a_world() -> None:
    w = World(nodes=fabric(nodes_per_leaf=2), queues=[queue("q", H100=16)])
    w.cycle([job("j", gpus=8, workers=2, queue="q")]).expect(placed=["j"])


def test_pending_job_is_told_its_quota_fair_share_and_place_in_line() -> None:
    w = World(
        nodes={"n0": gpus(8)},
        queues=[queue("a", H100=8, cohort="lab"), queue("b", H100=8, cohort="lab")],
        running=[held(job("b-run", gpus=8, queue="b"), {"n0": 8})],
    )
    out = w.cycle([job("a-hi", gpus=8, queue="a", priority=2), job("a-lo", gpus=8, queue="a")])
    lines = out.reasons("a-lo")
    assert "priority 0: 2 of 2 waiting in line; 1 ahead have higher priority" in lines
    quota_line = next(x for x in lines if x.startswith("a uses"))
    assert quota_line.startswith("a uses 0 of its 8 H100-80GB; cohort has 0 to lend; a fair share 0.000")
    assert "position 1 of 2 queues" in quota_line
