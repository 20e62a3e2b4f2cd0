"""The lock's assignor: the last holder keeps the lock; without one the smallest member id wins."""

from __future__ import annotations

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from services.common.leader import HOLDER, assign_lock


def test_the_assignor_keeps_the_holder_and_otherwise_picks_the_smallest_member() -> None:
    cluster = ClusterMetadata()
    cluster._partitions = {"lock": {0: object()}}  # partitions_for_topic reads this map
    standby = ConsumerProtocolMemberMetadata(0, ["lock"], b"")
    holder = ConsumerProtocolMemberMetadata(0, ["lock"], HOLDER)
    assert assign_lock(cluster, {"b": holder, "a": standby}) == {"b": {"lock": [0]}, "a": {}}
    assert assign_lock(cluster, {"b": standby, "a": standby}) == {"a": {"lock": [0]}, "b": {}}
    assert assign_lock(cluster, {}) == {}
