"""Building envelopes for handler tests (no Kafka)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import JobAdmitted, JobSpec
from gangline.events.types import JobId
from services.agent.cluster import ClusterSpec, NodeGroup

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
