"""One active replica per decision domain: a Kafka consumer group used as a lock.

Every replica joins the group ``<group>.leader`` on a one-partition topic; Kafka assigns that
partition to exactly one member, which is the leader. The others wait in :meth:`Leadership.acquire`.
When the leader dies its session times out, Kafka reassigns the partition and a standby proceeds
(restores state from the log and starts processing). A leader that loses the partition (cut off
past its session timeout) sees :attr:`Leadership.lost` set and must stop deciding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

log = logging.getLogger(__name__)


class Leadership:
    def __init__(
        self, bootstrap: str, *, group_id: str, topic: str, member: str, session_timeout_ms: int = 10_000
    ) -> None:
        self._topic = topic
        self._member = member
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            client_id=f"{group_id}-{member}",
            enable_auto_commit=False,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(100, session_timeout_ms // 5),
        )
        self.held = asyncio.Event()
        self.lost = asyncio.Event()
        self._keepalive: asyncio.Task[None] | None = None

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
            self.held.set()

    def _revoked(self, partitions: list[TopicPartition]) -> None:
        if partitions and self.held.is_set():
            log.warning("leadership lost", extra={"member": self._member})
            self.lost.set()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no type hints
    def __init__(self, leadership: Leadership) -> None:
        self._leadership = leadership

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self._leadership._revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._leadership._assigned(list(assigned))
