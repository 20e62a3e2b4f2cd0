"""The leader lock on the real broker: one holder, sticky across joins, handed over on death."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest

from gangline.bus.admin import TopicSpec
from services.common.leader import Leadership

TopicFactory = Callable[..., Awaitable[TopicSpec]]

pytestmark = pytest.mark.kafka

SESSION_MS = 2_000


def _lock(bootstrap: str, group: str, topic: str, member: str) -> Leadership:
    return Leadership(bootstrap, group_id=group, topic=topic, member=member, session_timeout_ms=SESSION_MS)


async def _settle() -> None:
    """Long enough for a join to be noticed by heartbeats and a rebalance to finish."""
    await asyncio.sleep(SESSION_MS / 1000 * 2)


async def test_a_joining_standby_neither_takes_nor_breaks_the_lock(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = (await topic_factory(partitions=1)).name
    group = f"lock-{uuid.uuid4().hex[:8]}"
    # "z" sorts after "a": without stickiness the newcomer "a" would win the rebalance.
    first, second = _lock(kafka_bootstrap, group, topic, "z"), _lock(kafka_bootstrap, group, topic, "a")
    await asyncio.wait_for(first.acquire(), 30)
    waiting = asyncio.create_task(second.acquire())
    try:
        await _settle()
        assert first.holding() and not first.lost.is_set()
        assert not second.held.is_set() and not waiting.done()
        await first.release()  # leaves the group: the standby takes over without waiting for a timeout
        await asyncio.wait_for(waiting, 30)
        assert second.holding()
        # The old holder comes back as a standby and does not take the lock back.
        again = _lock(kafka_bootstrap, group, topic, "0")
        rejoining = asyncio.create_task(again.acquire())
        await _settle()
        assert second.holding() and not again.held.is_set()
        rejoining.cancel()
        await again.release()
    finally:
        waiting.cancel()
        await second.release()


async def test_a_holder_whose_loop_is_busy_past_the_session_keeps_the_lock(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """The lock's heartbeats run on a thread of their own: a long synchronous stretch of the service's
    loop (a slow batch, a big restore) does not hand the lock to a standby (here on a loop of its own,
    as in another process)."""
    topic = (await topic_factory(partitions=1)).name
    group = f"lock-{uuid.uuid4().hex[:8]}"
    holder = _lock(kafka_bootstrap, group, topic, "a")
    await asyncio.wait_for(holder.acquire(), 30)
    stop = threading.Event()

    async def standby_waits() -> bool:
        standby = _lock(kafka_bootstrap, group, topic, "b")
        waiting = asyncio.create_task(standby.acquire())
        await asyncio.to_thread(stop.wait)
        waiting.cancel()
        await standby.release()
        return standby.held.is_set()

    standby = asyncio.ensure_future(asyncio.to_thread(asyncio.run, standby_waits()))
    try:
        await _settle()
        time.sleep(SESSION_MS / 1000 * 3)  # noqa: ASYNC251  # the loop blocked, as by a batch 3 sessions long
        await _settle()
        assert holder.holding() and not holder.lost.is_set()
    finally:
        stop.set()
        took_it = await standby
        await holder.release()
    assert not took_it
