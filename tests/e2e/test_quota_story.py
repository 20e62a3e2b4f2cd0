"""The quota story, end to end: a cohort lends idle quota, then reclaims it by preemption.

team-a and team-b each own 8 H100 in cohort ``lab`` (16 GPUs in the cluster); team-a may not borrow,
so its 16-GPU gang is refused at admission although the cluster could hold it. team-b runs two 8-GPU
jobs, borrowing team-a's idle 8. When team-a asks for its 8, the quota service marks team-a's
pending job as owed its nominal quota (reclaim), and the preemption service's core victim search picks
one of team-b's borrowing jobs; preemption asks it to checkpoint, the node acknowledges,
the allocation is released, and team-a's job is queued on H100 and placed. The victim waits in team-b's
queue (team-b is at its quota, the cohort has nothing to lend) until team-a's job ends, then resumes.
"""

from __future__ import annotations

from pathlib import Path

from e2e.harness import (
    LogReader,
    Tasks,
    audit_allocations,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_pipeline,
)
from e2e.test_stories import h100_nodes
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobPending, JobPreempting, JobQueued, JobRejected

QUEUES = """
cohorts:
  - name: lab
queues:
  - name: team-a
    cohort: lab
    quotas:
      H100-SXM5-80GB: {nominal: 8, borrowing_limit: 0}
  - name: team-b
    cohort: lab
    quotas:
      H100-SXM5-80GB: {nominal: 8}
"""


async def test_a_cohort_lends_idle_quota_and_reclaims_it(kafka_bootstrap: str, tmp_path: Path) -> None:
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(QUEUES, encoding="utf-8")
    async with private_topics(kafka_bootstrap, "quota") as topics:
        env = service_env(kafka_bootstrap, topics, queues_file=str(queues_file))
        cluster = fake_cluster(kafka_bootstrap, topics, h100_nodes(2))
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            borrowers = ["b-1", "b-2"]
            team_b = {"queue": "team-b", "workers": 1, "gpus_per_worker": 8, "preemptible": True}
            await send_raw(
                kafka_bootstrap,
                topics.requests,
                [(b, request_bytes(b, checkpoint_grace_s=30, **team_b)) for b in borrowers]
                + [("nowhere", request_bytes("nowhere", queue="team-c", workers=1, gpus_per_worker=1))]
                + [("too-big", request_bytes("too-big", queue="team-a", workers=2, gpus_per_worker=8))],
            )
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                def grants(job: str) -> list[AllocationGranted]:
                    return [g for g in log.of(topics.allocations, AllocationGranted) if g.job_id == job]

                def rejected() -> dict[str, JobRejected]:
                    return {r.job_id: r for r in log.of(topics.events, JobRejected) if r.job_id}

                await log.until(
                    lambda: all(grants(b) for b in borrowers) and len(rejected()) == 2,
                    timeout_s=60,
                    check=tasks.check,
                )
                assert rejected()["nowhere"].code == "unknown_queue"
                assert "team-a, team-b" in rejected()["nowhere"].reason
                assert rejected()["too-big"].code == "exceeds_queue_quota"
                # team-a wants back the 8 H100 it lent.
                owed = request_bytes("a-1", queue="team-a", workers=1, gpus_per_worker=8, duration_hint_s=3)
                await send_raw(kafka_bootstrap, topics.requests, [("a-1", owed)])
                await log.until(lambda: bool(grants("a-1")), timeout_s=60, check=tasks.check)

                [asked] = log.of(topics.events, JobPreempting)
                victim = asked.job_id
                assert victim in borrowers and asked.preemptor_job_id == "a-1"
                assert "reclaims the quota" in asked.reason
                # Quota said a-1 is owed its nominal quota; it named no victim (preemption chose one).
                owed = [
                    r
                    for p in log.of(topics.events, JobPending)
                    if p.job_id == "a-1"
                    for r in p.reasons
                    if r.constraint == "reclaim"
                ]
                assert owed and owed[0].details["within_nominal"] is True
                assert all("victims" not in r.details for r in owed)
                [queued] = [q for q in log.of(topics.events, JobQueued) if q.job_id == "a-1"]
                assert queued.gpu_type == "H100-SXM5-80GB"
                # The victim waits for quota (team-b holds its 8; the cohort lends nothing) ...
                await log.until(
                    lambda: any(
                        p.job_id == victim and any(r.code == "quota" for r in p.reasons)
                        for p in log.of(topics.events, JobPending)
                    ),
                    timeout_s=30,
                    check=tasks.check,
                )
                # ... and resumes, borrowing again, once team-a's job is done.
                await log.until(lambda: len(grants(victim)) == 2, timeout_s=60, check=tasks.check)

            releases = {(r.job_id, r.reason) for r in log.of(topics.allocations, AllocationReleased)}
            assert (victim, "preempted") in releases and ("a-1", "completed") in releases
            second = grants(victim)[1]
            a_done = next(
                i
                for i, (_, e) in enumerate(log.stamped[topics.allocations])
                if isinstance(e.data, AllocationReleased) and e.data.job_id == "a-1"
            )
            resumed = next(
                i
                for i, (_, e) in enumerate(log.stamped[topics.allocations])
                if isinstance(e.data, AllocationGranted) and e.data.allocation_id == second.allocation_id
            )
            assert resumed > a_done, "the victim borrowed again before team-a's job gave the quota back"
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            await tasks.stop()
