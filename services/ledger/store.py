"""The ledger's writes: a batch of events into the events table and the projections, in one transaction.

Only events that are new to the ledger (by event id) touch the projections, so a batch delivered
twice (a crash between the database commit and the Kafka offset commit) changes nothing the
second time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from gangline.bus import Delivery
from gangline.events import allocations, nodes, queues
from gangline.events.base import Envelope, Event, parse_wire_type
from gangline.events.registry import JOB_EVENT_TYPES, NODE_EVENT_TYPES, Registry
from gangline.store.ledger import LedgerEntry, record_events
from services.ledger.projections import (
    JobRow,
    NodeRow,
    QueueStatusRow,
    StoredEvent,
    apply_node_event,
    fold_job,
    job_subjects,
    queue_status_row,
)


def ledger_entry(delivery: Delivery) -> LedgerEntry:
    envelope, meta = delivery.envelope, delivery.meta
    return LedgerEntry(
        event_id=envelope.id,
        type=envelope.type,
        source=envelope.source,
        subject=envelope.subject,
        time=envelope.time,
        data=envelope.data.model_dump(mode="json"),
        causation_id=envelope.causationid,
        traceparent=envelope.traceparent,
        topic=meta.topic,
        partition=meta.partition,
        offset=meta.offset,
    )


def _as_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _loaded(value: Any) -> Any:
    # jsonb arrives as Python objects with the pool's codec, as text without it.
    return json.loads(value) if isinstance(value, str) else value


def typed(registry: Registry, wire_type: str, data: Any) -> Event | None:
    """A stored event's payload as its latest model; None for a type this registry does not know."""
    parsed = parse_wire_type(wire_type)
    if parsed is None:
        return None
    event_type, version = parsed
    latest = registry.latest(event_type)
    if latest is None or not registry.knows(event_type, version):
        return None
    return latest.model_validate(registry.upcast(event_type, version, _loaded(data)))


async def project_batch(
    conn: asyncpg.Connection,
    deliveries: Sequence[Delivery],
    registry: Registry,
    *,
    record_heartbeats: bool = False,
) -> int:
    """Record ``deliveries`` and update the projections in the caller's transaction; how many were new.

    Heartbeats are liveness, not history: unless ``record_heartbeats``, they only move the node's
    last heartbeat forward (the latest of the batch per node; idempotent by nature) and stay out of
    the events table, which would otherwise grow by one row per node every few seconds, forever.
    """
    latest_beat: dict[str, Envelope] = {}
    kept: list[Delivery] = []
    for delivery in deliveries:
        envelope = delivery.envelope
        if not record_heartbeats and isinstance(envelope.data, nodes.NodeHeartbeat | nodes.NodeHeartbeatV1):
            seen = latest_beat.get(envelope.subject)
            if seen is None or envelope.time >= seen.time:
                latest_beat[envelope.subject] = envelope
        else:
            kept.append(delivery)
    new_ids = set(await record_events(conn, [ledger_entry(d) for d in kept]))
    fresh: list[Envelope] = []
    for delivery in kept:
        if delivery.envelope.id in new_ids:
            new_ids.discard(delivery.envelope.id)  # one delivery per id, even if the batch repeats it
            fresh.append(delivery.envelope)
    for envelope in [*fresh, *latest_beat.values()]:
        if envelope.type in NODE_EVENT_TYPES:
            await _project_node(conn, envelope)
        elif isinstance(envelope.data, allocations.AllocationGranted | allocations.AllocationReleased):
            await _project_allocation(conn, envelope)
        elif isinstance(envelope.data, queues.QueueStatus):
            await _project_queue_status(conn, envelope)
    for job_id in job_subjects([(e.type, e.subject) for e in fresh]):
        await _refold_job(conn, job_id, registry)
    return len(fresh)


# -- jobs -------------------------------------------------------------------------------------


async def _lock(conn: asyncpg.Connection, kind: str, key: str) -> None:
    # Serialises writers of one row across ledger replicas until the transaction ends; the read
    # that follows sees everything the previous holder committed.
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"{kind}:{key}")


async def _refold_job(conn: asyncpg.Connection, job_id: str, registry: Registry) -> None:
    await _lock(conn, "job", job_id)
    rows = await conn.fetch(
        "SELECT event_id, type, time, data FROM events WHERE subject = $1 AND type = ANY($2::text[])",
        job_id,
        sorted(JOB_EVENT_TYPES),
    )
    history = []
    for r in rows:
        data = typed(registry, r["type"], r["data"])
        if data is not None:
            history.append(StoredEvent(r["event_id"], r["time"], data))
    row = fold_job(job_id, history)
    if row is not None:
        await upsert_job(conn, row)


_JOB_COLUMNS = (
    "job_id",
    "queue",
    "state",
    "priority",
    "workers",
    "gpus_per_worker",
    "gpu_type",
    "gpu_memory_mib",
    "mig_profile",
    "topology",
    "preemptible",
    "reason",
    "reason_code",
    "spec",
    "submitted_at",
    "admitted_at",
    "placed_at",
    "started_at",
    "finished_at",
    "updated_at",
    "last_event_id",
    "pending_reasons",
    "allocation_id",
    "attempt",
    "cancel_requested_at",
    "submitted_by",
    "gpu_model",
    "granted_at",
    "gpu_seconds",
    "final_state",
)
_JOB_JSON = {"topology", "spec", "pending_reasons"}


def _job_placeholder(i: int, column: str) -> str:
    if column in _JOB_JSON:
        return f"${i}::text::jsonb"
    if column == "gpu_model":
        # A job whose events name no GPU model (no gpu_type asked, an unlimited queue: quota charged no
        # model) takes its latest allocation's, which is the grant's or its node's: what migration 0004
        # filled in for the jobs before it. The batch's allocations are projected before its jobs.
        return (
            f"COALESCE(${i}, (SELECT gpu_model FROM allocations WHERE job_id = $1 "
            "ORDER BY granted_at DESC, rank LIMIT 1))"
        )
    return f"${i}"


async def upsert_job(conn: asyncpg.Connection, row: JobRow) -> None:
    values = []
    for column in _JOB_COLUMNS:
        value = getattr(row, column)
        if column in _JOB_JSON:
            value = None if value is None else _as_json(list(value) if isinstance(value, tuple) else value)
        values.append(value)
    placeholders = ", ".join(_job_placeholder(i, c) for i, c in enumerate(_JOB_COLUMNS, start=1))
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _JOB_COLUMNS if c != "job_id")
    await conn.execute(
        f"INSERT INTO jobs ({', '.join(_JOB_COLUMNS)}) VALUES ({placeholders}) "
        f"ON CONFLICT (job_id) DO UPDATE SET {updates}",
        *values,
    )


# -- allocations ------------------------------------------------------------------------------


async def _project_allocation(conn: asyncpg.Connection, envelope: Envelope) -> None:
    data = envelope.data
    if isinstance(data, allocations.AllocationGranted):
        # The rank's GPU model: the grant's, else the model its node registered.
        await conn.executemany(
            """
            INSERT INTO allocations (allocation_id, job_id, rank, node, gpus, granted_at, granted_event_id,
                                     queue, gpu_model, gpu_share, resizes)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
                    COALESCE($9, (SELECT gpu_model FROM nodes WHERE node = $4)), $10, $11)
            ON CONFLICT (allocation_id, rank) DO NOTHING
            """,
            [
                (
                    data.allocation_id,
                    data.job_id,
                    p.rank,
                    p.node,
                    list(p.gpus),
                    envelope.time,
                    envelope.id,
                    data.queue,
                    data.gpu_type,
                    p.gpu_share,
                    data.resizes,
                )
                for p in data.placements
            ],
        )
    elif isinstance(data, allocations.AllocationReleased):
        await conn.execute(
            """
            UPDATE allocations SET released_at = $2, release_reason = $3, released_event_id = $4,
                gpu_seconds = gpu_share * GREATEST(0, EXTRACT(EPOCH FROM ($2 - granted_at)))
            WHERE allocation_id = $1 AND released_at IS NULL
            """,
            data.allocation_id,
            envelope.time,
            data.reason,
            envelope.id,
        )


# -- nodes ------------------------------------------------------------------------------------


async def _project_node(conn: asyncpg.Connection, envelope: Envelope) -> None:
    node = envelope.subject
    await _lock(conn, "node", node)
    record = await conn.fetchrow("SELECT * FROM nodes WHERE node = $1 FOR UPDATE", node)
    row = None if record is None else node_row(record)
    updated = apply_node_event(row, node, StoredEvent(envelope.id, envelope.time, envelope.data))
    await upsert_node(conn, updated)


def node_row(record: asyncpg.Record) -> NodeRow:
    return NodeRow(
        node=record["node"],
        state=record["state"],
        updated_at=record["updated_at"],
        last_event_id=record["last_event_id"],
        gpu_count=record["gpu_count"],
        gpu_model=record["gpu_model"],
        gpus=tuple(_loaded(record["gpus"])),
        nvlink_domain=record["nvlink_domain"],
        leaf=record["leaf"],
        spine=record["spine"],
        labels=_loaded(record["labels"]),
        health_reason=record["health_reason"],
        registered_at=record["registered_at"],
        last_heartbeat_at=record["last_heartbeat_at"],
        last_seq=record["last_seq"],
        gpu_health=_loaded(record["gpu_health"]),
        state_changed_at=record["state_changed_at"],
    )


async def upsert_node(conn: asyncpg.Connection, row: NodeRow) -> None:
    await conn.execute(
        """
        INSERT INTO nodes (node, state, gpu_count, gpu_model, gpus, nvlink_domain, leaf, spine, labels,
                           health_reason, registered_at, last_heartbeat_at, updated_at, last_event_id,
                           cordoned_gpus, gpu_health, last_seq, state_changed_at)
        VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8, $9::text::jsonb, $10, $11, $12, $13, $14,
                $15, $16::text::jsonb, $17, $18)
        ON CONFLICT (node) DO UPDATE SET
            state = EXCLUDED.state, gpu_count = EXCLUDED.gpu_count, gpu_model = EXCLUDED.gpu_model,
            gpus = EXCLUDED.gpus, nvlink_domain = EXCLUDED.nvlink_domain, leaf = EXCLUDED.leaf,
            spine = EXCLUDED.spine, labels = EXCLUDED.labels, health_reason = EXCLUDED.health_reason,
            registered_at = EXCLUDED.registered_at, last_heartbeat_at = EXCLUDED.last_heartbeat_at,
            updated_at = EXCLUDED.updated_at, last_event_id = EXCLUDED.last_event_id,
            cordoned_gpus = EXCLUDED.cordoned_gpus, gpu_health = EXCLUDED.gpu_health,
            last_seq = EXCLUDED.last_seq, state_changed_at = EXCLUDED.state_changed_at
        """,
        row.node,
        row.state,
        row.gpu_count,
        row.gpu_model,
        _as_json(list(row.gpus)),
        row.nvlink_domain,
        row.leaf,
        row.spine,
        _as_json(dict(row.labels)),
        row.health_reason,
        row.registered_at,
        row.last_heartbeat_at,
        row.updated_at,
        row.last_event_id,
        row.cordoned_gpus,
        _as_json(dict(row.gpu_health)),
        row.last_seq,
        row.state_changed_at,
    )


# -- queues -----------------------------------------------------------------------------------


async def _project_queue_status(conn: asyncpg.Connection, envelope: Envelope) -> None:
    row = queue_status_row(StoredEvent(envelope.id, envelope.time, envelope.data))
    if row is not None:
        await upsert_queue_status(conn, row)


async def upsert_queue_status(conn: asyncpg.Connection, row: QueueStatusRow) -> None:
    """Insert the queue's row, or replace it when ``row`` is not older (:func:`newer_status`, in SQL)."""
    await conn.execute(
        """
        INSERT INTO queue_status (queue, cohort, weight, dominant_share, dominant_resource, position,
                                  ranked_among, resources, as_of, event_id, updated_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9, $10, $11)
        ON CONFLICT (queue) DO UPDATE SET
            cohort = EXCLUDED.cohort, weight = EXCLUDED.weight, dominant_share = EXCLUDED.dominant_share,
            dominant_resource = EXCLUDED.dominant_resource, position = EXCLUDED.position,
            ranked_among = EXCLUDED.ranked_among, resources = EXCLUDED.resources, as_of = EXCLUDED.as_of,
            event_id = EXCLUDED.event_id, updated_at = EXCLUDED.updated_at
        WHERE queue_status.as_of <= EXCLUDED.as_of
        """,
        row.queue,
        row.cohort,
        row.weight,
        row.dominant_share,
        row.dominant_resource,
        row.position,
        row.ranked_among,
        _as_json({r: dict(v) for r, v in row.resources.items()}),
        row.as_of,
        row.event_id,
        row.updated_at,
    )
