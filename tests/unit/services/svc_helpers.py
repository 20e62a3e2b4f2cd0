"""Building envelopes for handler tests (no Kafka)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gangline.agent.node import registration
from gangline.agent.settings import NodeAgentSettings
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import JobAdmitted, JobSpec
from gangline.events.nodes import NodeRegistered
from gangline.events.types import JobId
from gangline.nvml.reader import NvmlReader
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_ids = itertools.count()


def env(event: Event, *, at: float = 0.0, event_id: str | None = None) -> Envelope:
    return make_envelope(
        event,
        event_id=event_id or f"e{next(_ids)}",
        source="test",
        time=T0 + timedelta(seconds=at),
    )


def admitted(job_id: str, **spec: object) -> Envelope:
    fields: dict[str, object] = {"queue": "default", "workers": 1, "gpus_per_worker": 1, **spec}
    return env(JobAdmitted(job_id=JobId(job_id), spec=JobSpec.model_validate(fields)))


def cluster(*groups: tuple[str, int, int] | tuple[str, int, int, str]) -> ClusterSpec:
    """(name, nodes, gpus per node[, GPU model]) groups of nodes (H100 by default), one leaf per group."""
    return ClusterSpec(
        name="unit",
        groups=tuple(
            NodeGroup(
                name=group[0],
                count=group[1],
                gpu_model=group[3] if len(group) > 3 else "H100-SXM5-80GB",
                gpus_per_node=group[2],
                memory_mib=81920,
                leaf=f"leaf-{group[0]}",
            )
            for group in groups
        ),
    )


def standin_registration(spec: str, node: str, *, leaf: str = "leaf-m") -> NodeRegistered:
    """The node.registered the agent sends for a stand-in node of built-in NVML spec ``spec``."""
    inventory = NvmlReader(NvmlStandIn(load_builtin_spec(spec, node=node)), node=node).inventory()
    settings = NodeAgentSettings(
        node=node, leaf=leaf, spine="spine-0", checkpoint_root=Path("/c"), log_dir=Path("/l")
    )
    return registration(inventory, settings)
