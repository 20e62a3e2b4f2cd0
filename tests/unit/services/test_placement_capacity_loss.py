"""Capacity lost under a reservation: the batch that reads a GPU's failure, a node's failure or a cordon
runs a cycle, so the jobs behind a gang that can no longer fit are placed then, not at some later event.

(Found by the restore-order property test of tests/unit/services/test_placement_snapshots.py: a restored
placement placed a one-GPU job the live one had left waiting behind a 2 x 8 gang on 15 healthy GPUs.)
"""

from __future__ import annotations

from typing import Any

import pytest
from svc_helpers import admitted, cluster, env
from test_placement import TOPICS

from gangline.core.defaults import default_profile
from gangline.events.allocations import AllocationGranted
from gangline.events.base import Envelope
from gangline.events.jobs import JobPending
from gangline.events.nodes import GpuHealthChanged, NodeCordoned, NodeFailed
from gangline.events.types import NodeId
from services.placement.handlers import PlacementState, decide


def _gpu_failed(node: str, gpu: str, at: float) -> Envelope:
    return env(
        GpuHealthChanged.model_validate(
            {
                "node": node,
                "gpu": gpu,
                "previous": "healthy",
                "state": "failed",
                "cause": {"kind": "xid", "message": "XID 79", "xid": 79},
            }
        ),
        at=at,
    )


def _waiting_behind_a_gang() -> tuple[PlacementState, list[Any]]:
    """Two 8-GPU nodes; one GPU taken by j1; a 2 x 8 gang j2 holds the other 15 free GPUs back; j3 (one
    GPU) waits behind it."""
    state = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    for node in cluster(("a", 2, 8)).registrations():
        state.restore(env(node))
    outputs: list[Any] = []
    for at, job in enumerate(
        (
            admitted("j1", workers=1, gpus_per_worker=1),
            admitted("j2", workers=2, gpus_per_worker=8),
            admitted("j3", workers=1, gpus_per_worker=1),
        ),
        start=1,
    ):
        job = env(job.data, at=at, event_id=job.id)
        outputs += decide(job, state, now=job.time)
    granted = {e.data.job_id for _, e in outputs if isinstance(e.data, AllocationGranted)}
    pending = {e.data.job_id for _, e in outputs if isinstance(e.data, JobPending)}
    assert granted == {"j1"} and pending == {"j2", "j3"}
    return state, outputs


@pytest.mark.parametrize(
    "loss",
    [
        _gpu_failed("a-1", "gpu3", at=10),
        env(NodeFailed(node=NodeId("a-1"), code="operator", reason="psu"), at=10),
        env(NodeCordoned(node=NodeId("a-1"), reason="bios update"), at=10),
    ],
    ids=["gpu-failed", "node-failed", "cordoned"],
)
def test_a_gang_that_can_no_longer_fit_stops_holding_back_the_jobs_behind_it_in_that_batch(
    loss: Envelope,
) -> None:
    state, _ = _waiting_behind_a_gang()
    decided = decide(loss, state, now=loss.time)
    granted = {e.data.job_id for _, e in decided if isinstance(e.data, AllocationGranted)}
    assert granted == {"j3"}  # the gang needs 16 healthy GPUs of 15 or 8: nothing to hold back for
