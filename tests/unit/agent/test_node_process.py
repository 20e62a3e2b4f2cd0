"""The node agent with real worker processes (ProcessRunner over GangSupervisor), no broker:
the torch.distributed environment reaches the ranks, exits are reported, SIGTERM checkpoints."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from agent_node_fakes import FakeBus, admitted, grant, make_agent, preempting, wait_for

from gangline.agent.launcher import GangSupervisor
from gangline.agent.runner import ProcessRunner
from gangline.events.jobs import JobCheckpointed, JobCompleted, JobFailed, JobStarted, WorkerExited

WORKER = """
import json, os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
names = ["CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
         "GANGLINE_JOB_ID", "GANGLINE_CHECKPOINT_DIR", "FOO"]
(out / f"env-{os.environ['RANK']}.json").write_text(json.dumps({n: os.environ.get(n) for n in names}))
mode = sys.argv[2]
if mode == "exit":
    sys.exit(int(sys.argv[3]))
def on_term(signum, frame):
    ack = pathlib.Path(os.environ["GANGLINE_CHECKPOINT_ACK"])
    ack.parent.mkdir(parents=True, exist_ok=True)
    ack.touch()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
(out / f"ready-{os.environ['RANK']}").touch()
while True:
    time.sleep(0.02)
"""


def worker(tmp: Path, *args: str) -> tuple[str, ...]:
    script = tmp / "worker.py"
    script.write_text(WORKER)
    (tmp / "out").mkdir(exist_ok=True)
    return (sys.executable, str(script), str(tmp / "out"), *args)


async def test_ranks_get_the_torch_env_and_their_exits_are_reported(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus, runner=ProcessRunner())
    await agent.start()
    try:
        await agent.handle(admitted("p1", workers=2, command=worker(tmp_path, "exit", "0"), env={"FOO": "x"}))
        await agent.handle(grant("p1", "pa1", [(0, "n0", ("gpu1",)), (1, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobCompleted), "job.completed")
        uuids = {str(g.id): g.uuid for g in agent.registration.gpus}
        env0 = json.loads((tmp_path / "out" / "env-0.json").read_text())
        env1 = json.loads((tmp_path / "out" / "env-1.json").read_text())
        assert env0["CUDA_VISIBLE_DEVICES"] == uuids["gpu1"] and env1["CUDA_VISIBLE_DEVICES"] == uuids["gpu0"]
        assert env0["MASTER_ADDR"] == "127.0.0.1" and env0["MASTER_PORT"] == env1["MASTER_PORT"]
        assert (env0["WORLD_SIZE"], env1["RANK"], env1["LOCAL_RANK"]) == ("2", "1", "1")
        assert env0["GANGLINE_CHECKPOINT_DIR"] == str(tmp_path / "ckpt" / "p1")
        assert env0["FOO"] == "x"
        assert sorted((e.rank, e.exit_code) for e in bus.of(WorkerExited)) == [(0, 0), (1, 0)]
    finally:
        await agent.stop()


async def test_a_nonzero_exit_with_restarts_off_fails_the_job(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus, runner=ProcessRunner(), restart_policy="never")
    await agent.start()
    try:
        await agent.handle(admitted("p2", command=worker(tmp_path, "exit", "5")))
        await agent.handle(grant("p2", "pa2", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobFailed), "job.failed")
        failed = bus.of(JobFailed)[0]
        assert (failed.code, failed.exit_code) == ("worker_exit", 5)
        assert [(e.exit_code, e.restarts) for e in bus.of(WorkerExited)] == [(5, 0)]
    finally:
        await agent.stop()


async def test_sigterm_checkpoint_is_acknowledged_as_job_checkpointed(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus, runner=ProcessRunner())
    await agent.start()
    try:
        await agent.handle(admitted("p3", command=worker(tmp_path, "wait")))
        await agent.handle(grant("p3", "pa3", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobStarted), "job.started")
        await wait_for(lambda: (tmp_path / "out" / "ready-0").exists(), "the worker's SIGTERM handler")
        await agent.handle(preempting("p3", "pa3", grace_s=10.0))
        await wait_for(lambda: bus.of(JobCheckpointed), "job.checkpointed")
        assert bus.of(JobCheckpointed)[0].checkpoint == str(tmp_path / "ckpt" / "p3")
        assert [(e.exit_code, e.signal) for e in bus.of(WorkerExited)] == [(0, None)]
    finally:
        await agent.stop()


async def test_a_job_without_a_command_fails_at_launch(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus, runner=ProcessRunner())
    await agent.start()
    try:
        await agent.handle(admitted("p4"))
        await agent.handle(grant("p4", "pa4", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobFailed), "job.failed")
        assert bus.of(JobFailed)[0].code == "launch_failed"
        assert agent.jobs == {}
    finally:
        await agent.stop()


async def test_crash_kills_the_worker_processes(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus, runner=ProcessRunner())
    await agent.start()
    await agent.handle(admitted("p5", command=worker(tmp_path, "wait")))
    await agent.handle(grant("p5", "pa5", [(0, "n0", ("gpu0",))]))
    await wait_for(lambda: (tmp_path / "out" / "ready-0").exists(), "the worker")
    gang = agent.jobs["p5"].gang
    assert isinstance(gang, GangSupervisor) and gang.launcher is not None
    (pid,) = gang.launcher.pids.values()
    await agent.crash()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: gone
    assert bus.of(WorkerExited) == []  # a dead node reports nothing


async def test_a_job_at_its_time_limit_gets_the_checkpoint_signal_then_fails_with_time_limit(
    tmp_path: Path,
) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus, runner=ProcessRunner())
    await agent.start()
    try:
        command = worker(tmp_path, "loop")  # runs until signalled; acknowledges SIGTERM with a checkpoint
        await agent.handle(admitted("p9", command=command, time_limit_s=1, checkpoint_grace_s=20))
        await agent.handle(grant("p9", "pa9", [(0, "n0", ("gpu0",))]))
        await wait_for(lambda: bus.of(JobFailed), "job.failed at the limit")
        [failed] = bus.of(JobFailed)
        assert (failed.code, failed.allocation_id) == ("time_limit", "pa9")
        assert "time limit of 1 s" in failed.reason and "checkpointed" in failed.reason
        assert (tmp_path / "out" / "ready-0").exists()  # the process really ran
        [checkpointed] = bus.of(JobCheckpointed)
        assert checkpointed.checkpoint == str(tmp_path / "ckpt" / "p9")
        assert [(e.exit_code, e.signal) for e in bus.of(WorkerExited)] == [
            (0, None)
        ]  # it exited on the signal
        assert bus.of(JobCompleted) == []
        kinds = [type(e.data).__name__ for _, e in bus.sent]
        assert kinds.index("JobCheckpointed") < kinds.index("JobFailed")
    finally:
        await agent.stop()
