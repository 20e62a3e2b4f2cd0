"""``report_repeated_errors``: errors that leave a GPU's state as it was are still reported, once each."""

from __future__ import annotations

from pathlib import Path

from agent_node_fakes import FakeBus, settings, wait_for

from gangline.agent.node import NodeAgent
from gangline.agent.simulated import SimulatedRunner
from gangline.events.nodes import GpuErrorReported, GpuHealthChanged, NodeHeartbeat
from gangline.events.types import GpuId
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn


def agent_on(tmp: Path, bus: FakeBus, api: NvmlStandIn, *, report: bool) -> NodeAgent:
    return NodeAgent(
        settings(tmp, report_repeated_errors=report),
        nvml_api=api,
        runner=SimulatedRunner(time_scale=0.001),
        producer=bus,
        consume=False,
    )


async def test_job_fault_xids_and_correctable_ecc_are_reported_each_time(tmp_path: Path) -> None:
    bus = FakeBus()
    api = NvmlStandIn(load_builtin_spec("sim-2gpu", node="n0"))
    agent = agent_on(tmp_path, bus, api, report=True)
    await agent.start()
    try:
        agent.inject_xid("gpu1", 13)
        agent.inject_xid("gpu1", 31)
        api.correctable_ecc(0, count=2)
        agent.inject_xid("gpu0", 45)  # cleanup noise: not reported
        await wait_for(lambda: len(bus.of(GpuErrorReported)) >= 4, "four reports")
        agent.inject_xid("gpu0", 79)  # a real change: published as the change, not as a report
        await wait_for(lambda: agent.health[GpuId("gpu0")] == "failed", "gpu0 failed")
        await agent.flush()
        reports = [(c.gpu, c.state, c.cause.kind, c.cause.xid) for c in bus.of(GpuErrorReported)]
        assert reports == [
            ("gpu1", "healthy", "xid", 13),
            ("gpu1", "healthy", "xid", 31),
            ("gpu0", "healthy", "ecc", None),
            ("gpu0", "healthy", "ecc", None),
        ]
        changes = [(c.gpu, c.previous, c.state) for c in bus.of(GpuHealthChanged)]
        assert changes == [("gpu0", "healthy", "failed")]
        assert all(c.cause.message.startswith("ecc.sbe") for c in bus.of(GpuErrorReported)[2:4])
    finally:
        await agent.stop()


async def test_without_the_setting_only_changes_are_published(tmp_path: Path) -> None:
    bus = FakeBus()
    api = NvmlStandIn(load_builtin_spec("sim-2gpu", node="n0"))
    agent = agent_on(tmp_path, bus, api, report=False)
    await agent.start()
    try:
        agent.inject_xid("gpu1", 13)
        api.correctable_ecc(0)
        agent.inject_xid("gpu0", 79)
        await wait_for(lambda: bus.of(GpuHealthChanged), "gpu.health_changed")
        await agent.flush()
        assert [(c.gpu, c.state) for c in bus.of(GpuHealthChanged)] == [("gpu0", "failed")]
        assert bus.of(GpuErrorReported) == []
    finally:
        await agent.stop()


async def test_a_correctable_ecc_counter_jump_is_one_report_with_its_count(tmp_path: Path) -> None:
    bus = FakeBus()
    api = NvmlStandIn(load_builtin_spec("sim-2gpu", node="n0"))
    agent = agent_on(tmp_path, bus, api, report=True)
    await agent.start()
    try:
        await wait_for(lambda: len(bus.of(NodeHeartbeat)) >= 2, "a baseline sample")
        api.correctable_ecc(1, 40, announced=False)  # the counter moved, no event announced it
        await wait_for(lambda: bus.of(GpuErrorReported), "the jump reported")
        await agent.flush()
        [jump] = bus.of(GpuErrorReported)
        assert (jump.gpu, jump.state, jump.count, jump.cause.kind) == ("gpu1", "healthy", 40, "ecc")
        assert jump.cause.message.startswith("ecc.sbe") and "40 since the last sample" in jump.cause.message
        assert bus.of(GpuHealthChanged) == []  # counted by node_health, not judged by the agent
    finally:
        await agent.stop()
