"""``make run``'s demo against the decision services and the fake nodes, on private topics: it feeds its
slice of the trace, its gangs and its urgent gang, ends when every job it sent is over, and its last table
shows them done, every queue empty and no GPU held."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from e2e.harness import Tasks, fake_cluster, private_topics, service_env, start_pipeline
from services.agent.demo import feed_and_watch
from services.common.env import ServiceSettings

PHILLY = Path(__file__).resolve().parents[3] / "shared/traces/pollux-philly/philly.csv"


@pytest.mark.skipif(not PHILLY.exists(), reason="the Philly trace is not in shared/traces")
async def test_the_demo_ends_with_every_job_done_and_its_table_shows_it(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with private_topics(kafka_bootstrap, "demo") as topics:
        env = service_env(kafka_bootstrap, topics)
        cluster = fake_cluster(kafka_bootstrap, topics, time_scale=0.002, heartbeat_s=1.0)
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            args = argparse.Namespace(
                philly=str(PHILLY), jobs=6, spread_s=2.0, urgent_after_s=1.0, max_s=240.0
            )
            await feed_and_watch(args, ServiceSettings.from_env(env))
        finally:
            await tasks.stop()

    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("done: 10 of 10 jobs finished;")
    final = out[out.rindex("gangline demo") :]
    queue = next(line.split() for line in final.splitlines() if line.startswith("default"))
    assert queue[1:4] == ["0", "0", "10"]  # nothing waits, all 10 done
    # the demo ends when the jobs are over, perhaps before every release is read: what the queue's grants
    # hold is what the GPU table counts allocated
    gpus = next(line.split() for line in final.splitlines() if line.startswith("all "))
    assert queue[4] == gpus[2]
    assert "finished 10/10" in final
