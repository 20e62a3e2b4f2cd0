"""The event ledger: every event the system saw, stored once by its id.

Recording is idempotent (`ON CONFLICT (event_id) DO NOTHING`), so a consumer that records the
event in the same transaction as its projection update applies each event exactly once:

    async with conn.transaction():
        if await record_event(conn, entry):
            await apply_projection(conn, entry)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

_COLUMNS = (
    'event_id, type, source, subject, time, topic, partition, "offset", causation_id, traceparent, data'
)


@dataclass(frozen=True)
class LedgerEntry:
    """One event as the ledger stores it: the CloudEvents attributes, its payload and where it was read."""

    event_id: str
    type: str
    source: str
    subject: str | None
    time: datetime
    data: Mapping[str, Any] = field(default_factory=dict)
    causation_id: str | None = None
    traceparent: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    @classmethod
    def from_cloudevent(
        cls,
        envelope: Mapping[str, Any],
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> LedgerEntry:
        """From a structured-mode CloudEvents JSON object (as decoded from a Kafka message)."""
        time = envelope["time"]
        return cls(
            event_id=envelope["id"],
            type=envelope["type"],
            source=envelope["source"],
            subject=envelope.get("subject"),
            time=time if isinstance(time, datetime) else datetime.fromisoformat(time),
            data=envelope.get("data") or {},
            causation_id=envelope.get("causationid"),
            traceparent=envelope.get("traceparent"),
            topic=topic,
            partition=partition,
            offset=offset,
        )

    def _row(self) -> tuple[Any, ...]:
        return (
            self.event_id,
            self.type,
            self.source,
            self.subject,
            self.time,
            self.topic,
            self.partition,
            self.offset,
            self.causation_id,
            self.traceparent,
            # Sent as text and cast in SQL, so it works with or without a jsonb codec on the connection.
            json.dumps(self.data, separators=(",", ":"), sort_keys=True),
        )


async def record_event(conn: asyncpg.Connection, entry: LedgerEntry) -> bool:
    """Store `entry` unless an event with its id is already there; return True when it was new."""
    inserted = await conn.fetchval(
        f"""
        INSERT INTO events ({_COLUMNS})
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::text::jsonb)
        ON CONFLICT (event_id) DO NOTHING
        RETURNING true
        """,
        *entry._row(),
    )
    return inserted is True


async def record_events(conn: asyncpg.Connection, entries: Sequence[LedgerEntry]) -> list[str]:
    """Store a batch in one statement; return the ids that were new, in input order, each once.

    Rows go in by event id, whatever the input order: two writers whose batches overlap then wait
    on the same id first instead of each holding one the other needs (PostgreSQL's "deadlock
    detected" on the unique index).
    """
    if not entries:
        return []
    by_id = sorted(entries, key=lambda e: e.event_id)
    columns = list(zip(*(e._row() for e in by_id), strict=True))
    rows = await conn.fetch(
        f"""
        INSERT INTO events ({_COLUMNS})
        SELECT event_id, type, source, subject, time, topic, partition, "offset",
               causation_id, traceparent, data::jsonb
        FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::text[],
                    $7::integer[], $8::bigint[], $9::text[], $10::text[], $11::text[])
             AS batch(event_id, type, source, subject, time, topic, partition, "offset",
                      causation_id, traceparent, data)
        ORDER BY event_id
        ON CONFLICT (event_id) DO NOTHING
        RETURNING event_id
        """,
        *(list(c) for c in columns),
    )
    new = {r["event_id"] for r in rows}
    ordered: list[str] = []
    for entry in entries:
        if entry.event_id in new:
            ordered.append(entry.event_id)
            new.discard(entry.event_id)
    return ordered
