"""GangLauncher / GangSupervisor with small real processes on one node (no network)."""

from __future__ import annotations

import asyncio
import signal
import sys
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
from gangline.agent.launcher import GangSupervisor, LaunchSpec
from gangline.agent.restart import RestartPolicy

WAIT_S = 60.0

# Each rank runs this with its RANK; the behaviour per rank comes from argv.
PROGRAM = r"""
import os, signal, sys, time, pathlib
rank = int(os.environ["RANK"])
mode = sys.argv[1]
print("rank", rank, "devices", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
if mode == "ok":
    sys.exit(0)
if mode == "rank1-fails":
    if rank == 1:
        sys.exit(7)
    time.sleep(60)
if mode == "checkpoint":
    def term(*_):
        ack = pathlib.Path(os.environ["GANGLINE_CHECKPOINT_ACK"])
        ack.parent.mkdir(parents=True, exist_ok=True)
        ack.touch()
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    if rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a rank that never checkpoints
    pathlib.Path(os.environ["GANGLINE_CHECKPOINT_DIR"], f"up-{rank}").touch()
    time.sleep(60)
"""


def spec(tmp: Path, mode: str, command: tuple[str, ...] | None = None, grace: float = 5.0) -> LaunchSpec:
    return LaunchSpec(
        job_id="j1",
        command=command or (sys.executable, "-c", PROGRAM, mode),
        ranks=(
            RankSpec(rank=0, local_rank=0, gpus=("GPU-0",)),
            RankSpec(rank=1, local_rank=1, gpus=("GPU-1",)),
        ),
        rendezvous=Rendezvous(master_addr="127.0.0.1", master_port=29500, world_size=2),
        log_dir=tmp / "logs",
        checkpoint_dir=tmp / "ckpt",
        teardown_grace_s=grace,
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[AgentEvent] = []
        self.sleeps: list[float] = []
        self.started = asyncio.Event()

    def __call__(self, event: AgentEvent) -> None:
        self.events.append(event)
        if isinstance(event, GangStarted):
            self.started.set()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [e for e in self.events if isinstance(e, kind)]


async def test_gang_completes_and_captures_each_rank_log(tmp_path: Path) -> None:
    rec = Recorder()
    sup = GangSupervisor(spec(tmp_path, "ok"), RestartPolicy(), listener=rec)

    out = await asyncio.wait_for(sup.run(), WAIT_S)

    assert isinstance(out.final, GangCompleted) and out.failures == 0
    assert [type(e) for e in rec.events[:3]] == [RankStarted, RankStarted, GangStarted]
    assert sorted((e.rank, e.returncode) for e in rec.of(RankExited)) == [(0, 0), (1, 0)]
    log = (tmp_path / "logs" / "j1-a0-r1.log").read_text()
    assert "rank 1 devices GPU-1" in log


async def test_failed_rank_tears_down_the_gang_and_policy_limits_restarts(tmp_path: Path) -> None:
    rec = Recorder()
    policy = RestartPolicy(max_restarts=2, backoff_initial_s=1.5, backoff_factor=2.0)
    sup = GangSupervisor(spec(tmp_path, "rank1-fails"), policy, listener=rec, sleep=rec.sleep)

    out = await asyncio.wait_for(sup.run(), WAIT_S)

    assert isinstance(out.final, GangGaveUp) and out.failures == 3 and out.attempts == 3
    assert [(e.attempt, e.reason, e.rank, e.returncode) for e in rec.of(GangFailed)] == [
        (0, "rank_failed", 1, 7),
        (1, "rank_failed", 1, 7),
        (2, "rank_failed", 1, 7),
    ]
    assert [(e.attempt, e.delay_s) for e in rec.of(GangRestarting)] == [(1, 1.5), (2, 3.0)]
    assert rec.sleeps == [1.5, 3.0]
    # the sleeping rank 0 was stopped by the agent (SIGTERM), not left behind
    assert [e.returncode for e in rec.of(RankExited) if e.rank == 0] == [-signal.SIGTERM] * 3


async def test_preemption_kills_a_rank_that_ignores_the_signal_and_reports_no_ack(tmp_path: Path) -> None:
    rec = Recorder()
    sup = GangSupervisor(spec(tmp_path, "checkpoint"), RestartPolicy(), listener=rec)
    run = asyncio.create_task(sup.run())
    for r in (0, 1):
        marker = tmp_path / "ckpt" / f"up-{r}"
        while not await asyncio.to_thread(marker.exists):  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)

    result = await asyncio.wait_for(sup.preempt(signal.SIGTERM, grace_s=1.0), WAIT_S)
    out = await asyncio.wait_for(run, WAIT_S)

    assert result.exited_in_grace == (0,) and result.killed == (1,) and result.acked == (0,)
    assert not result.acknowledged
    assert isinstance(out.final, GangStopped) and out.final.checkpoint == result
    assert rec.of(GangFailed) == []
    assert await sup.preempt() == result  # asking again after the end answers the same


async def test_launch_failure_is_a_gang_failure(tmp_path: Path) -> None:
    rec = Recorder()
    bad = spec(tmp_path, "ok", command=(str(tmp_path / "no-such-program"),))
    sup = GangSupervisor(bad, RestartPolicy(mode="never"), listener=rec)

    out = await asyncio.wait_for(sup.run(), WAIT_S)

    assert isinstance(out.final, GangGaveUp)
    assert [(e.reason, e.rank) for e in rec.of(GangFailed)] == [("launch_failed", None)]
    assert [(e.rank, e.returncode) for e in rec.of(RankExited)] == [(0, 127)]


async def test_preempt_during_backoff_stops_without_relaunching(tmp_path: Path) -> None:
    rec = Recorder()
    gate = asyncio.Event()

    async def slow_sleep(_: float) -> None:
        gate.set()
        await asyncio.sleep(WAIT_S)

    sup = GangSupervisor(spec(tmp_path, "rank1-fails"), RestartPolicy(), listener=rec, sleep=slow_sleep)
    run = asyncio.create_task(sup.run())
    await asyncio.wait_for(gate.wait(), WAIT_S)

    result = await sup.preempt(signal.SIGTERM, grace_s=1.0)
    out = await asyncio.wait_for(run, WAIT_S)

    assert isinstance(out.final, GangStopped) and result.ranks == () and not result.acknowledged
    assert len(rec.of(GangStarted)) == 1


async def test_peer_failure_stops_this_node_and_stale_reports_are_ignored(tmp_path: Path) -> None:
    rec = Recorder()
    sup = GangSupervisor(spec(tmp_path, "checkpoint"), RestartPolicy(mode="never"), listener=rec)
    run = asyncio.create_task(sup.run())
    await asyncio.wait_for(rec.started.wait(), WAIT_S)

    await sup.peer_failed(attempt=5)  # not our attempt: nothing happens
    assert sup.launcher is not None and not sup.launcher.ending
    await sup.peer_failed(attempt=0)
    out = await asyncio.wait_for(run, WAIT_S)

    assert isinstance(out.final, GangGaveUp)
    assert [e.reason for e in rec.of(GangFailed)] == ["peer_failed"]


async def test_events_iterator_ends_with_the_final_event(tmp_path: Path) -> None:
    sup = GangSupervisor(spec(tmp_path, "ok"), RestartPolicy())
    await asyncio.wait_for(sup.run(), WAIT_S)
    seen = [e async for e in sup.events()]
    assert isinstance(seen[-1], GangCompleted) and isinstance(seen[2], GangStarted)


async def test_a_rank_acknowledges_by_creating_its_ack_file_in_a_directory_the_agent_made(
    tmp_path: Path,
) -> None:
    # A shell's builtins only: no mkdir, no touch (the directory is there, the redirection creates the file).
    script = (
        "trap ': > \"$GANGLINE_CHECKPOINT_ACK\"; exit 0' TERM; "
        ': > "$GANGLINE_CHECKPOINT_DIR/up-$RANK"; sleep 60 & wait'
    )
    rec = Recorder()
    sup = GangSupervisor(spec(tmp_path, "sh", command=("sh", "-c", script)), RestartPolicy(), listener=rec)
    run = asyncio.create_task(sup.run())
    for r in (0, 1):
        marker = tmp_path / "ckpt" / f"up-{r}"
        while not await asyncio.to_thread(marker.exists):  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)

    result = await asyncio.wait_for(sup.preempt(signal.SIGTERM, grace_s=30.0), WAIT_S)
    out = await asyncio.wait_for(run, WAIT_S)

    assert result.acked == (0, 1) and result.exited_in_grace == (0, 1) and result.killed == ()
    assert result.acknowledged
    assert isinstance(out.final, GangStopped)
