"""The lock's assignor: the last holder keeps the lock; without one the smallest member id wins."""

from __future__ import annotations

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from services.common.leader import HOLDER, assign_lock, lock_claim, read_claim


def lock_cluster() -> ClusterMetadata:
    cluster = ClusterMetadata()
    cluster._partitions = {"lock": {0: object()}}  # partitions_for_topic reads this map
    return cluster


def member(*, holding: bool, epoch: int) -> ConsumerProtocolMemberMetadata:
    return ConsumerProtocolMemberMetadata(0, ["lock"], lock_claim(holding=holding, epoch=epoch))


def test_the_assignor_keeps_the_holder_and_otherwise_picks_the_smallest_member() -> None:
    cluster = lock_cluster()
    standby, holder = member(holding=False, epoch=3), member(holding=True, epoch=3)
    assert assign_lock(cluster, {"b": holder, "a": standby}) == ({"b": {"lock": [0]}, "a": {}}, 3)
    # Nobody holds it: the smallest member, at a new epoch after every one seen (and not before now).
    assert assign_lock(cluster, {"b": standby, "a": standby}) == ({"a": {"lock": [0]}, "b": {}}, 4)
    assert assign_lock(cluster, {"b": standby}, now_ms=1_000) == ({"b": {"lock": [0]}}, 1_000)
    assert assign_lock(cluster, {}) == ({}, 0)


def test_a_holder_cut_off_and_back_loses_to_the_one_that_took_the_lock_after_it() -> None:
    """The old holder (frozen past its session) claims the lock again as it comes back; the member that
    got it meanwhile holds a later epoch and keeps it, whatever their ids."""
    cluster = lock_cluster()
    zombie, holder = member(holding=True, epoch=3), member(holding=True, epoch=4)
    assert assign_lock(cluster, {"a-old": zombie, "b-new": holder}) == (
        {"a-old": {}, "b-new": {"lock": [0]}},
        4,
    )


def test_a_claim_reads_back_and_an_older_members_bare_claim_is_epoch_zero() -> None:
    assert read_claim(lock_claim(holding=True, epoch=7)) == (True, 7)
    assert read_claim(lock_claim(holding=False, epoch=7)) == (False, 7)
    assert read_claim(HOLDER) == (True, 0)
    assert read_claim(b"") == (False, 0)


def test_a_holder_away_from_home_hands_the_lock_to_its_home_member_at_a_new_epoch() -> None:
    """A pool's own replica back (its seat claims the lock as home) gets the lock from the replica that
    took it over; a home holder keeps it, and a standby that is not home takes nothing from anyone."""
    cluster = lock_cluster()
    home = ConsumerProtocolMemberMetadata(0, ["lock"], lock_claim(holding=False, epoch=3, home=True))
    away, standby = member(holding=True, epoch=3), member(holding=False, epoch=3)
    assert assign_lock(cluster, {"a-away": away, "b-home": home}, now_ms=2) == (
        {"a-away": {}, "b-home": {"lock": [0]}},
        4,
    )
    home_holder = ConsumerProtocolMemberMetadata(0, ["lock"], lock_claim(holding=True, epoch=4, home=True))
    assert assign_lock(cluster, {"a-away": standby, "b-home": home_holder}) == (
        {"a-away": {}, "b-home": {"lock": [0]}},
        4,
    )
    assert assign_lock(cluster, {"a-away": away, "b": standby}) == ({"a-away": {"lock": [0]}, "b": {}}, 3)
    # Nobody holds it: the home member first, whatever the ids.
    assert assign_lock(cluster, {"a": standby, "b-home": home}, now_ms=2) == (
        {"a": {}, "b-home": {"lock": [0]}},
        4,
    )
    assert read_claim(lock_claim(holding=False, epoch=9, home=True)) == (False, 9)
