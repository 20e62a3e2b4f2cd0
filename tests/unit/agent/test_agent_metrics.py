"""An agent's /metrics: per GPU what NVML reported (the stand-in's figures), and each XID it counted."""

from __future__ import annotations

from pathlib import Path

from agent_node_fakes import FakeBus, make_agent, wait_for
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gangline.events.nodes import GpuHealthChanged
from services.agent.metrics import gpu_figures
from services.common.metrics import ServiceMetrics


async def test_the_agent_serves_xid_counts_ecc_remapped_rows_and_temperature_per_gpu(tmp_path: Path) -> None:
    bus = FakeBus()
    agent = make_agent(tmp_path, bus)
    await agent.start()
    try:
        await wait_for(lambda: len(agent.gpu_samples) == len(agent.registration.gpus), "a health sample")
        agent.inject_xid(0, 92)  # watch only
        agent.inject_xid("gpu0", 94)  # drain: gpu0 degrades
        agent.inject_xid("gpu0", 94)
        await wait_for(lambda: bus.of(GpuHealthChanged), "gpu.health_changed")
        await wait_for(lambda: sum(agent.xid_errors.values()) == 3, "three XIDs counted")
        metrics = ServiceMetrics("agent", process=False, decides=False)
        metrics.add_figures(lambda: gpu_figures([agent]))
        text = generate_latest(metrics.registry).decode()
    finally:
        await agent.stop()
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    node = agent.node
    assert found[("gangline_gpu_xid_errors_total", (("gpu", "gpu0"), ("node", node), ("xid", "94")))] == 2
    assert found[("gangline_gpu_xid_errors_total", (("gpu", "gpu0"), ("node", node), ("xid", "92")))] == 1
    gpus = {g.id for g in agent.registration.gpus}
    temperatures = {
        dict(labels)["gpu"] for name, labels in found if name == "gangline_gpu_temperature_celsius"
    }
    assert temperatures == gpus
    sample = agent.gpu_samples[next(iter(sorted(gpus)))]
    if sample.ecc is not None:
        ecc = {dict(labels)["gpu"] for name, labels in found if name == "gangline_gpu_ecc_errors"}
        assert ecc == gpus
    if sample.remapped_rows is not None:
        pending = [v for (name, _), v in found.items() if name == "gangline_gpu_row_remap_pending"]
        assert len(pending) == len(gpus) and set(pending) <= {0.0, 1.0}
