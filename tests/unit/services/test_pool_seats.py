"""A replica's seats with pools (services.common.pools): which pools it leads first, each seat's settings."""

from __future__ import annotations

import pytest

from gangline.bus import ProcessorSettings
from gangline.core.pools import PoolLayout, PoolLayoutError
from services.common import pools
from services.common.pools import Seat, home_pools, run_seats, seat_settings, seats
from services.common.shell import LeadershipLost

LAYOUT = PoolLayout("spine", ("a", "b", "c"))


def test_a_replica_leads_its_group_or_the_pools_its_ordinal_deals_it() -> None:
    assert home_pools(LAYOUT, group=["b"], instance_id="x", replicas=None) == {"b"}
    assert home_pools(LAYOUT, group=None, instance_id="placement-0", replicas=2) == {"a", "c"}
    assert home_pools(LAYOUT, group=None, instance_id="placement-1", replicas=2) == {"b"}
    assert home_pools(LAYOUT, group=None, instance_id="anything", replicas=None) == {"a", "b", "c"}
    with pytest.raises(PoolLayoutError):
        home_pools(LAYOUT, group=["z"], instance_id="x", replicas=None)
    with pytest.raises(PoolLayoutError):
        home_pools(LAYOUT, group=None, instance_id="no-ordinal-here", replicas=2)


def test_its_own_pools_come_first_and_each_seat_has_its_pools_group_and_partitions() -> None:
    assert seats(LAYOUT, {"c"}) == [Seat("c", 2, True), Seat("a", 0, False), Seat("b", 1, False)]
    base = ProcessorSettings(
        bootstrap_servers="x:9092",
        service="placement",
        instance_id="p0",
        group_id="gangline.placement",
        input_topics=("jobs.events", "jobs.requests"),
    )
    seat = seat_settings(base, Seat("c", 2, True), ["jobs.events", "nodes.inventory"])
    assert seat.group_id == "gangline.placement.pool-c"
    assert seat.input_partitions == {"jobs.events": (2,)}  # jobs.requests: every partition
    assert not seat.group_membership
    leader = seat.model_copy(update={"transactional_role": "leader"})
    assert (
        leader.transactional_id == "gangline.placement.pool-c.leader"
    )  # every replica's seat of c shares it


def test_input_partitions_need_a_processor_without_group_membership() -> None:
    with pytest.raises(ValueError, match="without group membership"):
        ProcessorSettings(
            bootstrap_servers="x:9092",
            service="s",
            instance_id="i",
            group_id="g",
            input_topics=("t",),
            input_partitions={"t": (0,)},
        )


async def test_a_seat_away_from_home_that_gives_its_lock_up_stands_by_again_and_a_home_one_ends_it_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pools, "HANDED_BACK_PAUSE_S", 0.0)
    runs: list[str] = []

    async def run(seat: Seat) -> None:
        runs.append(seat.pool)
        if runs.count(seat.pool) < 3:
            raise LeadershipLost(f"{seat.pool} handed back")

    await run_seats([Seat("b", 1, home=False)], run, standby_delay_s=0)
    assert runs == ["b", "b", "b"]
    with pytest.raises(ExceptionGroup) as ended:
        await run_seats([Seat("a", 0, home=True)], run, standby_delay_s=0)
    assert ended.group_contains(LeadershipLost)
