"""Two placement replicas: one decides, the other waits; kill -9 the first and the second takes over."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from e2e.harness import (
    LogReader,
    Proc,
    Tasks,
    audit_allocations,
    fake_cluster,
    placement_replica,
    placement_requests,
    private_topics,
    send_raw,
    service_env,
    start_cluster,
)
from gangline.events.allocations import AllocationGranted

JOBS = 120


async def test_a_standby_placement_takes_over_when_the_leader_dies(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    jobs = placement_requests("f", JOBS, seed=3, workers=(1, 2), gpus_per_worker=(1, 2, 4))
    async with private_topics(kafka_bootstrap, "failover") as topics:
        env = service_env(kafka_bootstrap, topics, session_timeout_ms="3000")
        replicas = [placement_replica(env, f"p{k}", tmp_path / f"placement-{k}.log") for k in range(2)]
        cluster = fake_cluster(kafka_bootstrap, topics, time_scale=0.2, heartbeat_s=0.5)
        tasks = Tasks()
        try:
            await start_cluster(tasks, cluster, env, only=("admission", "quota"))
            replicas[0].start()
            await asyncio.sleep(3)  # p0 takes the lock first
            replicas[1].start()
            await send_raw(kafka_bootstrap, topics.requests, jobs[: JOBS // 2])
            async with LogReader(kafka_bootstrap, [topics.allocations]) as log:

                def granted() -> set[str]:
                    return {g.job_id for g in log.of(topics.allocations, AllocationGranted)}

                await log.until(lambda: len(granted()) >= JOBS // 4, timeout_s=90, check=tasks.check)
                leader_log = replicas[0].log_path.read_text()
                standby_log = replicas[1].log_path.read_text()
                assert "leadership acquired" in leader_log
                assert "leadership acquired" not in standby_log
                replicas[0].kill9()
                await send_raw(kafka_bootstrap, topics.requests, jobs[JOBS // 2 :])
                await log.until(lambda: len(granted()) == JOBS, timeout_s=120, check=tasks.check)
                for _ in range(10):
                    await log.poll()
            assert "leadership acquired" in replicas[1].log_path.read_text()
            per_job: dict[str, int] = {}
            for g in log.of(topics.allocations, AllocationGranted):
                per_job[g.job_id] = per_job.get(g.job_id, 0) + 1
            assert [j for j, n in per_job.items() if n != 1] == []
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            for proc in replicas:
                proc.terminate()
            await tasks.stop()


async def logged(proc: Proc, text: str, *, after: int = 0, timeout_s: float = 120) -> None:
    """Wait until ``proc``'s log holds ``text`` more than ``after`` times (a bound, not a timed assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while proc.log_path.read_text(errors="replace").count(text) <= after:
        if loop.time() > deadline:
            raise TimeoutError(f"{proc.log_path.name} did not log {text!r} within {timeout_s} s")
        await asyncio.sleep(0.1)


async def test_a_leader_stopped_past_its_lock_is_replaced_and_fenced_when_it_resumes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A false failover (the leader frozen past the lock's session, as by a long GC pause or a SIGSTOP):
    the standby takes over, the old leader resumes and is fenced (it exits), and no job is granted twice
    nor lost, no GPU held twice."""
    jobs = placement_requests("s", JOBS, seed=5, workers=(1, 2), gpus_per_worker=(1, 2, 4))
    async with private_topics(kafka_bootstrap, "stopped") as topics:
        env = service_env(kafka_bootstrap, topics)  # the default lock session (1.5 s)
        replicas = [placement_replica(env, f"p{k}", tmp_path / f"p{k}.log") for k in range(2)]
        old, new = replicas
        cluster = fake_cluster(kafka_bootstrap, topics, time_scale=0.2, heartbeat_s=0.5)
        tasks = Tasks()
        try:
            await start_cluster(tasks, cluster, env, only=("admission", "quota"))
            old.start()
            await logged(old, '"leadership acquired"')
            new.start()
            await logged(new, ".leader with generation")  # the standby is in the lock's group
            await send_raw(kafka_bootstrap, topics.requests, jobs[: JOBS // 2])
            async with LogReader(kafka_bootstrap, [topics.allocations]) as log:

                def granted() -> set[str]:
                    return {g.job_id for g in log.of(topics.allocations, AllocationGranted)}

                await log.until(lambda: len(granted()) >= JOBS // 4, timeout_s=90, check=tasks.check)
                assert old.proc is not None
                old.proc.send_signal(signal.SIGSTOP)  # frozen mid-work, its lock and transaction open
                try:
                    await logged(new, '"leadership acquired"')
                    await logged(new, '"processor started"')
                    await send_raw(kafka_bootstrap, topics.requests, jobs[JOBS // 2 :])
                    await log.until(lambda: len(granted()) > JOBS // 2, timeout_s=90, check=tasks.check)
                finally:
                    old.proc.send_signal(signal.SIGCONT)
                await log.until(lambda: len(granted()) == JOBS, timeout_s=120, check=tasks.check)
                # The old leader learns it was replaced and exits; it committed nothing meanwhile.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while old.alive() and loop.time() < deadline:
                    await log.poll()
                for _ in range(10):
                    await log.poll()
            assert not old.alive(), "the resumed old leader did not stop"
            assert new.alive()
            per_job: dict[str, int] = {}
            for g in log.of(topics.allocations, AllocationGranted):
                per_job[g.job_id] = per_job.get(g.job_id, 0) + 1
            assert [j for j, n in per_job.items() if n != 1] == []
            assert set(per_job) == {job for job, _ in jobs}
            assert audit_allocations(log.stamped[topics.allocations]) == []
        finally:
            for proc in replicas:
                if proc.proc is not None and proc.alive():
                    proc.proc.send_signal(signal.SIGCONT)
                proc.terminate()
            await tasks.stop()
