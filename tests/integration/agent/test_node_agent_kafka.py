"""The node agent on the real broker, with the NVML stand-in and the simulated runner.

Each test gets its own topics (``topic_factory``), so agents and readers never see another test's
events. Waits are bounded; nothing asserts on durations.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gangline.agent.node import NodeAgent
from gangline.agent.settings import AgentTopics, NodeAgentSettings
from gangline.agent.simulated import PlannedFailure, SimulatedRunner
from gangline.bus.consumer import EventConsumer
from gangline.bus.producer import EventProducer
from gangline.events.allocations import AllocationGranted, Placement
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import (
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobPreempting,
    JobSpec,
    JobStarted,
    WorkerExited,
)
from gangline.events.nodes import GpuHealthChanged, NodeHeartbeat, NodeRegistered
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn

pytestmark = pytest.mark.kafka
WAIT_S = 30.0


class Tail:
    """Everything published to one topic since the reader started (read from the beginning)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = EventConsumer(bootstrap, [topic], service="test-tail", group_id=None)
        self.seen: list[Envelope] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            for delivery in await self.consumer.getmany(timeout_ms=100):
                self.seen.append(delivery.envelope)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.consumer.stop()

    def of(self, cls: type[Event]) -> list[Envelope]:
        return [e for e in self.seen if isinstance(e.data, cls)]

    async def wait(self, predicate: Callable[[list[Envelope]], bool], what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not predicate(self.seen):
            if loop.time() > deadline:
                raise AssertionError(f"gave up waiting for {what}; saw {[e.type for e in self.seen]}")
            await asyncio.sleep(0.05)


class Cluster:
    """Agents on this test's own topics, a producer for the test's own events, and tails of every topic."""

    def __init__(self, bootstrap: str, topics: AgentTopics, producer: EventProducer, tmp: Path) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.producer = producer
        self.tmp = tmp
        self.agents: list[NodeAgent] = []
        self.tails = {
            name: Tail(bootstrap, getattr(topics, name))
            for name in ("allocations", "events", "inventory", "heartbeats", "health")
        }

    @property
    def agent(self) -> NodeAgent:
        return self.agents[0]

    async def add_agent(self, node: str, runner: SimulatedRunner | None = None) -> NodeAgent:
        settings = NodeAgentSettings(
            node=node,
            leaf="leaf-1",
            spine="spine-1",
            checkpoint_root=self.tmp / node / "ckpt",
            log_dir=self.tmp / node / "logs",
            kafka_bootstrap=self.bootstrap,
            topics=self.topics,
            heartbeat_interval_s=0.2,
            xid_idle_s=0.02,
            xid_poll_ms=0,
            spec_wait_s=2.0,
            restart_backoff_s=0.1,
            peer_address="127.0.0.1",
        )
        agent = NodeAgent(
            settings,
            nvml_api=NvmlStandIn(load_builtin_spec("dgx-h100", node=node)),
            runner=runner or SimulatedRunner(time_scale=0.001, checkpoint_delay_s=0.05),
            producer=self.producer,
        )
        await agent.start()
        self.agents.append(agent)
        return agent

    async def send(self, topic: str, data: Event, event_id: str | None = None) -> Envelope:
        env = make_envelope(
            data, event_id=event_id or str(uuid.uuid4()), source="gangline/test", time=datetime.now(UTC)
        )
        await self.producer.publish(topic, env)
        return env

    async def resend(self, topic: str, env: Envelope) -> None:
        await self.producer.publish(topic, env)


@pytest.fixture
async def cluster(
    kafka_bootstrap: str, topic_factory: Callable[..., object], tmp_path: Path
) -> AsyncIterator[Cluster]:
    made = {}
    for name, key in (
        ("allocations", "job_id"),
        ("events", "job_id"),
        ("inventory", "node"),
        ("heartbeats", "node"),
        ("health", "node"),
    ):
        made[name] = (await topic_factory(partitions=1, key=key)).name  # type: ignore[misc]
    async with EventProducer(kafka_bootstrap) as producer:
        c = Cluster(kafka_bootstrap, AgentTopics(**made), producer, tmp_path)
        for tail in c.tails.values():
            await tail.start()
        try:
            await c.add_agent(f"node-{uuid.uuid4().hex[:6]}")
            yield c
        finally:
            for agent in c.agents:
                await agent.stop()
            for tail in c.tails.values():
                await tail.stop()


def grant(job: str, allocation: str, node: str, gpus: list[str]) -> AllocationGranted:
    return AllocationGranted(
        job_id=job,
        allocation_id=allocation,
        queue="default",
        placements=tuple(Placement(rank=i, node=node, gpus=(g,)) for i, g in enumerate(gpus)),
    )


def admitted(job: str, workers: int, duration_s: int) -> JobAdmitted:
    spec = JobSpec(queue="default", workers=workers, gpus_per_worker=1, duration_hint_s=duration_s)
    return JobAdmitted(job_id=job, spec=spec)


async def test_agent_registers_its_dgx_and_heartbeats(cluster: Cluster) -> None:
    inventory, heartbeats = cluster.tails["inventory"], cluster.tails["heartbeats"]
    await inventory.wait(lambda seen: len(seen) >= 1, "node.registered")
    await heartbeats.wait(lambda seen: len(seen) >= 3, "three heartbeats")
    reg = inventory.of(NodeRegistered)[0].data
    assert isinstance(reg, NodeRegistered)
    assert reg.node == cluster.agent.node and len(reg.gpus) == 8
    assert {g.model for g in reg.gpus} == {"H100-80GB-HBM3"}
    assert all(len(g.nvlink_peers) == 7 for g in reg.gpus)  # one NVSwitch domain
    assert (reg.leaf, reg.spine) == ("leaf-1", "spine-1")
    beats = [e.data for e in heartbeats.of(NodeHeartbeat)]
    assert [b.seq for b in beats[:3]] == [0, 1, 2]  # type: ignore[attr-defined]
    assert all(len(b.gpus) == 8 for b in beats)  # type: ignore[attr-defined]


async def test_a_grant_runs_a_simulated_job_once_and_reports_its_life(cluster: Cluster) -> None:
    node, events = cluster.agent.node, cluster.tails["events"]
    await cluster.send(cluster.topics.events, admitted("job-k1", workers=2, duration_s=1500))
    the_grant = await cluster.send(
        cluster.topics.allocations, grant("job-k1", "alloc-k1", node, ["gpu0", "gpu1"])
    )
    await cluster.resend(cluster.topics.allocations, the_grant)  # redelivered
    await cluster.send(cluster.topics.allocations, grant("job-k1", "alloc-k1", node, ["gpu0", "gpu1"]))
    await events.wait(lambda seen: any(isinstance(e.data, JobCompleted) for e in seen), "job.completed")
    await cluster.agent.flush()
    await asyncio.sleep(0.5)  # would-be duplicates have had time to show up
    mine = [e for e in events.seen if e.source == cluster.agent.settings.source]
    assert [type(e.data).__name__ for e in mine] == [
        "JobStarted",
        "WorkerExited",
        "WorkerExited",
        "JobCompleted",
    ]
    assert all(e.causationid == the_grant.id for e in mine)
    runner = cluster.agent.runner
    assert isinstance(runner, SimulatedRunner) and len(runner.launches) == 1
    (done,) = [e.data for e in mine if isinstance(e.data, JobCompleted)]
    assert done.allocation_id == "alloc-k1" and done.gpu_seconds is not None
    # The agent reports the end only: placement writes the release (DESIGN §3), the agent nothing there.
    written = [e for e in cluster.tails["allocations"].seen if e.source == cluster.agent.settings.source]
    assert written == []


async def test_job_preempting_is_answered_with_job_checkpointed(cluster: Cluster) -> None:
    node, events = cluster.agent.node, cluster.tails["events"]
    await cluster.send(cluster.topics.events, admitted("job-k2", workers=1, duration_s=10_000_000))
    await cluster.send(cluster.topics.allocations, grant("job-k2", "alloc-k2", node, ["gpu3"]))
    await events.wait(lambda seen: any(isinstance(e.data, JobStarted) for e in seen), "job.started")
    ask = await cluster.send(
        cluster.topics.events,
        JobPreempting(
            job_id="job-k2",
            allocation_id="alloc-k2",
            deadline=datetime.now(UTC) + timedelta(seconds=10),
            reason="a priority-100 job needs the GPUs",
        ),
    )
    await events.wait(lambda seen: any(isinstance(e.data, JobCheckpointed) for e in seen), "job.checkpointed")
    ckpt = events.of(JobCheckpointed)[0]
    assert ckpt.causationid == ask.id
    assert ckpt.data.checkpoint == str(cluster.agent.settings.checkpoint_root / "job-k2")  # type: ignore[attr-defined]
    exits = [e.data for e in events.of(WorkerExited)]
    assert [(e.rank, e.exit_code) for e in exits] == [(0, 0)]  # type: ignore[attr-defined]
    assert events.of(JobCompleted) == []


async def test_an_injected_xid_79_is_reported_on_nodes_health(cluster: Cluster) -> None:
    health = cluster.tails["health"]
    cluster.agent.inject_xid("gpu5", 79)
    await health.wait(lambda seen: len(seen) >= 1, "gpu.health_changed")
    changed = health.of(GpuHealthChanged)[0]
    assert changed.subject == cluster.agent.node
    data = changed.data
    assert isinstance(data, GpuHealthChanged)
    assert (data.gpu, data.previous, data.state) == ("gpu5", "healthy", "failed")
    heartbeats = cluster.tails["heartbeats"]
    await heartbeats.wait(
        lambda seen: any(not g.healthy for g in seen[-1].data.gpus),  # type: ignore[attr-defined]
        "a heartbeat showing the failed GPU",
    )


async def test_a_rank_failing_on_one_node_restarts_the_gang_on_both(cluster: Cluster) -> None:
    a = cluster.agent
    runner_b = SimulatedRunner(time_scale=0.001)
    runner_b.plan_failure("job-k3", PlannedFailure(after_s=0.1, rank=1, exit_code=9, attempts=(0,)))
    b = await cluster.add_agent(f"node-{uuid.uuid4().hex[:6]}", runner_b)
    events = cluster.tails["events"]
    await cluster.send(cluster.topics.events, admitted("job-k3", workers=2, duration_s=1500))
    gang = AllocationGranted(
        job_id="job-k3",
        allocation_id="alloc-k3",
        queue="default",
        placements=(
            Placement(rank=0, node=a.node, gpus=("gpu0",)),
            Placement(rank=1, node=b.node, gpus=("gpu0",)),
        ),
    )
    await cluster.send(cluster.topics.allocations, gang)
    await events.wait(lambda seen: any(isinstance(e.data, JobCompleted) for e in seen), "job.completed")
    exits = [e.data for e in events.of(WorkerExited)]
    assert isinstance(exits[0], WorkerExited)
    by_attempt = sorted((e.restarts, e.node == a.node, e.exit_code, e.signal) for e in exits)  # type: ignore[attr-defined]
    assert by_attempt == [
        (0, False, 9, None),  # b's rank 1 failed
        (0, True, None, 15),  # a tore rank 0 down on b's report
        (1, False, 0, None),  # both restarted and finished
        (1, True, 0, None),
    ]
    completed = events.of(JobCompleted)
    assert len(completed) == 1 and completed[0].source == a.settings.source
