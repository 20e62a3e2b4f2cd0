"""The dashboard's live feed: what happens on the log, as notices a browser reads with server-sent events.

One Kafka consumer per API replica reads the public topics the dashboard shows (``jobs.events``,
``allocations.log``, ``nodes.inventory``, ``nodes.health``, ``nodes.operator``, ``queues.status``; not
the heartbeats), from their end, read_committed, in no consumer group. It keeps no state of its own
(the one lifecycle fold is the services'; the API's views are the ledger's projections): each record is
held until the ledger has recorded its event id, which it does in the same database transaction as the
projections, so a page that refetches the API's JSON on a notice reads a projection that already shows
the event. The notice then carries the job's queue, submitter and state as the ledger projected them,
and goes only to the subscribers who may see that job (:meth:`Principal.may_see`); an event the
ledger has not recorded within ``settle_s`` (ledger down or far behind) goes to admins only, marked
``recorded: false``. Node notices go to everyone (``GET /v1/nodes`` is not per tenant either); a
queue's to the callers who may read the queue.

A subscriber that does not keep up (its bounded queue full) is sent ``resync`` instead of what it
missed: the page reloads its views from the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer

from gangline.bus.security import client_options
from gangline.events.base import Envelope
from gangline.events.codec import DecodeError, decode
from services.api.auth import Principal
from services.common.topics import TopicNames

log = logging.getLogger(__name__)

SUBSCRIBER_BUFFER = 1000
"""Notices one subscriber may have unsent before it is told to resync."""
RESYNC = "resync"


def watched_topics(topics: TopicNames) -> list[str]:
    """What the dashboard shows live (heartbeats left out: the ledger does not record them either)."""
    return [
        topics.events,
        topics.allocations,
        topics.inventory,
        topics.health,
        topics.operator,
        topics.queue_status,
    ]


def short_type(wire_type: str) -> str:
    """``gangline.job.started.v1`` → ``job.started``."""
    parts = wire_type.split(".")
    return ".".join(parts[1:-1]) if len(parts) >= 3 and parts[0] == "gangline" else wire_type


def summary_of(envelope: Envelope) -> str:
    """One line of what happened, for the live log (the event's own words where it has them)."""
    data = envelope.data
    placements = getattr(data, "placements", None)
    if placements:
        where = sorted({f"{p.node}:{','.join(p.gpus)}" for p in placements})
        return f"{len(placements)} rank(s) on {' '.join(where)}"
    reasons = getattr(data, "reasons", None)
    if reasons:
        first = reasons[0]  # a pending reason (code) or a placement's (plugin)
        label = getattr(first, "code", None) or getattr(first, "plugin", None)
        message = getattr(first, "message", "")
        return f"{label}: {message}" if label else str(message)
    for name in ("reason", "message", "state"):
        value = getattr(data, name, None)
        if isinstance(value, str) and value:
            return value
    cause = getattr(data, "cause", None)
    message = getattr(cause, "message", None)
    return message if isinstance(message, str) else ""


@dataclass(frozen=True)
class Notice:
    """One event as the dashboard is told of it."""

    id: str
    type: str
    time: str
    subject: str
    topic: str
    job_id: str | None
    node: str | None
    queue: str | None
    submitted_by: str | None
    state: str | None
    summary: str
    recorded: bool

    def json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "time": self.time,
            "subject": self.subject,
            "topic": self.topic,
            "job_id": self.job_id,
            "node": self.node,
            "queue": self.queue,
            "state": self.state,
            "summary": self.summary,
            "recorded": self.recorded,
        }

    def visible_to(self, caller: Principal) -> bool:
        """Whether ``caller`` may be told of this event (module docstring)."""
        if caller.admin:
            return True
        if not self.recorded:
            return False
        if self.job_id is not None:
            return self.queue is not None and caller.may_see(self.queue, self.submitted_by)
        if self.topic == "queue":
            return self.queue is not None and self.queue in (caller.visible_queues() or [])
        return True  # a node's events: the cluster is the same for everyone


@dataclass(eq=False)
class Subscription:
    caller: Principal
    queue: asyncio.Queue[Notice | str] = field(default_factory=lambda: asyncio.Queue(SUBSCRIBER_BUFFER))

    def offer(self, notice: Notice) -> None:
        if not notice.visible_to(self.caller):
            return
        try:
            self.queue.put_nowait(notice)
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(RESYNC)


class LiveFeed:
    """Reads the watched topics from their end and hands each subscriber the notices it may see."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topics: TopicNames,
        pool: asyncpg.Pool,
        settle_s: float = 10.0,
        poll_ms: int = 200,
        options: Callable[[], dict[str, Any]] = client_options,
    ) -> None:
        self._bootstrap = bootstrap
        self._topics = topics
        self._kinds = {
            topics.events: "job",
            topics.allocations: "allocation",
            topics.inventory: "node",
            topics.health: "node",
            topics.operator: "node",
            topics.queue_status: "queue",
        }
        self._pool = pool
        self._settle_s = settle_s
        self._poll_ms = poll_ms
        self._options = options
        self._subscribers: set[Subscription] = set()
        self.ready = asyncio.Event()
        """Set once the consumer is positioned at the end of every watched partition."""

    @contextlib.contextmanager
    def subscribe(self, caller: Principal) -> Any:
        subscription = Subscription(caller)
        self._subscribers.add(subscription)
        try:
            yield subscription
        finally:
            self._subscribers.discard(subscription)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def run(self) -> None:
        """Until cancelled; a broker outage is retried (the feed is a view: nothing is lost for good but
        notices, and the pages reload their views on reconnect)."""
        while True:
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("live feed: consumer failed; restarting in 2 s")
                self.ready.clear()
                for subscription in list(self._subscribers):
                    with contextlib.suppress(asyncio.QueueFull):
                        subscription.queue.put_nowait(RESYNC)
                await asyncio.sleep(2)

    async def _consume(self) -> None:
        topics = watched_topics(self._topics)
        consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=self._bootstrap,
            **self._options(),
            group_id=None,
            auto_offset_reset="latest",
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            await self._position(consumer, len(topics))
            self.ready.set()
            while True:
                batch = await consumer.getmany(timeout_ms=self._poll_ms, max_records=500)
                envelopes: list[tuple[str, Envelope]] = []
                for tp, records in sorted(batch.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
                    for record in records:
                        with contextlib.suppress(DecodeError):
                            envelopes.append((self._kinds[tp.topic], decode(record.value or b"")))
                if envelopes:
                    for notice in await self._notices(envelopes):
                        for subscription in list(self._subscribers):
                            subscription.offer(notice)
        finally:
            await consumer.stop()

    async def _position(self, consumer: AIOKafkaConsumer, expected_topics: int) -> None:
        """Wait for every watched topic's partitions, and fix each position at its current end."""
        for _ in range(300):
            assigned = consumer.assignment()
            if len({tp.topic for tp in assigned}) >= expected_topics:
                break
            await asyncio.sleep(0.1)
        for tp in consumer.assignment():
            await consumer.position(tp)

    async def _notices(self, envelopes: Sequence[tuple[str, Envelope]]) -> list[Notice]:
        ids = [e.id for _, e in envelopes]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settle_s
        async with self._pool.acquire() as conn:
            while True:
                recorded = {
                    r["event_id"]
                    for r in await conn.fetch("SELECT event_id FROM events WHERE event_id = ANY($1)", ids)
                }
                if len(recorded) == len(set(ids)) or loop.time() >= deadline:
                    break
                await asyncio.sleep(0.05)
            job_ids = sorted({j for _, e in envelopes if (j := _job_of(e)) is not None})
            rows = await conn.fetch(
                "SELECT job_id, queue, submitted_by, state FROM jobs WHERE job_id = ANY($1)", job_ids
            )
        jobs: Mapping[str, asyncpg.Record] = {r["job_id"]: r for r in rows}
        out = []
        for kind, envelope in envelopes:
            job_id = _job_of(envelope)
            row = jobs.get(job_id) if job_id is not None else None
            queue = row["queue"] if row is not None else getattr(envelope.data, "queue", None)
            node = getattr(envelope.data, "node", None)
            out.append(
                Notice(
                    id=envelope.id,
                    type=short_type(envelope.type),
                    time=envelope.time.isoformat(),
                    subject=envelope.subject,
                    topic=kind,
                    job_id=job_id,
                    node=node if isinstance(node, str) else None,
                    queue=queue if isinstance(queue, str) and (row is not None or job_id is None) else None,
                    submitted_by=row["submitted_by"] if row is not None else None,
                    state=row["state"] if row is not None else None,
                    summary=summary_of(envelope)[:500],
                    recorded=envelope.id in recorded,
                )
            )
        return out


def _job_of(envelope: Envelope) -> str | None:
    job_id = getattr(envelope.data, "job_id", None)
    return job_id if isinstance(job_id, str) else None


async def stream(subscription: Subscription, *, keepalive_s: float = 15.0) -> AsyncIterator[str]:
    """The subscription as ``text/event-stream``: ``notice`` events, ``resync`` when it fell behind, and
    a comment every ``keepalive_s`` so proxies keep the connection and a gone client is noticed."""
    yield "retry: 2000\n\n"
    while True:
        try:
            item = await asyncio.wait_for(subscription.queue.get(), timeout=keepalive_s)
        except TimeoutError:
            yield ": keepalive\n\n"
            continue
        if isinstance(item, str):
            yield f"event: {item}\ndata: {{}}\n\n"
        else:
            yield f"event: notice\nid: {item.id}\ndata: {json.dumps(item.json())}\n\n"
