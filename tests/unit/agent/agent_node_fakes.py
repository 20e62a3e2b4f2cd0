"""Test doubles for the node agent without a broker: a bus that records and fans out, event builders."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from gangline.agent.node import NodeAgent
from gangline.agent.runner import Runner
from gangline.agent.settings import NodeAgentSettings
from gangline.agent.simulated import SimulatedRunner
from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import JobAdmitted, JobPreempting, JobSpec
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn

E = TypeVar("E", bound=Event)
WAIT_S = 10.0


class FakeBus:
    """Records what agents publish; jobs.events goes back to every subscribed agent, as Kafka would."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Envelope]] = []
        self.agents: list[NodeAgent] = []

    async def publish(self, topic: str, envelope: Envelope, *, key: str | None = None) -> None:
        self.sent.append((topic, envelope))
        if topic.endswith("jobs.events"):
            for agent in self.agents:
                await agent.handle(envelope)

    def of(self, cls: type[E], *, topic: str | None = None) -> list[E]:
        return [e.data for t, e in self.sent if isinstance(e.data, cls) and (topic is None or t == topic)]

    def envelopes(self, cls: type[Event]) -> list[Envelope]:
        return [e for _, e in self.sent if isinstance(e.data, cls)]


async def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll until ``predicate()`` holds; fails the test (it never measures how long it took)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.01)


def settings(tmp: Path, node: str = "n0", **over: Any) -> NodeAgentSettings:
    values: dict[str, Any] = {
        "node": node,
        "leaf": "leaf-0",
        "spine": "spine-0",
        "checkpoint_root": tmp / "ckpt",
        "log_dir": tmp / "logs",
        "heartbeat_interval_s": 0.05,
        "xid_idle_s": 0.01,
        "xid_poll_ms": 0,
        "spec_wait_s": 0.0,
        "restart_backoff_s": 0.0,
        "stop_grace_s": 1.0,
        "peer_address": "127.0.0.1",
    }
    values.update(over)
    return NodeAgentSettings(**values)


def make_agent(
    tmp: Path,
    bus: FakeBus,
    *,
    node: str = "n0",
    spec: str = "sim-2gpu",
    runner: Runner | None = None,
    **over: Any,
) -> NodeAgent:
    agent = NodeAgent(
        settings(tmp, node, **over),
        nvml_api=NvmlStandIn(load_builtin_spec(spec, node=node)),
        runner=runner or SimulatedRunner(time_scale=0.001, checkpoint_delay_s=0.01),
        producer=bus,
        consume=False,
    )
    bus.agents.append(agent)
    return agent


def envelope(data: Event, event_id: str | None = None) -> Envelope:
    return make_envelope(
        data, event_id=event_id or str(uuid.uuid4()), source="gangline/test", time=datetime.now(UTC)
    )


def grant(job: str, allocation: str, placements: Sequence[tuple[int, str, tuple[str, ...]]]) -> Envelope:
    return envelope(
        AllocationGranted(
            job_id=job,
            allocation_id=allocation,
            queue="default",
            placements=tuple(Placement(rank=r, node=n, gpus=g) for r, n, g in placements),
        )
    )


def admitted(job: str, *, workers: int = 1, duration_s: int = 1, **spec: Any) -> Envelope:
    return envelope(
        JobAdmitted(
            job_id=job,
            spec=JobSpec(
                queue="default", workers=workers, gpus_per_worker=1, duration_hint_s=duration_s, **spec
            ),
        )
    )


def preempting(job: str, allocation: str, grace_s: float = 5.0) -> Envelope:
    return envelope(
        JobPreempting(
            job_id=job,
            allocation_id=allocation,
            deadline=datetime.now(UTC) + timedelta(seconds=grace_s),
            reason="urgent work needs the GPUs",
        )
    )


def released(job: str, allocation: str, reason: str = "cancelled") -> Envelope:
    return envelope(AllocationReleased(job_id=job, allocation_id=allocation, reason=reason))
