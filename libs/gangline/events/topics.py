"""The public Kafka topics (DESIGN.md section 3): names, keys, sizing, and which event types each carries.

``CATALOGUE`` is the source of ``schemas/topics.yaml`` (written by ``make schemas``); infra creates the
topics from that file, the bus routes events with ``topic_for``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gangline.events import allocations, jobs, nodes, queues
from gangline.events.base import Event

JOBS_REQUESTS = "jobs.requests"
JOBS_EVENTS = "jobs.events"
ALLOCATIONS_LOG = "allocations.log"
NODES_INVENTORY = "nodes.inventory"
NODES_HEARTBEATS = "nodes.heartbeats"
NODES_HEALTH = "nodes.health"
NODES_OPERATOR = "nodes.operator"
QUEUES_STATUS = "queues.status"
QUOTA_TICKS = "quota.ticks"
"""Quota's own clock in the log (``quota.ticked``): not a public contract, only quota reads it."""

PUBLIC_TOPICS = (
    JOBS_REQUESTS,
    JOBS_EVENTS,
    ALLOCATIONS_LOG,
    NODES_INVENTORY,
    NODES_HEARTBEATS,
    NODES_HEALTH,
    NODES_OPERATOR,
    QUEUES_STATUS,
)

DLQ_SUFFIX = ".dlq"
FOREVER = -1
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
DLQ_RETENTION_MS = 30 * DAY_MS
HEARTBEAT_RETENTION_MS = 6 * HOUR_MS
SNAPSHOTS_SUFFIX = ".snapshots"
SNAPSHOTTED_SERVICES = ("placement", "preemption", "quota", "node_health")
"""The decision services that write snapshots of their state (``<service>.snapshots``)."""


def dead_letter_topic(topic: str) -> str:
    """Where undecodable or invalid messages read from ``topic`` go, with the reason."""
    return topic + DLQ_SUFFIX


def snapshot_topic(service: str) -> str:
    """Where ``service`` writes snapshots of its state (gangline.bus.snapshots)."""
    return service + SNAPSHOTS_SUFFIX


# Retention, as a policy. A restart never needs a record the policy deletes: the topics a service's state
# is a fold of are kept forever (the replay verification re-reads them from the start, and a service
# without a snapshot, or with one it cannot use, rebuilds from them), and a snapshot covers everything
# before its positions. What expires is read by no restore: heartbeats (liveness now, not history) and
# dead letters (an operator's inbox).
_KEPT_FOREVER = "kept forever: a fold every decision service restores from, and the log replay verifies"


@dataclass(frozen=True)
class TopicSpec:
    """One topic as infra creates it. ``retention_ms`` is -1 for "keep forever", None when compacted."""

    name: str
    key: Literal["job_id", "node", "queue", "snapshot_part"]
    partitions: int
    cleanup_policy: Literal["delete", "compact"]
    retention_ms: int | None
    event_types: tuple[type[Event], ...]
    dead_letter: str | None
    retention: str = ""
    """Why the topic keeps what it keeps (the retention policy, in a sentence)."""
    segment_ms: int | None = None
    """How soon a segment closes (compacted topics: how soon the cleaner may drop superseded records)."""
    pooled: bool = False
    """Split by pool (gangline.core.pools): a pool's records are on the partition of its index, so the
    topic has a partition per pool at least (``POOL_PARTITIONS``: raise it for more pools)."""

    def wire_types(self) -> list[str]:
        return [cls.wire_type() for cls in self.event_types]


# The job topics share a key and a partition count so one job's requests, lifecycle and grants land on
# the same partition number everywhere (co-partitioned joins). The log is the truth and replay reads
# it from the start, so the decision topics are kept forever; only heartbeats expire.
JOB_PARTITIONS = 3
POOL_PARTITIONS = JOB_PARTITIONS
"""The partitions of every pooled topic: the most pools a cluster can be split into (one owner each; a
pool's index is its partition). The node topics have as many as the job topics, so one pool is the same
partition number everywhere."""
_PUBLIC: tuple[TopicSpec, ...] = (
    TopicSpec(
        JOBS_REQUESTS,
        "job_id",
        JOB_PARTITIONS,
        "delete",
        FOREVER,
        (jobs.JobRequested, jobs.JobCancelRequested),
        dead_letter_topic(JOBS_REQUESTS),
        retention="kept forever: what was asked, the input admission's decisions are replayed from",
    ),
    TopicSpec(
        JOBS_EVENTS,
        "job_id",
        POOL_PARTITIONS,
        "delete",
        FOREVER,
        (
            jobs.JobAdmitted,
            jobs.JobRejected,
            jobs.JobRouted,
            jobs.JobQueued,
            jobs.JobPending,
            jobs.JobPlaced,
            jobs.JobStarted,
            jobs.JobPreempting,
            jobs.JobResizing,
            jobs.JobCheckpointed,
            jobs.JobPreempted,
            jobs.JobRequeued,
            jobs.JobCompleted,
            jobs.JobFailed,
            jobs.WorkerExited,
        ),
        dead_letter_topic(JOBS_EVENTS),
        retention=_KEPT_FOREVER,
        pooled=True,
    ),
    TopicSpec(
        ALLOCATIONS_LOG,
        "job_id",
        POOL_PARTITIONS,
        "delete",
        FOREVER,
        (allocations.AllocationGranted, allocations.AllocationReleased),
        dead_letter_topic(ALLOCATIONS_LOG),
        retention="kept forever: the audit log of every grant and release (analytics, replay, every fold)",
        pooled=True,
    ),
    # Kept forever, not compacted: replay must see the inventory as it was at each decision.
    TopicSpec(
        NODES_INVENTORY,
        "node",
        POOL_PARTITIONS,
        "delete",
        FOREVER,
        (nodes.NodeRegistered,),
        dead_letter_topic(NODES_INVENTORY),
        retention=_KEPT_FOREVER,
        pooled=True,
    ),
    # Liveness only: node-health turns missed heartbeats into node.failed on nodes.health.
    TopicSpec(
        NODES_HEARTBEATS,
        "node",
        POOL_PARTITIONS,
        "delete",
        HEARTBEAT_RETENTION_MS,
        (nodes.NodeHeartbeatV1, nodes.NodeHeartbeat),
        dead_letter_topic(NODES_HEARTBEATS),
        retention="6 hours: liveness now, not history; no restore reads it (node_health counts silence "
        "from its own start) and a consumer back after longer needs only the latest",
        pooled=True,
    ),
    TopicSpec(
        NODES_HEALTH,
        "node",
        POOL_PARTITIONS,
        "delete",
        FOREVER,
        (nodes.GpuHealthChanged, nodes.GpuErrorReported, nodes.NodeFailed, nodes.NodeRejected),
        dead_letter_topic(NODES_HEALTH),
        retention=_KEPT_FOREVER,
        pooled=True,
    ),
    # Operators' word on nodes (cordon, drain, uncordon), written by the API for admins only. Kept
    # forever: replay must see which nodes were out of service at each decision.
    TopicSpec(
        NODES_OPERATOR,
        "node",
        POOL_PARTITIONS,
        "delete",
        FOREVER,
        (nodes.NodeCordoned, nodes.NodeUncordoned),
        dead_letter_topic(NODES_OPERATOR),
        retention=_KEPT_FOREVER,
        pooled=True,
    ),
    # A table, not a log: the latest status of each queue is all anyone reads (quota restores its
    # throttle from it, the ledger projects it). Quota's replay reads what compaction left.
    TopicSpec(
        QUEUES_STATUS,
        "queue",
        1,
        "compact",
        None,
        (queues.QueueStatus,),
        dead_letter_topic(QUEUES_STATUS),
        retention="compacted: the latest status per queue is all anyone reads",
    ),
    # Quota's clock: written by quota to itself when it went quiet with a status held back (a few records
    # per quiet spell). Kept forever: quota's replay re-decides the statuses they made due.
    TopicSpec(
        QUOTA_TICKS,
        "queue",
        1,
        "delete",
        FOREVER,
        (queues.QuotaTicked,),
        dead_letter_topic(QUOTA_TICKS),
        retention="kept forever: quota's replay re-decides the statuses its ticks made due (a few per quiet "
        "spell)",
    ),
)

SNAPSHOT_SEGMENT_MS = HOUR_MS
_SNAPSHOTS: tuple[TopicSpec, ...] = tuple(
    TopicSpec(
        snapshot_topic(service),
        "snapshot_part",
        POOL_PARTITIONS,  # one per pool's owner (0 without pools)
        "compact",
        None,
        (),
        None,
        retention="compacted: the latest snapshot of the service's state survives whole (its chunks and "
        "manifest; with pools, each pool's on its partition); older ones are superseded within the hour",
        segment_ms=SNAPSHOT_SEGMENT_MS,
    )
    for service in SNAPSHOTTED_SERVICES
)

CATALOGUE: tuple[TopicSpec, ...] = (
    *(
        spec
        for public in _PUBLIC
        for spec in (
            public,
            TopicSpec(
                dead_letter_topic(public.name),
                public.key,
                1,
                "delete",
                DLQ_RETENTION_MS,
                (),
                None,
                retention="30 days: an operator's inbox of what could not be read; no state folds it",
            ),
        )
    ),
    *_SNAPSHOTS,
)


def topic_spec(name: str) -> TopicSpec:
    """The spec of a topic in the catalogue; KeyError for any other name."""
    for spec in CATALOGUE:
        if spec.name == name:
            return spec
    raise KeyError(name)


def topic_for(event: type[Event] | Event) -> str:
    """The public topic an event type is published to (matched by TYPE, so every version goes there)."""
    event_type = event.TYPE
    for spec in _PUBLIC:
        if any(event_type == cls.TYPE for cls in spec.event_types):
            return spec.name
    raise KeyError(f"no topic carries {event_type!r}")
