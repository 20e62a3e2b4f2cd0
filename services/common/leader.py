"""One active replica per decision domain: a Kafka consumer group used as a lock.

Every replica joins the group ``<group>.leader`` on a one-partition topic; Kafka assigns that
partition to exactly one member, which is the leader. The others wait in :meth:`Leadership.acquire`.
When the leader dies its session times out, Kafka reassigns the partition and a standby proceeds
(restores state from the log and starts processing).

The lock is sticky. A standby joining (or a crashed leader coming back) makes the group rebalance,
and the classic protocol revokes every partition from every member first; the assignor
(:func:`_sticky_lock_assignor`) hands the partition back to the member that held it, which each
member states in its join metadata. So a revocation alone is not a loss: the holder keeps deciding
through the rebalance and only stops when an assignment arrives without the partition (it was cut
off past its session timeout and another member got the lock). Such a zombie cannot commit what
it decided meanwhile: the services that lead share one transactional id per role
(:mod:`services.common.shell`), and the new leader's producer fences the old one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from gangline.bus.security import client_options

log = logging.getLogger(__name__)

HOLDER = b"gangline-lock-holder"
"""Join metadata of the member that held the lock in the previous generation."""


class Leadership:
    def __init__(
        self, bootstrap: str, *, group_id: str, topic: str, member: str, session_timeout_ms: int = 10_000
    ) -> None:
        self._topic = topic
        self._member = member
        self.held = asyncio.Event()
        self.lost = asyncio.Event()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            **client_options(),
            group_id=group_id,
            client_id=f"{group_id}-{member}",
            enable_auto_commit=False,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(100, session_timeout_ms // 5),
            partition_assignment_strategy=(_sticky_lock_assignor(self.holding),),
        )
        self._keepalive: asyncio.Task[None] | None = None

    def holding(self) -> bool:
        """Whether this replica holds the lock now (acquired and not lost)."""
        return self.held.is_set() and not self.lost.is_set()

    async def acquire(self) -> None:
        """Wait until this replica holds the lock."""
        self._consumer.subscribe([self._topic], listener=_Listener(self))
        await self._consumer.start()
        self._keepalive = asyncio.create_task(self._poll())
        await self.held.wait()
        log.info("leadership acquired", extra={"member": self._member, "topic": self._topic})

    async def _poll(self) -> None:
        # aiokafka leaves the group when getmany is not called within max_poll_interval_ms.
        while True:
            self._consumer.pause(*self._consumer.assignment())
            await self._consumer.getmany(timeout_ms=1000)

    async def release(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        await self._consumer.stop()

    def _assigned(self, partitions: list[TopicPartition]) -> None:
        if partitions:
            if not self.held.is_set():
                self.held.set()
            return
        if self.held.is_set() and not self.lost.is_set():
            log.warning("leadership lost", extra={"member": self._member})
            self.lost.set()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no type hints
    def __init__(self, leadership: Leadership) -> None:
        self._leadership = leadership

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Every rebalance revokes first; whether the lock moved is known only at assignment."""

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._leadership._assigned(list(assigned))


def _sticky_lock_assignor(holding: Callable[[], bool]) -> type[AbstractPartitionAssignor]:
    """An assignor giving every partition of the lock topic to one member: the last holder if it
    is still in the group, else the member with the smallest id."""

    class StickyLockAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
        name = "gangline-sticky-lock"
        version = 0

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(cls.version, sorted(topics), HOLDER if holding() else b"")

        @classmethod
        def assign(
            cls, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
        ) -> dict[str, ConsumerProtocolMemberAssignment]:
            return {
                member: ConsumerProtocolMemberAssignment(cls.version, sorted(topics.items()), b"")
                for member, topics in assign_lock(cluster, members).items()
            }

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            pass

    return StickyLockAssignor


def assign_lock(
    cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
) -> dict[str, dict[str, list[int]]]:
    """``{member: {topic: [partition, ...]}}`` with every subscribed partition on one member."""
    if not members:
        return {}
    holders = sorted(m for m, meta in members.items() if meta.user_data == HOLDER)
    winner = holders[0] if holders else min(members)
    topics = sorted({t for meta in members.values() for t in meta.subscription})
    won: dict[str, list[int]] = {}
    for topic in topics:
        partitions = cluster.partitions_for_topic(topic)
        if partitions:
            won[topic] = sorted(partitions)
    return {member: (won if member == winner else {}) for member in members}
