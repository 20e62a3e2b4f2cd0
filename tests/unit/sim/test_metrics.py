"""Metric definitions: percentiles, Jain's index, max-min entitlements, fragmentation."""

from __future__ import annotations

import pytest

from gangline.core.model import (
    DomainId,
    Gpu,
    GpuId,
    GpuMode,
    GpuModel,
    Job,
    JobId,
    MiB,
    Milli,
    Node,
    NodeId,
    QueueName,
)
from gangline.core.snapshot import Snapshot
from gangline.sim.metrics import fragmentation, jain_index, max_min_entitlements, percentile

Q = QueueName


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([], 99) == 0


def test_jain_index() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_max_min_entitlements_cap_small_demands_and_split_the_rest_by_weight() -> None:
    ent = max_min_entitlements({Q("a"): 10, Q("b"): 100, Q("c"): 100}, {Q("b"): 1, Q("c"): 3, Q("a"): 1}, 90)
    assert ent[Q("a")] == pytest.approx(10)  # wants less than its share
    assert ent[Q("b")] == pytest.approx(20)  # the remaining 80 split 1:3
    assert ent[Q("c")] == pytest.approx(60)


def _node(i: int, mode: GpuMode, gpus: int = 4) -> Node:
    nid = NodeId(f"n{i}")
    return Node(
        nid,
        tuple(Gpu(GpuId(f"n{i}-g{k}"), k, GpuModel("A"), MiB(1000), mode=mode) for k in range(gpus)),
        DomainId("l"),
        DomainId("s"),
    )


def test_fragmentation_of_whole_gpus_counts_nodes_too_small_for_any_waiting_worker() -> None:
    snap = Snapshot([_node(0, GpuMode.WHOLE), _node(1, GpuMode.WHOLE)])
    # take 3 GPUs of n0: one free there; n1 has 4 free
    for k in range(3):
        snap._set_owner(snap.gpu_pos[GpuId(f"n0-g{k}")], JobId("x"))
    two = Job(JobId("w"), Q("q"), workers=1, gpus_per_worker=2)
    assert fragmentation(snap, [two]) == (1.0, 5.0)
    one = Job(JobId("v"), Q("q"), workers=1, gpus_per_worker=1)
    assert fragmentation(snap, [two, one]) == (0.0, 5.0)


def test_fragmentation_of_shared_gpus_counts_leftover_shares() -> None:
    snap = Snapshot([_node(0, GpuMode.SHARED, gpus=2)])
    snap._set_milli(0, JobId("x"), 700)  # 300 milli left on g0, g1 whole
    wants_half = Job(JobId("w"), Q("q"), workers=1, gpu_milli=Milli(500))
    frag, free = fragmentation(snap, [wants_half])
    assert frag == pytest.approx(0.3)
    assert free == pytest.approx(1.3)
