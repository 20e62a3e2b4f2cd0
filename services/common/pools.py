"""One owner per pool: a decision service's replica leads the pools of its group and stands by for the rest.

With pools (``GANGLINE_POOLS``, :mod:`gangline.core.pools`) a pool-owned service (placement first) runs one
*seat* per pool in each replica. A seat is the single-leader machinery of :mod:`services.common.shell`
for one pool: its own state, its own lock (the group ``<group>.pool-<pool>.leader``), its own consumer
offsets (``<group>.pool-<pool>``), and its own transactional id (``<group>.pool-<pool>.leader``), shared by
every replica's seat of that pool. It reads only the pool's partition of each pooled topic
(:mod:`gangline.bus.pools`) and writes its outputs there.

* **Failover per pool.** A replica's seats for the pools of its group (``GANGLINE_POOL_GROUP``, or by
  StatefulSet ordinal: :func:`home_pools`) join their locks at once; its other seats join after
  ``pool_standby_delay_s``, so each group's replica takes its own pools first and the others wait
  behind it. When a replica dies, its locks lapse after the lock's session (1.5 s) and another replica's
  waiting seats take them over: each restores its pool's state from its pool's partitions and decides.
* **Fencing and exactly once per pool.** A new owner's producer has the pool's transactional id, so its
  ``InitProducerId`` aborts what the dead owner left open and fences it if it comes back; the lock's
  epochs make a zombie learn it lost and exit. Everything a pool decides is in the pool's partitions,
  read back by the new owner, so a job granted and committed is never granted again, and a grant not
  committed is aborted, never seen.
* **Hand-back.** A home seat claims its pool's lock as the pool's home (:mod:`services.common.leader`):
  when a replica comes back while another holds its pools, the holder's seats hand each lock over at the
  next rebalance (the home seat's join) and go back to standing by. The home seat restores from the
  pool's snapshot and partitions up to their end before it joins the lock (the pool stays decided by the
  holder meanwhile), then fences the pool's transactional id (the holder's open transaction is aborted,
  and it can commit nothing more) and reads the short tail the holder committed since: every grant the
  holder committed is in it, none is lost or made twice.
* A home seat that loses its lock ends the whole replica (as a lone leader does): it restarts as a
  standby. Another seat that loses its lock (handed back, or fenced) starts again as a standby for it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from gangline.bus import ProcessorFailed, ProcessorSettings, Refusal, Select
from gangline.bus.pools import to_pool
from gangline.core.pools import PoolLayout, PoolLayoutError
from services.common.metrics import ServiceMetrics
from services.common.shell import Decide, EndBatch, LeadershipLost, Restorable, restore_and_process
from services.common.snapshots import SnapshotSettings, Snapshotted
from services.common.topics import TopicNames

log = logging.getLogger(__name__)

POOL_STANDBY_DELAY_S = 5.0
"""How long a replica waits before it stands by for pools outside its group (their own replica goes first)."""


HANDED_BACK_PAUSE_S = 0.5
"""How long a seat that gave its lock up waits before it joins again as a standby."""


@dataclass(frozen=True)
class Seat:
    """One pool as one replica holds or waits for it."""

    pool: str
    partition: int
    home: bool
    """In this replica's group: it joins the pool's lock at once (else after the standby delay)."""


def home_pools(
    layout: PoolLayout, *, group: Sequence[str] | None, instance_id: str, replicas: int | None
) -> set[str]:
    """The pools a replica leads first: ``group`` when given; else, with ``replicas``, the pools whose index
    is the replica's ordinal modulo ``replicas`` (the ``-N`` ending of a StatefulSet pod's name); else all."""
    if group:
        unknown = set(group) - set(layout.pools)
        if unknown:
            raise PoolLayoutError(f"pool group names pools not in the layout: {sorted(unknown)}")
        return set(group)
    if replicas:
        match = re.search(r"-(\d+)$", instance_id)
        if match is None:
            raise PoolLayoutError(f"instance id {instance_id!r} has no -N ordinal to pick its pools by")
        ordinal = int(match.group(1))
        return {pool for i, pool in enumerate(layout.pools) if i % replicas == ordinal % replicas}
    return set(layout.pools)


def seats(layout: PoolLayout, home: Iterable[str]) -> list[Seat]:
    """Every pool of the layout as this replica's seat, its group's first."""
    mine = set(home)
    every = [Seat(pool, layout.partition(pool), pool in mine) for pool in layout.pools]
    return sorted(every, key=lambda seat: (not seat.home, seat.partition))


def seat_settings(base: ProcessorSettings, seat: Seat, pooled_topics: Iterable[str]) -> ProcessorSettings:
    """``base`` for one pool's seat: its group (offsets, lock, transactional id) and its partitions."""
    pooled = set(pooled_topics)
    return base.model_copy(
        update={
            "group_id": f"{base.group_id}.pool-{seat.pool}",
            "input_partitions": {t: (seat.partition,) for t in base.input_topics if t in pooled},
            "group_membership": False,
        }
    )


async def run_seats(
    all_seats: Sequence[Seat],
    run: Callable[[Seat], Awaitable[None]],
    *,
    standby_delay_s: float = POOL_STANDBY_DELAY_S,
) -> None:
    """Run every seat until one ends (a lost lock, a failure): then the others are cancelled and it raises."""

    async def seat_task(seat: Seat) -> None:
        if not seat.home:
            await asyncio.sleep(standby_delay_s)
        while True:
            log.info("pool seat waiting for its lock", extra={"pool": seat.pool, "home": seat.home})
            try:
                await run(seat)
                return
            except (LeadershipLost, ProcessorFailed) as error:
                if seat.home:
                    raise
                # Handed back to the pool's own replica (or fenced by it): stand by again, afresh.
                log.info("pool seat gave its lock up", extra={"pool": seat.pool, "why": repr(error)})
                await asyncio.sleep(HANDED_BACK_PAUSE_S)

    async with asyncio.TaskGroup() as group:
        for seat in all_seats:
            group.create_task(seat_task(seat), name=f"pool-{seat.pool}")


class SeatState(Restorable, Snapshotted, Protocol):
    """A pool seat's state: restored from the pool's partitions and snapshotted on the pool's partition."""


async def restore_and_process_seat(
    seat: Seat,
    base: ProcessorSettings,
    state: SeatState,
    decide: Decide,
    *,
    service: str,
    topics: TopicNames,
    restore_topics: Sequence[str],
    snapshots: SnapshotSettings,
    snapshot_config: Mapping[str, Any],
    metrics: ServiceMetrics,
    select: Select,
    restore_select: Select | None = None,
    end_batch: EndBatch | None = None,
    refusal: Refusal | None = None,
    started: datetime | None = None,
) -> None:
    """:func:`~services.common.shell.restore_and_process` for one pool's seat of ``service``: the pool's
    partitions, its lock on the inventory topic (``base``'s group, :func:`seat_settings`), its snapshot."""
    await restore_and_process(
        seat_settings(base, seat, topics.pooled()),
        state,
        decide,
        restore_topics=restore_topics,
        select=select,
        restore_select=restore_select,
        lock_topic=topics.inventory,
        end_batch=end_batch,
        record_inputs=True,
        started=started,
        refusal=refusal,
        metrics=metrics if seat.home else None,
        # Every output to the pool's partition: what the pool decides is read back by its next owner.
        partition_of=to_pool(seat.partition, topics.pooled()),
        # Its own pools come back to it from the replica that took them over while it was away.
        lock_home=seat.home,
        # The pool's state, on the pool's partition of the snapshot topic: its next owner loads it.
        snapshots=snapshots.state_snapshots(
            state,
            topic=topics.snapshots(service),
            service=service,
            restore_topics=restore_topics,
            config={**snapshot_config, "pool": seat.pool},
            partition=seat.partition,
        ),
    )
