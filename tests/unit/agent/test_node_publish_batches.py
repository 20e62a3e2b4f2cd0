"""The agent's outbox: what queued while a publish was in flight goes in one ``publish_many``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from agent_node_fakes import FakeBus, settings, wait_for

from gangline.agent.node import BatchPublisher, NodeAgent
from gangline.agent.simulated import SimulatedRunner
from gangline.events.base import Envelope
from gangline.events.nodes import GpuErrorReported, NodeRegistered
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn


class GatedBatchBus(FakeBus):
    """Holds the first publish until :attr:`gate` opens; records each ``publish_many`` batch and fails
    the envelopes :attr:`refuse` names."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.batches: list[list[Envelope]] = []
        self.refuse: set[str] = set()

    async def publish(self, topic: str, envelope: Envelope, *, key: str | None = None) -> None:
        await self.gate.wait()
        await super().publish(topic, envelope, key=key)

    async def publish_many(self, items: Sequence[tuple[str, Envelope]]) -> list[object]:
        self.batches.append([e for _, e in items])
        outcomes: list[object] = []
        for topic, envelope in items:
            if envelope.id in self.refuse:
                outcomes.append(RuntimeError("refused"))
            else:
                await FakeBus.publish(self, topic, envelope)
                outcomes.append(None)
        return outcomes


async def test_events_queued_behind_a_publish_go_in_one_batch_in_order(tmp_path: Path) -> None:
    bus = GatedBatchBus()
    assert isinstance(bus, BatchPublisher)
    api = NvmlStandIn(load_builtin_spec("sim-2gpu", node="n0"))
    agent = NodeAgent(
        settings(tmp_path, report_repeated_errors=True, heartbeat_interval_s=3600),
        nvml_api=api,
        runner=SimulatedRunner(time_scale=0.001),
        producer=bus,
        consume=False,
    )
    await agent.start()
    try:
        for code in (13, 31, 43):  # job-fault XIDs: one report each, queued behind the registration
            agent.inject_xid("gpu1", code)
        await wait_for(lambda: agent._outbox.qsize() >= 3, "three reports queued")
        assert bus.sent == []  # the registration's publish is still held
        bus.gate.set()
        await agent.flush()
    finally:
        await agent.stop()

    assert isinstance(bus.sent[0][1].data, NodeRegistered)  # alone, through publish()
    reports = [e.data.cause.xid for e in bus.batches[0] if isinstance(e.data, GpuErrorReported)]
    assert reports == [13, 31, 43]
    assert [e.data.cause.xid for e in bus.envelopes(GpuErrorReported)] == [13, 31, 43]  # type: ignore[attr-defined]


async def test_an_envelope_refused_in_a_batch_does_not_stop_the_others(tmp_path: Path) -> None:
    bus = GatedBatchBus()
    api = NvmlStandIn(load_builtin_spec("sim-2gpu", node="n0"))
    agent = NodeAgent(
        settings(tmp_path, report_repeated_errors=True, heartbeat_interval_s=3600),
        nvml_api=api,
        runner=SimulatedRunner(time_scale=0.001),
        producer=bus,
        consume=False,
    )
    await agent.start()
    try:
        for code in (13, 31, 43):
            agent.inject_xid("gpu1", code)
        await wait_for(lambda: agent._outbox.qsize() >= 3, "three reports queued")
        queued = [envelope for _, envelope in list(agent._outbox._queue)]  # type: ignore[attr-defined]
        (refused,) = [e for e in queued if isinstance(e.data, GpuErrorReported) and e.data.cause.xid == 31]
        bus.refuse.add(refused.id)
        bus.gate.set()
        await agent.flush()
        published = agent.published
    finally:
        await agent.stop()

    assert [e.data.cause.xid for e in bus.envelopes(GpuErrorReported)] == [13, 43]  # type: ignore[attr-defined]
    assert refused.id in {e.id for e in bus.batches[0]}
    assert published == 1 + len(bus.batches[0]) - 1  # the registration, and the batch less the refused one
