"""The simulated runner: the same event protocol as GangSupervisor, without processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gangline.agent.env import RankSpec, Rendezvous
from gangline.agent.events import (
    AgentEvent,
    GangCompleted,
    GangFailed,
    GangGaveUp,
    GangRestarting,
    GangStarted,
    GangStopped,
    RankExited,
    RankStarted,
)
from gangline.agent.restart import RestartPolicy
from gangline.agent.runner import GangLaunch
from gangline.agent.simulated import PlannedFailure, SimulatedRunner, read_progress

WAIT_S = 10.0


def launch(
    tmp: Path, job: str = "s1", *, ranks: int = 2, duration_s: float = 1.0, **policy: object
) -> GangLaunch:
    return GangLaunch(
        job_id=job,
        allocation_id=f"alloc-{job}",
        ranks=tuple(RankSpec(rank=r, local_rank=r, gpus=(f"GPU-{r}",)) for r in range(ranks)),
        rendezvous=Rendezvous(master_addr="127.0.0.1", master_port=29500, world_size=ranks),
        checkpoint_dir=tmp / "ckpt" / job,
        log_dir=tmp / "logs",
        policy=RestartPolicy.model_validate({"max_restarts": 1, "backoff_initial_s": 0.0, **policy}),
        duration_hint_s=duration_s,
    )


def kinds(events: list[AgentEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


async def until(predicate: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not predicate():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.005)


async def test_a_gang_runs_for_its_scaled_duration_and_completes(tmp_path: Path) -> None:
    events: list[AgentEvent] = []
    runner = SimulatedRunner(time_scale=0.001)
    gang = runner.gang(launch(tmp_path, duration_s=10), events.append)
    final = await asyncio.wait_for(gang.run(), WAIT_S)
    assert final == GangCompleted("s1", 0)
    assert kinds(events) == [
        "RankStarted",
        "RankStarted",
        "GangStarted",
        "RankExited",
        "RankExited",
        "GangCompleted",
    ]
    assert [e.returncode for e in events if isinstance(e, RankExited)] == [0, 0]
    assert runner.running() == {}


async def test_a_failed_rank_restarts_the_gang_then_it_gives_up(tmp_path: Path) -> None:
    events: list[AgentEvent] = []
    runner = SimulatedRunner(time_scale=0.001)
    runner.plan_failure("s1", PlannedFailure(after_s=0.0, rank=1, exit_code=4, attempts=(0, 1)))
    gang = runner.gang(launch(tmp_path, duration_s=100_000), events.append)
    final = await asyncio.wait_for(gang.run(), WAIT_S)
    assert isinstance(final, GangGaveUp) and (final.attempt, final.failures) == (1, 2)
    failed = [e for e in events if isinstance(e, GangFailed)]
    assert [(f.attempt, f.reason, f.rank, f.returncode) for f in failed] == [
        (0, "rank_failed", 1, 4),
        (1, "rank_failed", 1, 4),
    ]
    exits = [(e.attempt, e.rank, e.returncode) for e in events if isinstance(e, RankExited)]
    assert exits == [(0, 1, 4), (0, 0, -15), (1, 1, 4), (1, 0, -15)]
    assert [e.attempt for e in events if isinstance(e, GangRestarting)] == [1]


async def test_peer_failure_tears_down_only_the_current_attempt(tmp_path: Path) -> None:
    events: list[AgentEvent] = []
    runner = SimulatedRunner(time_scale=0.001)
    gang = runner.gang(launch(tmp_path, duration_s=200), events.append)
    task = asyncio.create_task(gang.run())
    await until(lambda: any(isinstance(e, GangStarted) for e in events), "the start")
    await gang.peer_failed(0)
    await until(lambda: gang.attempt == 1, "the restart")
    await gang.peer_failed(0)  # a late copy for the old attempt: no effect
    assert await asyncio.wait_for(task, WAIT_S) == GangCompleted("s1", 1)
    assert [(e.attempt, e.reason) for e in events if isinstance(e, GangFailed)] == [(0, "peer_failed")]


async def test_preemption_checkpoints_and_a_relaunch_resumes(tmp_path: Path) -> None:
    events: list[AgentEvent] = []
    runner = SimulatedRunner(time_scale=0.001, checkpoint_delay_s=0.01)
    gang = runner.gang(launch(tmp_path, duration_s=100_000), events.append)
    task = asyncio.create_task(gang.run())
    await until(lambda: gang.running, "the start")
    await asyncio.sleep(0.05)
    result = await asyncio.wait_for(gang.preempt(15, 5.0), WAIT_S)
    final = await task
    assert isinstance(final, GangStopped) and final.checkpoint == result
    assert result.acknowledged and result.acked == (0, 1) and result.killed == ()
    assert await gang.preempt(15, 5.0) == result  # idempotent
    saved = read_progress(tmp_path / "ckpt" / "s1")
    assert saved > 0

    ignored: list[AgentEvent] = []
    again = runner.gang(launch(tmp_path, duration_s=saved + 1), ignored.append)
    assert isinstance(await asyncio.wait_for(again.run(), WAIT_S), GangCompleted)


async def test_a_checkpoint_slower_than_the_grace_is_killed_unacknowledged(tmp_path: Path) -> None:
    events: list[AgentEvent] = []
    runner = SimulatedRunner(time_scale=0.001, checkpoint_delay_s=60.0)
    gang = runner.gang(launch(tmp_path, duration_s=100_000), events.append)
    task = asyncio.create_task(gang.run())
    await until(lambda: gang.running, "the start")
    result = await asyncio.wait_for(gang.preempt(15, 0.02), WAIT_S)
    await task
    assert not result.acknowledged and result.killed == (0, 1)
    assert [e.returncode for e in events if isinstance(e, RankExited)] == [-9, -9]
    assert read_progress(tmp_path / "ckpt" / "s1") == 0.0


async def test_preempted_before_it_starts_or_between_attempts_nothing_runs(tmp_path: Path) -> None:
    runner = SimulatedRunner(time_scale=0.001)
    early: list[AgentEvent] = []
    gang = runner.gang(launch(tmp_path, "s2"), early.append)
    stopping = asyncio.create_task(gang.preempt(15, 1.0))
    final = await asyncio.wait_for(gang.run(), WAIT_S)
    assert isinstance(final, GangStopped) and final.checkpoint.ranks == ()
    assert (await stopping).ranks == ()
    assert kinds(early) == ["GangStopped"]

    between: list[AgentEvent] = []
    slow = launch(tmp_path, "s3", duration_s=100_000, backoff_initial_s=30.0)
    runner.plan_failure("s3", PlannedFailure(after_s=0.0))
    gang = runner.gang(slow, between.append)
    task = asyncio.create_task(gang.run())
    await until(lambda: any(isinstance(e, GangRestarting) for e in between), "the back-off")
    await asyncio.wait_for(gang.preempt(15, 1.0), WAIT_S)
    final = await asyncio.wait_for(task, WAIT_S)
    assert isinstance(final, GangStopped) and final.checkpoint.ranks == ()
    assert sum(isinstance(e, RankStarted) for e in between) == 2  # only attempt 0 ever ran


async def test_fail_now_through_the_runner(tmp_path: Path) -> None:
    events: list[AgentEvent] = []
    runner = SimulatedRunner(time_scale=0.001)
    assert runner.fail("nobody") is False
    gang = runner.gang(launch(tmp_path, duration_s=100_000, mode="never"), events.append)
    task = asyncio.create_task(gang.run())
    await until(lambda: gang.running, "the start")
    assert list(runner.running()) == ["s1"]
    assert runner.fail("s1", rank=0, exit_code=0) is False  # exit 0 is not a failure
    assert runner.fail("s1", rank=7) is False  # not a rank of this node
    assert runner.fail("s1", rank=1, exit_code=2) is True
    final = await asyncio.wait_for(task, WAIT_S)
    assert isinstance(final, GangGaveUp) and final.reason == "restart policy is never"
    assert runner.fail("s1") is False
