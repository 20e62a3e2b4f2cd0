"""The pool rules (gangline.core.pools): a layout's partitions, one pool holding a gang whole, routing."""

from __future__ import annotations

import pytest

from gangline.core.hardware import GpuOffer, NodeOffer, WorkerAsk
from gangline.core.model import GpuModel, MiB
from gangline.core.pools import PooledHardware, PoolLayout, PoolLayoutError, route

H100 = GpuModel("H100-SXM5-80GB")
L40S = GpuModel("L40S-48GB")


def node(model: GpuModel, gpus: int, spine: str) -> NodeOffer:
    return NodeOffer(tuple(GpuOffer(model, MiB(81920)) for _ in range(gpus)), "", "leaf", spine)


def pooled(**pools: list[NodeOffer]) -> PooledHardware:
    hardware = PooledHardware()
    for name, offers in pools.items():
        for offer in offers:
            hardware.add(name, offer)
    return hardware


def test_a_layout_gives_each_pool_its_index_as_partition_and_reads_the_pool_off_a_label() -> None:
    layout = PoolLayout.parse("spine=spine-a, spine-b")
    assert (layout.label, layout.pools) == ("spine", ("spine-a", "spine-b"))
    assert [layout.partition(p) for p in layout.pools] == [0, 1]
    assert layout.pool_of({"spine": "spine-b", "leaf": "x"}) == "spine-b"
    assert layout.pool_of({"spine": "spine-z"}) is None
    assert str(layout) == "spine=spine-a,spine-b"
    with pytest.raises(PoolLayoutError, match="3 partitions for 4 pools"):
        PoolLayout("spine", ("a", "b", "c", "d")).check_partitions(3, "jobs.events")
    for bad in ("spine", "spine=", "spine=a,a"):
        with pytest.raises(PoolLayoutError):
            PoolLayout.parse(bad)


def test_a_gang_is_held_only_where_one_pool_holds_it_whole() -> None:
    # 2 nodes of 8 per pool: 16 GPUs each, 32 in all.
    hardware = pooled(a=[node(H100, 8, "a"), node(H100, 8, "a")], b=[node(H100, 8, "b"), node(H100, 8, "b")])
    assert hardware.holds(H100, WorkerAsk(workers=2, gpus=8)).ok
    spanning = hardware.holds(H100, WorkerAsk(workers=3, gpus=8))  # 24 GPUs: the cluster has 32, no pool does
    assert not spanning.ok
    assert "in pool a (a gang never spans pools)" in spanning.message
    assert hardware.pools_holding(H100, WorkerAsk(workers=2, gpus=8)) == ["a", "b"]
    assert hardware.pools_holding(L40S, WorkerAsk(workers=1)) == []
    assert hardware.pools_holding(None, WorkerAsk(workers=1)) == ["a", "b"]


def test_routing_picks_the_pool_that_holds_it_with_the_most_room_left_after_what_is_routed_there() -> None:
    hardware = pooled(a=[node(H100, 8, "a")], b=[node(H100, 8, "b"), node(L40S, 4, "b")])
    usable = {"a": {H100: 8}, "b": {H100: 8, L40S: 4}}
    ask = WorkerAsk(workers=1, gpus=4)
    assert route([H100], ask, hardware, usable, {}, ["a", "b"]) == "a"  # a tie: by name
    assert route([H100], ask, hardware, usable, {"a": 4}, ["a", "b"]) == "b"
    assert route([L40S], ask, hardware, usable, {}, ["a", "b"]) == "b"  # only b has the model
    assert route([None], ask, hardware, usable, {}, ["a", "b"]) == "b"  # any model: b has 12
    assert route([H100, L40S], ask, hardware, usable, {"b": 3}, ["a", "b"]) == "b"  # 12 - 3 > 8
    assert route([H100], WorkerAsk(workers=2, gpus=8), hardware, usable, {}, ["a", "b"]) is None
