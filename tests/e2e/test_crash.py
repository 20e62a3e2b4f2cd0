"""The crash story: kill -9 placement, then quota, in the middle of a stream; no grant lost or duplicated."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from e2e.harness import (
    LogReader,
    Proc,
    Tasks,
    audit_allocations,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
)
from gangline.events.allocations import AllocationGranted

SERVICES = ("admission", "quota", "placement", "preemption", "node_health")
JOBS = 300


async def test_kill_9_placement_then_quota_mid_stream(kafka_bootstrap: str, tmp_path: Path) -> None:
    rng = random.Random(9)
    jobs = [
        (
            f"c-{i:03d}",
            request_bytes(
                f"c-{i:03d}",
                queue="default",
                workers=rng.choice([1, 1, 1, 2]),
                gpus_per_worker=rng.choice([1, 2, 4]),
                duration_hint_s=rng.choice([1, 2]),
            ),
        )
        for i in range(JOBS)
    ]
    async with private_topics(kafka_bootstrap, "crash") as topics:
        env = service_env(kafka_bootstrap, topics, silence_s="30")
        procs = {name: Proc(f"services.{name}", env, tmp_path / f"{name}.log") for name in SERVICES}
        cluster = fake_cluster(kafka_bootstrap, topics, time_scale=0.2, heartbeat_s=1.0)
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            for proc in procs.values():
                proc.start()

            async def stream() -> None:
                for k in range(0, JOBS, 10):
                    await send_raw(kafka_bootstrap, topics.requests, jobs[k : k + 10])
                    await asyncio.sleep(0.1)

            tasks.start("stream", stream())

            def check() -> None:
                tasks.check()
                for name, proc in procs.items():
                    assert proc.alive(), f"{name} exited; see {proc.log_path}"

            async with LogReader(kafka_bootstrap, [topics.allocations]) as log:

                def granted() -> set[str]:
                    return {g.job_id for g in log.of(topics.allocations, AllocationGranted)}

                await log.until(lambda: len(granted()) >= JOBS // 4, timeout_s=120, check=check)
                procs["placement"].kill9()
                await asyncio.sleep(1.0)
                procs["placement"].start()
                await log.until(lambda: len(granted()) >= JOBS // 2, timeout_s=120, check=check)
                procs["quota"].kill9()
                await asyncio.sleep(1.0)
                procs["quota"].start()
                await log.until(lambda: len(granted()) == JOBS, timeout_s=180, check=check)
                for _ in range(15):
                    await log.poll()

            grants = log.of(topics.allocations, AllocationGranted)
            per_job: dict[str, int] = {}
            for g in grants:
                per_job[g.job_id] = per_job.get(g.job_id, 0) + 1
            assert set(per_job) == {job_id for job_id, _ in jobs}
            assert [j for j, n in per_job.items() if n != 1] == []
            assert audit_allocations(log.stamped[topics.allocations]) == []
            restored = [
                line
                for name in ("placement", "quota")
                for line in procs[name].log_path.read_text().splitlines()
                if "state restored" in line
            ]
            print("\n".join(restored))
        finally:
            for proc in procs.values():
                proc.terminate()
            await tasks.stop()
