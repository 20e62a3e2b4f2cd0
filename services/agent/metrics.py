"""The agents' ``/metrics``: per GPU, what NVML said (the DCGM exporter's figures, under Gangline names).

Read at scrape time from each :class:`~gangline.agent.node.NodeAgent`'s latest health sample (taken every
heartbeat) and the XID events its watcher saw. One process may run many agents (the stand-in cluster):
every series names its node.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

from prometheus_client.core import Metric

from gangline.agent.node import NodeAgent
from gangline.telemetry.metrics import counter, gauge, serving
from services.common.metrics import ServiceMetrics

SERVICE = "agent"


def gpu_figures(agents: Iterable[NodeAgent]) -> list[Metric]:
    """XID errors, ECC errors, remapped rows (and whether a remap is pending) and temperature, per GPU."""
    xids = counter("gangline_gpu_xid_errors_total")
    ecc = gauge("gangline_gpu_ecc_errors")
    remapped = gauge("gangline_gpu_remapped_rows")
    remap_pending = gauge("gangline_gpu_row_remap_pending")
    temperature = gauge("gangline_gpu_temperature_celsius")
    for agent in agents:
        node = agent.node
        for (gpu, xid), count in sorted(agent.xid_errors.items()):
            xids.add_metric([node, gpu, str(xid)], count)
        for gpu, sample in sorted(agent.gpu_samples.items()):
            if sample.temperature_c is not None:
                temperature.add_metric([node, gpu], sample.temperature_c)
            if sample.ecc is not None:
                ecc.add_metric([node, gpu, "corrected", "volatile"], sample.ecc.corrected_volatile)
                ecc.add_metric([node, gpu, "uncorrected", "volatile"], sample.ecc.uncorrected_volatile)
                ecc.add_metric([node, gpu, "corrected", "aggregate"], sample.ecc.corrected_aggregate)
                ecc.add_metric([node, gpu, "uncorrected", "aggregate"], sample.ecc.uncorrected_aggregate)
            rows = sample.remapped_rows
            if rows is not None:
                remapped.add_metric([node, gpu, "correctable"], rows.correctable)
                remapped.add_metric([node, gpu, "uncorrectable"], rows.uncorrectable)
                remap_pending.add_metric([node, gpu], 1 if rows.pending else 0)
    return [xids, ecc, remapped, remap_pending, temperature]


@contextlib.asynccontextmanager
async def serving_agents(
    agents: Callable[[], Iterable[NodeAgent]], *, host: str, port: int | None
) -> AsyncIterator[int | None]:
    """Serve the GPU figures of ``agents()`` (read at each scrape) while the block runs; yields the port."""
    metrics = ServiceMetrics(SERVICE, decides=False)
    metrics.add_figures(lambda: gpu_figures(agents()))
    async with serving(metrics.registry, host=host, port=port) as bound:
        yield bound
