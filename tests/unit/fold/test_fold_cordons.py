"""The operators' cordons in the one lifecycle fold: cordoned nodes take no new work, in any fold order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.core.model import NodeId as CoreNodeId
from gangline.core.snapshot import Snapshot
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.nodes import NodeCordoned, NodeUncordoned
from gangline.events.types import NodeId
from gangline.fold.cluster import ClusterFold
from gangline.fold.cordons import NodeCordons

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def env(event: Event, at: float, event_id: str | None = None) -> Envelope:
    return make_envelope(
        event, event_id=event_id or f"e-{at}", source="test", time=T0 + timedelta(seconds=at)
    )


def fold_with_nodes(count: int) -> ClusterFold:
    spec = ClusterSpec(
        name="unit",
        groups=(NodeGroup(name="a", count=count, gpu_model="H100", gpus_per_node=8, memory_mib=81920),),
    )
    fold = ClusterFold(gated=False)
    for registration in spec.registrations():
        fold.fold(env(registration, 0.0, f"reg-{registration.node}"))
    return fold


def cordoned(snap: Snapshot, node: str) -> bool:
    return snap.node_cordoned[snap.node_pos[CoreNodeId(node)]]


def test_the_latest_word_per_node_stands_and_an_older_one_read_again_changes_nothing() -> None:
    cordons = NodeCordons()
    drain = env(NodeCordoned(node=NodeId("a-0"), mode="drain", drain_grace_s=30, reason="bios"), 10.0)
    assert cordons.fold(drain)
    assert cordons.cordoned(NodeId("a-0")) and not cordons.cordoned(NodeId("a-1"))
    assert cordons.evicting(T0 + timedelta(seconds=39)) == []
    assert cordons.evicting(T0 + timedelta(seconds=40)) == ["a-0"]
    assert not cordons.fold(drain)  # the same event again
    back = env(NodeUncordoned(node=NodeId("a-0")), 20.0)
    assert cordons.fold(back)
    assert not cordons.cordoned(NodeId("a-0")) and cordons.evicting(T0 + timedelta(hours=1)) == []
    assert not cordons.fold(drain)  # older than the uncordon: a restore re-reading it
    assert not cordons.cordoned(NodeId("a-0"))


def test_a_cordoned_node_is_cordoned_in_the_snapshot_until_uncordoned() -> None:
    fold = fold_with_nodes(2)
    assert not cordoned(fold.snapshot(), "a-0")
    may_run = fold.fold(env(NodeCordoned(node=NodeId("a-0"), reason="maintenance"), 5.0))
    assert may_run  # less capacity, but a gang reserved on it may now hold nothing back (a cycle)
    assert fold.cordoned(NodeId("a-0")) and not fold.cordoned(NodeId("a-1"))
    snap = fold.snapshot()
    assert cordoned(snap, "a-0") and not cordoned(snap, "a-1")
    assert fold.fold(env(NodeUncordoned(node=NodeId("a-0")), 6.0))  # capacity back: try waiting jobs
    assert not cordoned(fold.snapshot(), "a-0")


def test_registering_again_does_not_lift_an_operators_cordon() -> None:
    fold = fold_with_nodes(1)
    fold.fold(env(NodeCordoned(node=NodeId("a-0")), 5.0))
    [registration] = fold.nodes.values()
    fold.fold(env(registration, 9.0, "reg-again"))
    assert cordoned(fold.snapshot(), "a-0")
