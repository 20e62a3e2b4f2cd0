"""Simulated node agents: inventory, heartbeats, "running" placed jobs, checkpoint acknowledgements.

One process runs every node of a :class:`~gangline.cluster_spec.ClusterSpec`. Like real agents it
publishes ``node.registered`` once per node and ``node.heartbeat`` every ``heartbeat_s``; it reads
``allocations.log`` and ``jobs.events`` and, for each grant on its nodes, publishes ``job.started``,
then after the job's ``duration_hint_s`` (times ``time_scale``) ``job.completed`` with the
GPU-seconds held (placement then writes ``allocation.released``: agents never write allocations.log,
DESIGN §3). A job with a ``time_limit_s`` shorter than that is stopped at the limit as the real agent
stops it: the checkpoint is acknowledged (``job.checkpointed``) and the job ends ``job.failed`` code
``time_limit``. A release read stops the job here (preempted, node failed, cancelled). It answers
``job.preempting`` with ``job.checkpointed`` and stops the job there (it no longer completes: the
preemption's release ends it), as a real agent stops the gang; a resize's checkpoint runs on.
``fail_node`` makes a node go silent (and optionally report an XID), as a dying node would;
``report_xid`` reports a GPU failed on a node that lives on.

What one poll of the log calls for (``job.started`` for every grant read, say) is sent as one batch,
and so are the completions and checkpoint acknowledgements whose timers fire together: one sender
(:meth:`FakeCluster.flush`) queues everything in the order it was decided, so a job's
``job.started`` always precedes its ``job.completed``. A grant may be read before its job's
``job.admitted`` (the two topics are read side by side): the job then starts at once and its
timer starts when the duration hint is read, counting from the start.

A broker away for longer than the producer's timeout (a restart on a busy machine) stops nothing, as
it stops no real agent: a heartbeat that could not be sent is dropped (the next one says the same), and
the job reports that could not be sent are sent again, in order, with their ids, until the broker takes
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from gangline.bus import EventProducer
from gangline.bus.producer import send_envelope
from gangline.bus.records import KafkaRecord
from gangline.bus.security import client_options
from gangline.cluster_spec import ClusterSpec
from gangline.core.pools import PoolLayout
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.codec import DecodeError, decode
from gangline.events.ids import derived_id
from gangline.events.jobs import (
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobPreempting,
    JobResizing,
    JobStarted,
)
from gangline.events.nodes import GpuHealthChanged, GpuStatus, HealthCause, NodeHeartbeat, NodeRegistered
from gangline.events.types import AllocationId, GpuId, JobId, NodeId, Seconds
from gangline.fold.adapter import pool_labels
from gangline.telemetry.tracing import get_tracer
from services.common.select import wire_type_of
from services.common.topics import TopicNames

log = logging.getLogger(__name__)

AGENT_EVENTS = ("job.admitted", "job.preempting", "job.resizing", "allocation.granted", "allocation.released")


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
    started_before_admitted: int = 0
    """Grants read before their job's job.admitted (their timers started when the hint was read)."""
    completed: int = 0
    checkpointed: int = 0
    batches: int = 0
    """Batches of job and allocation events sent (one per poll with outputs, one per flush of timers)."""


Outgoing = tuple[str, Event, str]
"""(topic, event, event id): one event to publish."""


class NotSent(Exception):
    """Some of a batch the broker did not take (``unsent``, in the batch's order); ``__cause__``: why."""

    def __init__(self, unsent: Sequence[Outgoing]) -> None:
        super().__init__(f"{len(unsent)} record(s) not sent")
        self.unsent = list(unsent)


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
    resend_s: float = 0.5
    """How long to wait before sending again what the broker did not take."""
    pools: PoolLayout | None = None
    """The cluster's pools: each node's records, and the reports of the jobs it runs, go to its pool's
    partition (gangline.bus.pools), as each node's own agent sends them. None: by key."""
    nodes: dict[NodeId, NodeRegistered] = field(init=False)
    silent: set[NodeId] = field(default_factory=set)
    stats: FakeStats = field(default_factory=FakeStats)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.nodes = {n.node: n for n in self.spec.registrations()}
        self._durations: dict[JobId, int | None] = {}
        self._limits: dict[JobId, int] = {}
        self._running: dict[AllocationId, _Running] = {}
        self._running_jobs: dict[JobId, int] = {}
        """Allocations running per job (a requeued job may be granted again before its release is read)."""
        self._undated: dict[JobId, AllocationId] = {}
        """Running allocations whose job.admitted (the duration hint) has not been read yet."""
        self._ended: set[AllocationId] = set()
        """Allocations that ran here and stopped: a grant read again (the consumer group's offsets lost
        in a long broker outage) starts nothing, as a real agent's seen allocations do."""
        self._seq: dict[NodeId, int] = dict.fromkeys(self.nodes, 0)
        self._producer: EventProducer | None = None
        self._source = f"gangline/agent/{self.spec.name}"
        self._outbox: list[Outgoing] = []
        self._sending = asyncio.Lock()
        self._flushes: set[asyncio.Future[None]] = set()
        self._job_node: dict[JobId, NodeId] = {}
        """The node (rank 0's) each job granted here runs on: its reports go to that node's pool."""
        self._pooled = frozenset(self.topics.pooled())

    # -- control -------------------------------------------------------------------------------

    async def fail_node(self, node: NodeId, *, xid: int | None = None) -> None:
        """The node stops heartbeating (and with ``xid`` first reports its GPU 0 failed); its jobs stall."""
        self.silent.add(node)
        for running in list(self._running.values()):
            if node in {p.node for p in running.granted.placements} and running.timer is not None:
                running.timer.cancel()
        if xid is not None:
            await self.report_xid(node, xid)

    async def report_xid(self, node: NodeId, xid: int) -> None:
        """The node reports its GPU 0 failed with ``xid`` (an XID 79: fallen off the bus) and lives on."""
        gpu = self.nodes[node].gpus[0].id
        event = GpuHealthChanged(
            node=node,
            gpu=gpu,
            previous="healthy",
            state="failed",
            cause=HealthCause(kind="xid", message=f"XID {xid} on {gpu}", xid=xid),
        )
        self._outbox.append((self.topics.health, event, derived_id(node, "xid", xid, self._seq[node])))
        await self.flush()

    def running_allocations(self) -> list[AllocationGranted]:
        return [r.granted for r in self._running.values()]

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        async with EventProducer(
            self.bootstrap,
            client_id=f"fake-nodes-{self.spec.name}",
            linger_ms=5,
        ) as producer:
            self._producer = producer
            await self._register_all()
            consumer = AIOKafkaConsumer(
                self.topics.events,
                self.topics.allocations,
                bootstrap_servers=self.bootstrap,
                **client_options(),
                group_id=self.group_id,
                enable_auto_commit=True,
                auto_offset_reset="earliest",
                isolation_level="read_committed",
            )
            wanted = self._wanted
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
                            self.on_event(envelope)
                    await self.flush()
            finally:
                await consumer.stop()
                heartbeats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeats
                for running in self._running.values():
                    if running.timer is not None:
                        running.timer.cancel()
                self._producer = None

    def _pool_partition(self, topic: str, envelope: Envelope) -> int | None:
        """A record's pool partition: its node's pool (a node event's node; a job report's job's node)."""
        layout = self.pools
        if layout is None or topic not in self._pooled:
            return None
        node = getattr(envelope.data, "node", None) or self._job_node.get(JobId(envelope.subject))
        registered = self.nodes.get(NodeId(node)) if node is not None else None
        pool = layout.pool_of(pool_labels(registered)) if registered is not None else None
        return layout.partition(pool) if pool is not None else None

    def _wanted(self, record: KafkaRecord) -> bool:
        """Whether to decode a record: the agents' events, but not releases of jobs not running here.

        Most releases are placement's answers to the nodes' own completions, after the job already ended here.
        """
        kind = wire_type_of(record.value)
        if kind == "allocation.released":
            return (record.key or b"").decode() in self._running_jobs
        return kind is None or kind in AGENT_EVENTS

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
                batch: list[Outgoing] = []
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
                try:
                    await self._send_all(batch)
                except NotSent as e:
                    log.warning(
                        "fake nodes: %s heartbeat(s) not sent (%r); dropped", len(e.unsent), e.__cause__
                    )
                else:
                    self.stats.heartbeats += len(batch)
                await asyncio.sleep(self.heartbeat_s / slices)

    def _busy_gpus(self) -> dict[NodeId, set[GpuId]]:
        busy: dict[NodeId, set[GpuId]] = {}
        for running in self._running.values():
            for p in running.granted.placements:
                busy.setdefault(p.node, set()).update(p.gpus)
        return busy

    # -- what the nodes do about each event (queued in the outbox; sent by flush) ------------

    def on_event(self, envelope: Envelope) -> None:
        """React to one event read from the log: queue what it calls for, start or stop timers."""
        data = envelope.data
        if isinstance(data, JobAdmitted):
            self._durations[data.job_id] = data.spec.duration_hint_s
            if data.spec.time_limit_s is not None:
                self._limits[data.job_id] = data.spec.time_limit_s
            undated = self._undated.pop(data.job_id, None)
            if undated is not None:
                self._start_timer(undated)
        elif isinstance(data, AllocationGranted):
            if (
                data.allocation_id in self._running
                or data.allocation_id in self._ended
                or data.placements[0].node not in self.nodes
            ):
                return
            if any(p.node in self.silent for p in data.placements):
                return  # a dead node starts nothing
            self._running[data.allocation_id] = _Running(data, datetime.now(UTC))
            self._job_node[data.job_id] = data.placements[0].node
            self._running_jobs[data.job_id] = self._running_jobs.get(data.job_id, 0) + 1
            started = JobStarted(job_id=data.job_id, allocation_id=data.allocation_id)
            self._outbox.append((self.topics.events, started, derived_id(envelope.id, "started")))
            self.stats.started += 1
            if data.job_id in self._durations:
                self._start_timer(data.allocation_id)
            else:
                self._undated[data.job_id] = data.allocation_id
                self.stats.started_before_admitted += 1
        elif isinstance(data, AllocationReleased):
            gone = self._stop(data.allocation_id)
            if gone is not None and gone.timer is not None:
                gone.timer.cancel()
            if self._undated.get(data.job_id) == data.allocation_id:
                del self._undated[data.job_id]
        elif isinstance(data, JobPreempting | JobResizing):
            holding = self._running.get(data.allocation_id)
            if holding is None or holding.granted.placements[0].node in self.silent:
                return
            asyncio.get_running_loop().call_later(
                self.checkpoint_delay_s, self._checkpointed, data, derived_id(envelope.id, "checkpointed")
            )

    def _start_timer(self, allocation_id: AllocationId) -> None:
        """Complete the allocation once its job's duration (counted from its start) has passed."""
        running = self._running.get(allocation_id)
        if running is None or any(p.node in self.silent for p in running.granted.placements):
            return
        duration = self._durations.get(running.granted.job_id) or self.default_duration_s
        limit = self._limits.get(running.granted.job_id)
        elapsed = (datetime.now(UTC) - running.started).total_seconds()
        loop = asyncio.get_running_loop()
        if limit is not None and (duration is None or limit < duration):
            running.timer = loop.call_later(
                max(0.0, limit * self.time_scale - elapsed) + self.checkpoint_delay_s,
                self._time_limit,
                allocation_id,
                limit,
            )
            return
        if duration is None:
            return  # runs until released
        running.timer = loop.call_later(
            max(0.0, duration * self.time_scale - elapsed), self._complete, allocation_id
        )

    def _stop(self, allocation_id: AllocationId) -> _Running | None:
        running = self._running.pop(allocation_id, None)
        if running is not None:
            self._ended.add(allocation_id)
            job_id = running.granted.job_id
            left = self._running_jobs.pop(job_id, 1) - 1
            if left > 0:
                self._running_jobs[job_id] = left
        return running

    def _complete(self, allocation_id: AllocationId) -> None:
        running = self._stop(allocation_id)
        if running is None:
            return
        granted = running.granted
        if any(p.node in self.silent for p in granted.placements):
            return
        held = (datetime.now(UTC) - running.started).total_seconds() / max(self.time_scale, 1e-9)
        gpu_seconds = Seconds(int(held * granted.whole_gpus))
        done = JobCompleted(job_id=granted.job_id, allocation_id=allocation_id, gpu_seconds=gpu_seconds)
        self._durations.pop(granted.job_id, None)  # a completed job is never granted again
        self._outbox.append((self.topics.events, done, derived_id(allocation_id, "completed")))
        self.stats.completed += 1
        self._flush_soon()

    def _time_limit(self, allocation_id: AllocationId, limit: int) -> None:
        """The run reached its limit: checkpointed after the signal, then failed (code time_limit)."""
        running = self._stop(allocation_id)
        if running is None:
            return
        granted = running.granted
        node = granted.placements[0].node
        if any(p.node in self.silent for p in granted.placements):
            return
        held = (datetime.now(UTC) - running.started).total_seconds() / max(self.time_scale, 1e-9)
        ack, failed = time_limit_reached(granted, allocation_id, node, limit, held)
        self._durations.pop(granted.job_id, None)
        self._limits.pop(granted.job_id, None)
        self._outbox.append(
            (self.topics.events, ack, derived_id(allocation_id, "time-limit", "checkpointed"))
        )
        self._outbox.append((self.topics.events, failed, derived_id(allocation_id, "time-limit", "failed")))
        self.stats.checkpointed += 1
        self._flush_soon()

    def _checkpointed(self, asked: JobPreempting | JobResizing, event_id: str) -> None:
        holding = self._running.get(asked.allocation_id)
        if holding is None:
            return
        node = holding.granted.placements[0].node
        if node in self.silent:
            return
        ack = JobCheckpointed(
            job_id=asked.job_id,
            allocation_id=asked.allocation_id,
            node=node,
            checkpoint=f"ckpt://{asked.job_id}/{asked.allocation_id}",
        )
        if isinstance(asked, JobPreempting) and holding.timer is not None:
            # Checkpointed for a preemption, the job stops here, as a real agent stops the gang: it no
            # longer completes (preemption releases it; a job.completed after the checkpoint would race
            # that release: two releases of one allocation, a job requeued after it ended). A resize
            # goes on running.
            holding.timer.cancel()
            holding.timer = None
        self._outbox.append((self.topics.events, ack, event_id))
        self.stats.checkpointed += 1
        self._flush_soon()

    # -- sending -----------------------------------------------------------------------------

    def _flush_soon(self) -> None:
        """From a timer: send the outbox once this loop iteration's other timers have added theirs."""
        flush = asyncio.ensure_future(self.flush())
        self._flushes.add(flush)  # kept until done, so the task is not collected mid-send
        flush.add_done_callback(self._flushes.discard)

    async def flush(self) -> None:
        """Send everything queued so far as one batch, in the order it was queued (one sender at a time)."""
        async with self._sending:
            items, self._outbox = self._outbox, []
            if items:
                self.stats.batches += 1
            while items:
                try:
                    await self._send_all(items)
                    items = []
                except NotSent as e:
                    items = e.unsent
                    log.warning("fake nodes: %s report(s) not sent (%r); again", len(items), e.__cause__)
                    await asyncio.sleep(self.resend_s)

    async def _send_all(self, items: Sequence[Outgoing]) -> None:
        """Send ``items``; :class:`NotSent` with those the broker did not take (a broker error)."""
        producer = self._producer
        if producer is None:
            return
        now = datetime.now(UTC)
        tracer = get_tracer()
        futures = []
        error: KafkaError | None = None
        for topic, event, event_id in items:
            envelope = make_envelope(event, event_id=event_id, source=self._source, time=now)
            try:
                future = await send_envelope(
                    producer.raw,
                    tracer,
                    topic,
                    envelope,
                    chain=producer.chain,
                    partition=self._pool_partition(topic, envelope),
                )
            except KafkaError as e:  # not queued (no metadata in time): neither is the rest
                error = e
                break
            futures.append(future)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        unsent = [
            item for item, outcome in zip(items, outcomes, strict=False) if isinstance(outcome, BaseException)
        ]
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        for failure in failures:
            if not isinstance(failure, KafkaError):
                raise failure
        unsent += items[len(futures) :]
        if unsent:
            raise NotSent(unsent) from (failures[0] if failures else error)


def time_limit_reached(
    granted: AllocationGranted, allocation_id: AllocationId, node: NodeId, limit: float, held_s: float
) -> tuple[JobCheckpointed, JobFailed]:
    """What a simulated node reports for a job stopped at its time limit (the fake nodes' and the services'
    simulator's alike): its checkpoint after the signal, then ``job.failed`` code ``time_limit``."""
    ack = JobCheckpointed(
        job_id=granted.job_id,
        allocation_id=allocation_id,
        node=node,
        checkpoint=f"ckpt://{granted.job_id}/{allocation_id}",
    )
    failed = JobFailed(
        job_id=granted.job_id,
        allocation_id=allocation_id,
        code="time_limit",
        reason=f"the job reached its time limit of {limit} s on {node}; it checkpointed after the signal",
        gpu_seconds=Seconds(int(held_s * granted.whole_gpus)),
    )
    return ack, failed
