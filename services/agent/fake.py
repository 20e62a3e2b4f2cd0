"""Simulated node agents: inventory, heartbeats, "running" placed jobs, checkpoint acknowledgements.

One process runs every node of a :class:`~services.agent.cluster.ClusterSpec`. Like real agents it
publishes ``node.registered`` once per node and ``node.heartbeat`` every ``heartbeat_s``; it reads
``allocations.log`` and ``jobs.events`` and, for each grant on its nodes, publishes ``job.started``,
then after the job's ``duration_hint_s`` (times ``time_scale``) ``job.completed`` and
``allocation.released`` (completed). It answers ``job.preempting`` with ``job.checkpointed``.
``fail_node`` makes a node go silent (and optionally report an XID), as a dying node would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer

from gangline.bus import EventProducer
from gangline.bus.producer import send_envelope
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.codec import DecodeError, decode
from gangline.events.jobs import JobAdmitted, JobCheckpointed, JobCompleted, JobPreempting, JobStarted
from gangline.events.nodes import GpuHealthChanged, GpuStatus, HealthCause, NodeHeartbeat, NodeRegistered
from gangline.events.types import AllocationId, GpuId, JobId, NodeId, Seconds
from gangline.telemetry.tracing import get_tracer
from services.agent.cluster import ClusterSpec
from services.common.ids import derived_id
from services.common.select import select_types
from services.common.topics import TopicNames

log = logging.getLogger(__name__)

AGENT_EVENTS = ("job.admitted", "job.preempting", "allocation.granted", "allocation.released")


@dataclass
class _Running:
    granted: AllocationGranted
    started: datetime
    timer: asyncio.TimerHandle | None = None


@dataclass
class FakeStats:
    registered: int = 0
    heartbeats: int = 0
    started: int = 0
    completed: int = 0
    checkpointed: int = 0


@dataclass
class FakeCluster:
    spec: ClusterSpec
    bootstrap: str
    topics: TopicNames
    group_id: str
    time_scale: float = 1.0
    """Simulated seconds per real second is 1 / time_scale: 0.01 runs a one-hour job in 36 s."""
    heartbeat_s: float = 2.0
    default_duration_s: int | None = None
    """Run time of jobs without a duration hint; None runs them until released."""
    checkpoint_delay_s: float = 0.2
    nodes: dict[NodeId, NodeRegistered] = field(init=False)
    silent: set[NodeId] = field(default_factory=set)
    stats: FakeStats = field(default_factory=FakeStats)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.nodes = {n.node: n for n in self.spec.nodes()}
        self._durations: dict[JobId, int | None] = {}
        self._running: dict[AllocationId, _Running] = {}
        self._seq: dict[NodeId, int] = dict.fromkeys(self.nodes, 0)
        self._producer: EventProducer | None = None
        self._source = f"gangline/agent/{self.spec.name}"

    # -- control -------------------------------------------------------------------------------

    async def fail_node(self, node: NodeId, *, xid: int | None = None) -> None:
        """The node stops heartbeating (and with ``xid`` first reports its GPU 0 failed); its jobs stall."""
        self.silent.add(node)
        for running in list(self._running.values()):
            if node in {p.node for p in running.granted.placements} and running.timer is not None:
                running.timer.cancel()
        if xid is not None:
            gpu = self.nodes[node].gpus[0].id
            event = GpuHealthChanged(
                node=node,
                gpu=gpu,
                previous="healthy",
                state="failed",
                cause=HealthCause(kind="xid", message=f"XID {xid} on {gpu}", xid=xid),
            )
            await self._publish(self.topics.health, event, derived_id(node, "xid", xid, self._seq[node]))

    def running_allocations(self) -> list[AllocationGranted]:
        return [r.granted for r in self._running.values()]

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        async with EventProducer(
            self.bootstrap,
            client_id=f"fake-nodes-{self.spec.name}",
            linger_ms=5,
            chained_topics=(self.topics.allocations,),
        ) as producer:
            self._producer = producer
            await self._register_all()
            consumer = AIOKafkaConsumer(
                self.topics.events,
                self.topics.allocations,
                bootstrap_servers=self.bootstrap,
                group_id=self.group_id,
                enable_auto_commit=True,
                auto_offset_reset="earliest",
                isolation_level="read_committed",
            )
            wanted = select_types(dict.fromkeys(AGENT_EVENTS, True))
            heartbeats = asyncio.create_task(self._heartbeats())
            try:
                await consumer.start()
                self.ready.set()
                while True:
                    batch = await consumer.getmany(timeout_ms=100, max_records=1000)
                    for records in batch.values():
                        for record in records:
                            if not wanted(record):
                                continue
                            try:
                                envelope = decode(record.value or b"")
                            except DecodeError:
                                continue  # the decision services dead-letter it; an agent just ignores it
                            await self._on(envelope)
            finally:
                await consumer.stop()
                heartbeats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeats
                for running in self._running.values():
                    if running.timer is not None:
                        running.timer.cancel()
                self._producer = None

    async def _register_all(self) -> None:
        await self._send_all(
            [
                (self.topics.inventory, n, derived_id(self.spec.name, n.node, "registered"))
                for n in self.nodes.values()
            ]
        )
        self.stats.registered += len(self.nodes)

    async def _heartbeats(self) -> None:
        # Spread over the interval in slices, as independent agents would be, not one burst.
        slices = max(1, min(10, len(self.nodes) // 50))
        order = list(self.nodes)
        while True:
            busy = self._busy_gpus()
            for k in range(slices):
                batch: list[tuple[str, Event, str]] = []
                for node_id in order[k::slices]:
                    if node_id in self.silent:
                        continue
                    seq = self._seq[node_id] = self._seq[node_id] + 1
                    held = busy.get(node_id, set())
                    beat = NodeHeartbeat(
                        node=node_id,
                        seq=seq,
                        gpus=tuple(
                            GpuStatus(id=g.id, healthy=True, busy=g.id in held)
                            for g in self.nodes[node_id].gpus
                        ),
                    )
                    batch.append(
                        (self.topics.heartbeats, beat, derived_id(self.spec.name, node_id, "hb", seq))
                    )
                await self._send_all(batch)
                self.stats.heartbeats += len(batch)
                await asyncio.sleep(self.heartbeat_s / slices)

    def _busy_gpus(self) -> dict[NodeId, set[GpuId]]:
        busy: dict[NodeId, set[GpuId]] = {}
        for running in self._running.values():
            for p in running.granted.placements:
                busy.setdefault(p.node, set()).update(p.gpus)
        return busy

    async def _on(self, envelope: Envelope) -> None:
        data = envelope.data
        if isinstance(data, JobAdmitted):
            self._durations[data.job_id] = data.spec.duration_hint_s
        elif isinstance(data, AllocationGranted):
            if data.allocation_id in self._running or data.placements[0].node not in self.nodes:
                return
            if any(p.node in self.silent for p in data.placements):
                return  # a dead node starts nothing
            running = self._running[data.allocation_id] = _Running(data, datetime.now(UTC))
            started = JobStarted(job_id=data.job_id, allocation_id=data.allocation_id)
            await self._publish(self.topics.events, started, derived_id(envelope.id, "started"))
            self.stats.started += 1
            duration = self._durations.get(data.job_id) or self.default_duration_s
            if duration is not None:
                loop = asyncio.get_running_loop()
                running.timer = loop.call_later(
                    duration * self.time_scale,
                    lambda: asyncio.ensure_future(self._complete(data.allocation_id)),
                )
        elif isinstance(data, AllocationReleased):
            gone = self._running.pop(data.allocation_id, None)
            if gone is not None and gone.timer is not None:
                gone.timer.cancel()
        elif isinstance(data, JobPreempting):
            holding = self._running.get(data.allocation_id)
            if holding is None:
                return
            node = holding.granted.placements[0].node
            if node in self.silent:
                return
            await asyncio.sleep(self.checkpoint_delay_s)
            ack = JobCheckpointed(
                job_id=data.job_id,
                allocation_id=data.allocation_id,
                node=node,
                checkpoint=f"ckpt://{data.job_id}/{data.allocation_id}",
            )
            await self._publish(self.topics.events, ack, derived_id(envelope.id, "checkpointed"))
            self.stats.checkpointed += 1

    async def _complete(self, allocation_id: AllocationId) -> None:
        running = self._running.pop(allocation_id, None)
        if running is None:
            return
        granted = running.granted
        if any(p.node in self.silent for p in granted.placements):
            return
        held = (datetime.now(UTC) - running.started).total_seconds() / max(self.time_scale, 1e-9)
        gpu_seconds = Seconds(int(held * granted.whole_gpus))
        done = JobCompleted(job_id=granted.job_id, allocation_id=allocation_id, gpu_seconds=gpu_seconds)
        released = AllocationReleased(
            job_id=granted.job_id, allocation_id=allocation_id, reason="completed", gpu_seconds=gpu_seconds
        )
        await self._send_all(
            [
                (self.topics.events, done, derived_id(allocation_id, "completed")),
                (self.topics.allocations, released, derived_id(allocation_id, "released")),
            ]
        )
        self.stats.completed += 1

    async def _publish(self, topic: str, event: Event, event_id: str) -> None:
        await self._send_all([(topic, event, event_id)])

    async def _send_all(self, items: Sequence[tuple[str, Event, str]]) -> None:
        producer = self._producer
        if producer is None:
            return
        now = datetime.now(UTC)
        tracer = get_tracer()
        futures = [
            await send_envelope(
                producer.raw,
                tracer,
                topic,
                make_envelope(event, event_id=event_id, source=self._source, time=now),
                chain=producer.chain,
            )
            for topic, event, event_id in items
        ]
        await asyncio.gather(*futures)
