"""One active replica per decision domain: a Kafka consumer group used as a lock.

Every replica joins the group ``<group>.leader`` on a one-partition topic; Kafka assigns that
partition to exactly one member, which is the leader. The others wait in :meth:`Leadership.acquire`.
When the leader dies its session times out (``LOCK_SESSION_TIMEOUT_MS``: 1.5 s), Kafka reassigns the
partition and a standby proceeds (restores state from the log and starts processing). The lock's
membership runs on its own thread (:class:`Leadership`), so a busy service loop does not let it lapse.

The lock is sticky. A standby joining (or a crashed leader coming back) makes the group rebalance,
and the classic protocol revokes every partition from every member first; the assignor
(:func:`_sticky_lock_assignor`) hands the partition back to the member that held it, which each
member states in its join metadata. So a revocation alone is not a loss: the holder keeps deciding
through the rebalance and only stops when an assignment arrives without the partition (it was cut
off past its session timeout and another member got the lock). Such a zombie claims the lock when it
comes back, as the new holder does: each acquisition has an epoch (in the assignment every member
reads), and the later one wins (:func:`assign_lock`), so the zombie learns it lost and exits. It cannot
commit what it decided meanwhile: the services that lead share one transactional id per role
(:mod:`services.common.shell`), and the new leader's producer fences the old one's.

A lock can have a *home* member (a pool's own replica, :mod:`services.common.pools`): it says so in its
claim. When the holder is not home and a home member joins, the assignor hands the lock over to it at a
new epoch: the holder learns it at that assignment (as a cut-off holder does) and stops, and the home
member fences it before deciding, so nothing the old holder did not commit survives it and everything it
committed is in the log the home member restores from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from gangline.bus.security import client_options

log = logging.getLogger(__name__)

HOLDER = b"gangline-lock-holder"
"""Join metadata of the member that held the lock in the previous generation (then its epoch)."""
SEEN = b"gangline-lock-seen"
"""Join metadata of a member that does not hold the lock (then the lock's latest epoch it saw)."""
HOME = b"home"
"""After the epoch: the member is the lock's home (the lock goes back to it from a holder that is not)."""

LOCK_SESSION_TIMEOUT_MS = 1_500
"""How long a silent holder keeps the lock: the most of a failover's time (the broker allows 1 s and up:
``group.min.session.timeout.ms`` in deploy/kafka/server.properties.template)."""


class Leadership:
    """The lock of one replica. Its group membership lives on a thread of its own, with its own event
    loop, so its heartbeats go on while the service's loop is busy (a long batch, a restore, a garbage
    collection): the lock can be short without a slow batch losing it. Only a stop of the whole process
    (or of its connection to the broker, or of the broker itself) for ``session_timeout_ms`` hands the lock
    over; a holder that comes back from that is fenced (the module docstring) and exits when it learns the
    lock moved."""

    def __init__(
        self,
        bootstrap: str,
        *,
        group_id: str,
        topic: str,
        member: str,
        session_timeout_ms: int = LOCK_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int | None = None,
        home: bool = False,
    ) -> None:
        self._bootstrap = bootstrap
        self._home = home
        """Claim the lock as its home: a holder that is not home hands it over (module docstring)."""
        self._group_id = group_id
        self._topic = topic
        self._member = member
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms or max(100, session_timeout_ms // 6)
        self.held = asyncio.Event()
        self.lost = asyncio.Event()
        """Set (on the caller's loop) once the lock was held and then went to another member, or its
        membership failed: whether it is still held cannot be known then."""
        self._holds = False
        self._lost = False
        self._epoch = 0
        """The lock's epoch this replica holds, or the latest it saw (:func:`assign_lock`)."""
        self._caller: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        """Set once the membership's loop runs (or its thread ended): from then on it can be stopped."""
        self._ended: asyncio.Future[None] | None = None

    def holding(self) -> bool:
        """Whether this replica holds the lock now (acquired and not lost)."""
        return self._holds and not self._lost

    def _claim(self) -> bytes:
        return lock_claim(holding=self.holding(), epoch=self._epoch, home=self._home)

    def _learn(self, epoch: int) -> None:
        self._epoch = max(self._epoch, epoch)

    async def acquire(self) -> None:
        """Wait until this replica holds the lock (raises if its membership failed before)."""
        self._caller = asyncio.get_running_loop()
        self._ended = self._caller.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(self._started,), name=f"leadership-{self._member}", daemon=True
        )
        self._thread.start()
        await asyncio.to_thread(self._started.wait)
        held: asyncio.Future[Any] = asyncio.ensure_future(self.held.wait())
        ended: asyncio.Future[Any] = self._ended
        try:
            await asyncio.wait({held, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            held.cancel()
        if not self.held.is_set():
            self._ended.result()  # the membership ended before the lock was held: its error
            raise RuntimeError(f"the lock's membership of {self._member} ended before it held the lock")
        log.info("leadership acquired", extra={"member": self._member, "topic": self._topic})

    async def release(self) -> None:
        """Leave the lock's group (a standby takes over at once) and end the membership's thread."""
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(self._started.wait)  # acquire may have been cancelled before it ran
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(stopping.set)
        if thread is not None:
            await asyncio.to_thread(thread.join)

    # -- on the membership's own thread ------------------------------------------------------------

    def _run(self, started: threading.Event) -> None:
        error: BaseException | None = None
        try:
            asyncio.run(self._keep(started))
        except BaseException as e:  # reported to the caller's loop, not lost with the thread
            error = e
        finally:
            started.set()
            self._to_caller(self._ended_with, error)

    async def _keep(self, started: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        started.set()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            **client_options(),
            group_id=self._group_id,
            client_id=f"{self._group_id}-{self._member}",
            enable_auto_commit=False,
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=self._heartbeat_interval_ms,
            partition_assignment_strategy=(_sticky_lock_assignor(self._claim, self._learn),),
        )
        consumer.subscribe([self._topic], listener=_Listener(self))
        await consumer.start()
        try:
            while not self._stopping.is_set():
                # aiokafka leaves the group when getmany is not called within max_poll_interval_ms.
                consumer.pause(*consumer.assignment())
                await consumer.getmany(timeout_ms=200)
        finally:
            await consumer.stop()

    def _to_caller(self, callback: Callable[..., None], *args: object) -> None:
        if self._caller is not None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
                self._caller.call_soon_threadsafe(callback, *args)

    def _ended_with(self, error: BaseException | None) -> None:
        """On the caller's loop: the membership ended (released, or failed)."""
        if self._holds and not self._lost and error is not None:
            log.warning("leader lock's membership failed: %r", error, extra={"member": self._member})
            self._lost = True
            self.lost.set()
        if self._ended is not None and not self._ended.done():
            if error is not None and not isinstance(error, asyncio.CancelledError):
                self._ended.set_exception(error)
            else:
                self._ended.set_result(None)

    def _assigned(self, partitions: list[TopicPartition]) -> None:
        if partitions:
            if not self._holds:
                self._holds = True
                self._to_caller(self.held.set)
            return
        if self._holds and not self._lost:
            log.warning("leadership lost", extra={"member": self._member})
            self._lost = True
            self._to_caller(self.lost.set)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no type hints
    def __init__(self, leadership: Leadership) -> None:
        self._leadership = leadership

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Every rebalance revokes first; whether the lock moved is known only at assignment."""

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._leadership._assigned(list(assigned))


def _sticky_lock_assignor(
    claim: Callable[[], bytes], learn: Callable[[int], None]
) -> type[AbstractPartitionAssignor]:
    """An assignor giving every partition of the lock topic to one member (:func:`assign_lock`); each
    member states its claim in its join metadata (``claim``) and learns the lock's epoch from its
    assignment (``learn``)."""

    class StickyLockAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
        name = "gangline-sticky-lock"
        version = 0

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(cls.version, sorted(topics), claim())

        @classmethod
        def assign(
            cls, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
        ) -> dict[str, ConsumerProtocolMemberAssignment]:
            assigned, epoch = assign_lock(cluster, members, now_ms=int(time.time() * 1000))
            return {
                member: ConsumerProtocolMemberAssignment(cls.version, sorted(topics.items()), b"%d" % epoch)
                for member, topics in assigned.items()
            }

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            with contextlib.suppress(ValueError):
                learn(int(assignment.user_data or b"0"))

    return StickyLockAssignor


def lock_claim(*, holding: bool, epoch: int, home: bool = False) -> bytes:
    """A member's join metadata: whether it holds the lock, the lock's epoch it holds or last saw, and
    whether it is the lock's home."""
    return (HOLDER if holding else SEEN) + b" %d" % epoch + (b" " + HOME if home else b"")


def read_claim(user_data: bytes) -> tuple[bool, int]:
    """``(holding, epoch)`` of a member's join metadata (an older member's bare ``HOLDER``: epoch 0)."""
    kind, *rest = (user_data or b"").split(b" ")
    try:
        number = int(rest[0]) if rest else 0
    except ValueError:
        number = 0
    return kind == HOLDER, number


def claims_home(user_data: bytes) -> bool:
    """Whether a member's join metadata says it is the lock's home."""
    return HOME in (user_data or b"").split(b" ")[2:]


def assign_lock(
    cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata], *, now_ms: int = 0
) -> tuple[dict[str, dict[str, list[int]]], int]:
    """``({member: {topic: [partition, ...]}}, epoch)`` with every subscribed partition on one member.

    The lock stays with a member that holds it; when two claim it (one was cut off past its session,
    another got the lock, and the first came back before it learnt so) the later epoch wins. Without a
    holder the member with the smallest id gets it at a new epoch: after every epoch any member saw,
    and no earlier than ``now_ms`` (so a new holder outranks one that was cut off, even when no member
    still in the group saw that one's epoch). A holder that is not the lock's home loses it to a home
    member, at a new epoch (the lock handed back); the smallest home member's id first.
    """
    if not members:
        return {}, 0
    claims = {member: read_claim(meta.user_data) for member, meta in members.items()}
    homes = sorted(member for member, meta in members.items() if claims_home(meta.user_data))
    holders = sorted((-epoch, member) for member, (holding, epoch) in claims.items() if holding)
    new_epoch = max(max(e for _, e in claims.values()) + 1, now_ms)
    if holders and (holders[0][1] in homes or not homes):
        epoch, winner = -holders[0][0], holders[0][1]
    else:
        winner = homes[0] if homes else min(members)
        epoch = new_epoch
    topics = sorted({t for meta in members.values() for t in meta.subscription})
    won: dict[str, list[int]] = {}
    for topic in topics:
        partitions = cluster.partitions_for_topic(topic)
        if partitions:
            won[topic] = sorted(partitions)
    return {member: (won if member == winner else {}) for member in members}, epoch
