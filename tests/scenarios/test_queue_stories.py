"""The three product stories, cycle after cycle: fair quotas, a 32-GPU gang, checkpoint-preempt-resume."""

from __future__ import annotations

from dataclasses import replace

from scenarios.dsl import gpus, held, job
from scenarios.queue_world import H100, Story, World, queue

from gangline.core.actions.queueing import RunFacts
from gangline.core.model import Job, JobId, Seconds
from gangline.core.queues import QueueName, gpu_resource


def hinted(j: Job, seconds: int, grace: int = 0) -> Job:
    return replace(j, duration_hint_s=Seconds(seconds), checkpoint_grace_s=Seconds(grace))


def usage(story: Story, q: str) -> int:
    return sum(
        len(g)
        for r in story.snapshot.running.values()
        if r.job.queue == q
        for g in (p.gpus for p in r.allocation.placements)
    )


def test_fair_quotas_no_single_team_keeps_all_gpus_while_others_wait() -> None:
    teams = [queue(t, H100=16, cohort="lab") for t in ("a", "b", "c", "d")]
    story = Story(World(nodes={f"n{k}": gpus(8) for k in range(8)}, queues=teams))
    # Team a arrives first with far more work than its quota: it borrows the whole idle cluster.
    for k in range(10):
        story.submit_job(hinted(job(f"a{k}", gpus=8, queue="a", preemptible=True), 86_400, grace=60), at=0.0)
    story.step(0.0)
    assert usage(story, "a") == 64
    # Teams b and c arrive with work inside their nominal quotas.
    for t in ("b", "c"):
        for k in range(2):
            story.submit_job(hinted(job(f"{t}{k}", gpus=8, queue=t), 3_600), at=100.0)
    first = story.step(100.0)
    reclaims = [p for p in first.decisions.preemptions if p.kind == "reclaim"]
    assert len(reclaims) == 4 and all(v.queue == "a" for p in reclaims for v in p.victims)
    story.step(200.0)  # a's victims have checkpointed by t=160; b and c start
    assert (usage(story, "a"), usage(story, "b"), usage(story, "c")) == (32, 16, 16)
    # a still borrows d's idle quota, but no more than what is left: nobody waits within quota.
    assert usage(story, "a") <= 64 - 16 - 16
    # Two of a's jobs never started; the four reclaimed ones were requeued to resume later.
    assert sum(1 for j in story.pending if j.startswith("a")) == 6


def test_32_gpu_gang_starts_all_at_once_despite_a_stream_of_small_jobs() -> None:
    nodes = {f"n{k}": gpus(8, leaf="L0" if k < 4 else "L1") for k in range(8)}
    running = [held(job(f"s{k}", gpus=4, queue="q"), {f"n{k}": 4}) for k in range(8)]
    # The small jobs end at staggered times; nodes n0..n3 are all free of them by t=4000.
    facts = {
        f"s{k}": RunFacts(0.0, expected_end=1000.0 * (k % 4 + 1) + (0 if k < 4 else 3000)) for k in range(8)
    }
    story = Story(World(nodes=nodes, queues=[queue("q", H100=64)], running=running, facts=facts))
    story.submit_job(job("gang", gpus=8, workers=4, topology="leaf", queue="q"), at=0.0)
    starts: dict[str, float] = {}
    reservation_start: float | None = None
    for t in range(0, 12_000, 500):
        # A new small job every cycle, each as long as the wait it would cause.
        story.submit_job(hinted(job(f"small{t}", gpus=2, queue="q"), 5_000), at=float(t))
        out = story.step(float(t))
        for r in out.decisions.reservations:
            if r.job_id == "gang" and reservation_start is None:
                reservation_start = r.start
        for p in out.plan.placed:
            starts[p.job.id] = float(t)
            if p.job.id == "gang":
                assert len(p.allocation.placements) == 4  # all four ranks in one grant
                assert {w.node for w in p.allocation.placements} == {"n0", "n1", "n2", "n3"}
    assert reservation_start == 4000.0
    assert starts["gang"] == reservation_start
    # Small jobs still ran meanwhile (backfill on GPUs the gang did not need, or short enough).
    assert sum(1 for j in starts if j.startswith("small") and starts[j] < starts["gang"]) >= 4


def test_experiment_checkpointed_and_preempted_for_urgent_retraining_then_resumed() -> None:
    experiment = job("experiment", gpus=8, workers=2, queue="ml", priority=0, preemptible=True)
    experiment = replace(experiment, checkpoint_grace_s=Seconds(120))
    world = World(
        nodes={"n0": gpus(8), "n1": gpus(8)},
        queues=[queue("ml", H100=16)],
        running=[held(experiment, {"n0": 8, "n1": 8})],
        facts={"experiment": RunFacts(0.0, last_checkpoint_at=1800.0)},
    )
    story = Story(world)
    retrain = hinted(job("retrain", gpus=8, workers=2, queue="ml", priority=100), 7_200)
    story.submit_job(retrain, at=3600.0)
    out = story.step(3600.0)
    plan = out.preemption("retrain")
    [victim] = plan.victims
    assert victim.job_id == "experiment"
    assert victim.checkpoint_deadline == 3720.0
    assert victim.lost_gpu_hours == 16 * 0.5  # 30 minutes since its last checkpoint, on 16 GPUs
    assert plan.ready_at == 3720.0 and len(plan.reservation) == 2
    assert any("waiting for 1 job(s) to checkpoint" in r for r in out.reasons("retrain"))
    assert usage(story, "ml") == 16  # the experiment keeps its GPUs while it checkpoints
    mid = story.step(3660.0)
    assert not mid.plan.placed and not mid.decisions.preemptions  # nothing re-planned meanwhile
    done = story.step(3720.0)
    [placed] = done.plan.placed
    assert placed.job.id == "retrain"
    assert {w.node for w in placed.allocation.placements} == {p.node for p in plan.reservation}
    assert JobId("experiment") in story.pending
    resumed = story.step(3720.0 + 7200.0)
    assert [p.job.id for p in resumed.plan.placed] == ["experiment"]
    assert story.log == [
        "t=3600 experiment asked to checkpoint by t=3720",
        "t=3720 experiment checkpointed and requeued",
        "t=3720 retrain placed",
        "t=10920 retrain completed",
        "t=10920 experiment placed",
    ]


def test_quota_usage_tracks_grants_across_cycles() -> None:
    story = Story(World(nodes={"n0": gpus(8)}, queues=[queue("a", H100=8)]))
    story.submit_job(job("j1", gpus=4, queue="a"), at=0.0)
    story.submit_job(job("j2", gpus=8, queue="a"), at=1.0)
    out = story.step(10.0)
    assert [p.job.id for p in out.plan.placed] == ["j1"]
    assert "a uses 4 of its 8 H100-80GB; no cohort to borrow from; needs 8" in out.reasons("j2")
    assert gpu_resource(H100) == "H100-80GB" and QueueName("a") == "a"
