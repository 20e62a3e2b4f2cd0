"""End to end on this machine: two agents (two GangSupervisors over two stand-in nodes with 2 GPUs
each) run a 2-node x 2-rank gang that rendezvouses through MASTER_ADDR:MASTER_PORT and all-reduces;
one rank is killed and the whole gang restarts; then a preemption checkpoints, stops, and a
requeued launch resumes from the same checkpoint directory.

No Kafka here: ``Relay`` plays the part of jobs.events between the two agents (GangFailed on one
node becomes ``peer_failed`` on the other). Waits are bounded; nothing asserts on durations.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

from gangline.agent.env import Placement, checkpoint_dir_for, layout_for_node
from gangline.agent.events import AgentEvent, GangFailed, GangRestarting, GangStarted, GangStopped
from gangline.agent.launcher import GangSupervisor, LaunchSpec, SupervisorOutcome
from gangline.agent.restart import RestartPolicy
from gangline.nvml.reader import NvmlReader
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn

WORKER = Path(__file__).with_name("allreduce_worker.py")
JOB = "job-e2e"
WORLD = 4
WAIT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def expected_acc(steps: int) -> int:
    return sum(sum(r + s for r in range(WORLD)) for s in range(steps))


class Relay:
    """What the Kafka shell does between agents: a node's GangFailed tells every other node."""

    def __init__(self) -> None:
        self.sups: dict[str, GangSupervisor] = {}
        self.events: dict[str, list[AgentEvent]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def listener(self, node: str):  # type: ignore[no-untyped-def]
        self.events[node] = []

        def on_event(event: AgentEvent) -> None:
            self.events[node].append(event)
            if isinstance(event, GangFailed):
                for other, sup in self.sups.items():
                    if other != node:
                        task = asyncio.create_task(sup.peer_failed(event.attempt))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)

        return on_event


def gang(tmp: Path, port: int, steps: int, step_sleep: float, relay: Relay, policy: RestartPolicy) -> None:
    gpus = {}
    for node in ("node-a", "node-b"):
        reader = NvmlReader(NvmlStandIn(load_builtin_spec("sim-2gpu", node=node)), node=node)
        gpus[node] = [g.uuid for g in reader.inventory().gpus]
    placements = [
        Placement(rank=0, node="node-a", gpus=(gpus["node-a"][0],)),
        Placement(rank=1, node="node-a", gpus=(gpus["node-a"][1],)),
        Placement(rank=2, node="node-b", gpus=(gpus["node-b"][0],)),
        Placement(rank=3, node="node-b", gpus=(gpus["node-b"][1],)),
    ]
    (tmp / "out").mkdir(exist_ok=True)
    for node in ("node-a", "node-b"):
        ranks, rdzv = layout_for_node(placements, node, master_port=port, address_of=lambda _n: "127.0.0.1")
        spec = LaunchSpec(
            job_id=JOB,
            command=(sys.executable, str(WORKER), str(tmp / "out"), str(steps), str(step_sleep)),
            ranks=ranks,
            rendezvous=rdzv,
            log_dir=tmp / "logs" / node,
            checkpoint_dir=checkpoint_dir_for(tmp / "ckpt", JOB),
            env={"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"},
            teardown_grace_s=10.0,
        )
        relay.sups[node] = GangSupervisor(spec, policy, listener=relay.listener(node))


async def wait_for(path: Path) -> None:
    """Until the worker has written ``path`` (the workers report progress through files)."""

    async def poll() -> None:
        while not await asyncio.to_thread(path.exists):  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), WAIT_S)


def results(tmp: Path) -> dict[int, dict[str, object]]:
    return {r: json.loads((tmp / "out" / f"result-r{r}.json").read_text()) for r in range(WORLD)}


def logs(tmp: Path) -> str:
    return "\n".join(f"--- {p}\n{p.read_text()}" for p in sorted((tmp / "logs").rglob("*.log")))


async def run_all(relay: Relay) -> dict[str, SupervisorOutcome]:
    tasks = {node: asyncio.create_task(sup.run()) for node, sup in relay.sups.items()}
    done = await asyncio.wait_for(asyncio.gather(*tasks.values()), WAIT_S)
    return dict(zip(tasks, done, strict=True))


async def test_gang_allreduces_and_restarts_whole_when_one_rank_is_killed(tmp_path: Path) -> None:
    relay = Relay()
    steps = 40
    policy = RestartPolicy(mode="on_failure", max_restarts=2, backoff_initial_s=0.2)
    gang(tmp_path, free_port(), steps, 0.05, relay, policy)
    runs = asyncio.create_task(run_all(relay))

    await wait_for(tmp_path / "out" / "progress-a0-r3")
    launcher_b = relay.sups["node-b"].launcher
    assert launcher_b is not None and launcher_b.attempt == 0
    os.kill(launcher_b.pids[3], signal.SIGKILL)
    outcomes = await runs

    assert {n: type(o.final).__name__ for n, o in outcomes.items()} == {
        "node-a": "GangCompleted",
        "node-b": "GangCompleted",
    }, logs(tmp_path)
    assert {o.failures for o in outcomes.values()} == {1}
    failed_b = [e for e in relay.events["node-b"] if isinstance(e, GangFailed)]
    assert [(e.attempt, e.reason, e.rank, e.returncode) for e in failed_b] == [(0, "rank_failed", 3, -9)]
    for node in ("node-a", "node-b"):
        assert [e.attempt for e in relay.events[node] if isinstance(e, GangStarted)] == [0, 1]
        assert [e.attempt for e in relay.events[node] if isinstance(e, GangRestarting)] == [1]
    res = results(tmp_path)
    assert {r["attempt"] for r in res.values()} == {1}
    assert {r["acc"] for r in res.values()} == {expected_acc(steps)}
    assert [(r["local_rank"], r["local_world_size"], r["group_rank"]) for r in res.values()] == [
        (0, 2, 0),
        (1, 2, 0),
        (0, 2, 1),
        (1, 2, 1),
    ]
    assert len({r["cuda_visible_devices"] for r in res.values()}) == 4
    assert all(str(r["cuda_visible_devices"]).startswith("GPU-") for r in res.values())
    assert "joined" in (tmp_path / "logs" / "node-b" / f"{JOB}-a0-r3.log").read_text()


async def test_preempted_gang_checkpoints_and_resumes_when_requeued(tmp_path: Path) -> None:
    steps, port = 200, free_port()
    policy = RestartPolicy(mode="never")
    relay = Relay()
    gang(tmp_path, port, steps, 0.03, relay, policy)
    runs = asyncio.create_task(run_all(relay))
    for r in range(WORLD):
        await wait_for(tmp_path / "out" / f"progress-a0-r{r}")

    acks = await asyncio.wait_for(
        asyncio.gather(*(sup.preempt(signal.SIGTERM, grace_s=30.0) for sup in relay.sups.values())), WAIT_S
    )
    outcomes = await runs

    assert all(a.acknowledged for a in acks), (acks, logs(tmp_path))
    assert [a.killed for a in acks] == [(), ()]
    assert sorted(r for a in acks for r in a.acked) == [0, 1, 2, 3]
    assert all(isinstance(o.final, GangStopped) for o in outcomes.values())
    ckpt = checkpoint_dir_for(tmp_path / "ckpt", JOB)
    saved = json.loads((ckpt / "state.json").read_text())
    assert 3 <= saved["step"] < steps
    assert not (tmp_path / "out" / "result-r0.json").exists()

    requeued = Relay()  # the job is requeued and placed again: same checkpoint dir
    gang(tmp_path, free_port(), steps, 0.0, requeued, policy)
    outcomes = await run_all(requeued)

    assert all(type(o.final).__name__ == "GangCompleted" for o in outcomes.values()), logs(tmp_path)
    res = results(tmp_path)
    assert {r["resumed_from"] for r in res.values()} == {saved["step"]}
    assert {r["acc"] for r in res.values()} == {expected_acc(steps)}


async def test_policy_never_gives_up_on_both_nodes(tmp_path: Path) -> None:
    relay = Relay()
    gang(tmp_path, free_port(), 400, 0.05, relay, RestartPolicy(mode="never"))
    runs = asyncio.create_task(run_all(relay))
    await wait_for(tmp_path / "out" / "progress-a0-r0")
    launcher_a = relay.sups["node-a"].launcher
    assert launcher_a is not None
    os.kill(launcher_a.pids[0], signal.SIGKILL)

    outcomes = await runs

    assert {type(o.final).__name__ for o in outcomes.values()} == {"GangGaveUp"}, logs(tmp_path)
    assert all(o.attempts == 1 for o in outcomes.values())
