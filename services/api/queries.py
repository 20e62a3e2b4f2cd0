"""What the API reads from the projections (PostgreSQL); no writes here, the ledger owns the tables.

List endpoints page by keyset: the cursor is the sort key of the last row returned, so a page never
skips or repeats a row when new rows arrive meanwhile.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from gangline.core.queues import Resource, gpu_resource, mig_resource
from gangline.events.registry import JOB_EVENT_TYPES


class BadCursor(ValueError):
    """A page cursor this API did not hand out."""


@dataclass(frozen=True)
class Visible:
    """What a tenant may see: every job of ``queues``, and the jobs ``owner`` submitted to ``default``."""

    queues: Sequence[str]
    owner: str


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CURSOR_SEP = "~"
"""Between the parts of a cursor: in no id (SAFE_ID_PATTERN), unreserved in a URL."""
_CURSOR_PART = {
    datetime: "[0-9]{1,17}",  # microseconds since the epoch: up to the year 5138
    int: "[0-9]{1,9}",
}


def cursor_pattern(kinds: Sequence[type], *, id_chars: int) -> str:
    """The pattern of a cursor of ``kinds`` (ids of at most ``id_chars``): every string it matches is a
    cursor the list takes (a position in its sort order, whether a row sits there or not), so the
    OpenAPI says exactly which cursors are valid."""
    ids = f"[A-Za-z0-9][A-Za-z0-9._-]{{0,{id_chars - 1}}}"
    return "^" + CURSOR_SEP.join(_CURSOR_PART.get(k, ids) for k in kinds) + "$"


def encode_cursor(*key: object) -> str:
    """The sort key of a list's last row, as text: times in microseconds since the epoch, ids and
    numbers as they are, joined by ``~``."""
    parts = [_micros(k) if isinstance(k, datetime) else str(k) for k in key]
    return CURSOR_SEP.join(parts)


def _micros(at: datetime) -> str:
    aware = at if at.tzinfo else at.replace(tzinfo=UTC)
    return str((aware - EPOCH) // timedelta(microseconds=1))


def decode_cursor(cursor: str, kinds: Sequence[type]) -> list[Any]:
    """The sort key a cursor of :func:`cursor_pattern` holds; :class:`BadCursor` for any other string."""
    parts = cursor.split(CURSOR_SEP)
    if len(parts) != len(kinds) or re.fullmatch(cursor_pattern(kinds, id_chars=1000), cursor) is None:
        raise BadCursor(f"not a cursor of this list: {cursor!r}")
    try:
        return [
            EPOCH + timedelta(microseconds=int(p)) if k is datetime else k(p)
            for p, k in zip(parts, kinds, strict=True)
        ]
    except (ValueError, TypeError, OverflowError) as error:
        raise BadCursor(f"not a cursor of this list: {cursor!r}") from error


def _loaded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def job_json(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items()}
    for key in ("spec", "topology", "pending_reasons"):
        if key in out:
            out[key] = _loaded(out[key])
    return out


async def job(conn: asyncpg.Connection, job_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1", job_id)
    return None if row is None else job_json(row)


async def job_events(conn: asyncpg.Connection, job_id: str) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        """
        SELECT event_id, type, source, time, causation_id, traceparent, topic, data FROM events
        WHERE subject = $1 AND type = ANY($2::text[]) ORDER BY time, recorded_at
        """,
        job_id,
        sorted(JOB_EVENT_TYPES),
    )
    return [{**dict(r), "data": _loaded(r["data"])} for r in rows]


async def requested(conn: asyncpg.Connection, job_id: str) -> dict[str, Any] | None:
    """The job's request as the ledger recorded it (its ``data``), before any projection has the job."""
    row = await conn.fetchrow(
        """
        SELECT data FROM events
        WHERE subject = $1 AND type = 'gangline.job.requested.v1' LIMIT 1
        """,
        job_id,
    )
    data = None if row is None else _loaded(row["data"])
    return data if isinstance(data, dict) and isinstance(data.get("queue"), str) else None


async def job_known(db: asyncpg.Pool | asyncpg.Connection, job_id: str) -> bool:
    """Whether a job of this id exists: projected (:func:`job`) or only requested so far (:func:`requested`),
    asked in one round trip (a submission asks it each time)."""
    known = await db.fetchval(
        """
        SELECT EXISTS (SELECT 1 FROM jobs WHERE job_id = $1)
            OR EXISTS (
                SELECT 1 FROM events
                WHERE subject = $1 AND type = 'gangline.job.requested.v1'
                  AND jsonb_typeof(
                      CASE WHEN jsonb_typeof(data) = 'string' THEN (data #>> '{}')::jsonb ELSE data END
                      -> 'queue'
                  ) = 'string'
            )
        """,
        job_id,
    )
    return bool(known)


def requested_job(data: Mapping[str, Any]) -> dict[str, Any]:
    """A job known only by its request, shaped like a job row (state ``requested``)."""
    return {
        "job_id": data["job_id"],
        "queue": data["queue"],
        "state": "requested",
        "reason": None,
        "priority": data.get("priority", 0),
        "workers": data.get("workers"),
        "gpus_per_worker": data.get("gpus_per_worker"),
        "gpu_type": data.get("gpu_type"),
        "submitted_by": data.get("submitted_by"),
        "spec": dict(data),
    }


FINAL_STATES = ("completed", "failed", "cancelled", "rejected")
"""Job states after which nothing more happens to the job."""

_VISIBLE = """($1::text[] IS NULL OR {q} = ANY($1::text[]) OR ({q} = 'default' AND {by} = $2))"""
"""The rows a tenant may see ($1 its queues, NULL for an admin; $2 the tenant, for its jobs in default)."""


def _visible(seen: Visible | None) -> tuple[list[str] | None, str | None]:
    return (None, None) if seen is None else (list(seen.queues), seen.owner)


async def jobs(
    conn: asyncpg.Connection,
    *,
    seen: Visible | None,
    queue: str | None,
    state: str | None,
    limit: int,
    after: tuple[datetime, str] | None,
    active: bool | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the jobs ``seen`` allows (None: all), newest first, and the next page's cursor;
    ``active`` true: only jobs not over yet (false: only those over)."""
    rows = await conn.fetch(
        f"""
        SELECT job_id, queue, state, priority, workers, gpus_per_worker, gpu_type, reason, reason_code,
               submitted_by, submitted_at, updated_at, attempt, allocation_id,
               coalesce((SELECT array_agg(DISTINCT a.node ORDER BY a.node) FROM allocations a
                          WHERE a.allocation_id = jobs.allocation_id AND a.released_at IS NULL),
                        '{{}}') AS nodes
        FROM jobs
        WHERE {_VISIBLE.format(q="queue", by="submitted_by")}
          AND ($3::text IS NULL OR queue = $3)
          AND ($4::text IS NULL OR state = $4)
          AND ($5::timestamptz IS NULL OR (submitted_at, job_id) < ($5, $6))
          AND ($8::boolean IS NULL OR (state <> ALL($9::text[])) = $8)
        ORDER BY submitted_at DESC, job_id DESC
        LIMIT $7
        """,
        *_visible(seen),
        queue,
        state,
        after[0] if after else None,
        after[1] if after else None,
        limit + 1,
        active,
        list(FINAL_STATES),
    )
    page = [dict(r) for r in rows[:limit]]
    more = len(rows) > limit
    return page, encode_cursor(page[-1]["submitted_at"], page[-1]["job_id"]) if more and page else None


async def history(
    conn: asyncpg.Connection,
    *,
    seen: Visible | None,
    since: datetime | None,
    queue: str | None,
    now: datetime,
    limit: int,
    after: tuple[datetime, str] | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Accounting, as ``sacct`` shows it: a page of the jobs ``seen`` allows that were submitted, or
    ended, at or after ``since``, newest first, each with its runs (allocations), when it first
    started and ended, and the GPU-hours its allocations held (to ``now`` for one still held).

    GPU-hours count whole GPUs held, a shared slot by its fraction and a MIG slice as one device.
    """
    rows = await conn.fetch(
        f"""
        SELECT j.job_id, j.queue, j.state, j.reason_code, j.reason, j.submitted_by, j.priority, j.workers,
               j.gpus_per_worker, j.gpu_type, j.mig_profile, j.submitted_at, j.finished_at,
               (j.spec->>'time_limit_s')::integer AS time_limit_s,
               u.first_granted_at AS started_at, coalesce(u.runs, 0) AS runs,
               coalesce(u.gpu_hours, 0.0) AS gpu_hours,
               coalesce(u.nodes, '{{}}') AS nodes
        FROM jobs j
        LEFT JOIN LATERAL (
            SELECT min(a.granted_at) AS first_granted_at,
                   count(DISTINCT a.allocation_id) FILTER (WHERE a.resizes IS NULL) AS runs,
                   array_agg(DISTINCT a.node ORDER BY a.node) AS nodes,
                   sum(
                       (CASE WHEN j.spec ? 'gpu_fraction_milli' AND j.spec->>'gpu_fraction_milli' IS NOT NULL
                             THEN (j.spec->>'gpu_fraction_milli')::float8 / 1000.0
                             ELSE cardinality(a.gpus)::float8 END)
                       * extract(epoch FROM (coalesce(a.released_at, $7) - a.granted_at)) / 3600.0
                   ) AS gpu_hours
            FROM allocations a WHERE a.job_id = j.job_id
        ) u ON true
        WHERE {_VISIBLE.format(q="j.queue", by="j.submitted_by")}
          AND ($3::timestamptz IS NULL OR j.submitted_at >= $3 OR j.finished_at >= $3)
          AND ($4::text IS NULL OR j.queue = $4)
          AND ($5::timestamptz IS NULL OR (j.submitted_at, j.job_id) < ($5, $6))
        ORDER BY j.submitted_at DESC, j.job_id DESC
        LIMIT $8
        """,
        *_visible(seen),
        since,
        queue,
        after[0] if after else None,
        after[1] if after else None,
        now,
        limit + 1,
    )
    page = []
    for r in rows[:limit]:
        item = dict(r)
        started, ended = item["started_at"], item["finished_at"]
        item["elapsed_s"] = None if started is None else max(0.0, ((ended or now) - started).total_seconds())
        item["gpu_hours"] = round(float(item["gpu_hours"]), 6)
        page.append(item)
    more = len(rows) > limit
    return page, encode_cursor(page[-1]["submitted_at"], page[-1]["job_id"]) if more and page else None


async def allocations(
    conn: asyncpg.Connection,
    *,
    seen: Visible | None,
    job_id: str | None,
    node: str | None,
    held: bool | None,
    limit: int,
    after: tuple[datetime, str, int] | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the allocation log ``seen`` allows, in grant order (one row per rank), and the next
    page's cursor."""
    rows = await conn.fetch(
        f"""
        SELECT a.allocation_id, a.job_id, j.queue, a.rank, a.node, a.gpus, a.granted_at, a.released_at,
               a.release_reason, a.granted_event_id, a.released_event_id, a.resizes
        FROM allocations a LEFT JOIN jobs j ON j.job_id = a.job_id
        WHERE {_VISIBLE.format(q="j.queue", by="j.submitted_by")}
          AND ($3::text IS NULL OR a.job_id = $3)
          AND ($4::text IS NULL OR a.node = $4)
          AND ($5::boolean IS NULL OR (a.released_at IS NULL) = $5)
          AND ($6::timestamptz IS NULL OR (a.granted_at, a.allocation_id, a.rank) > ($6, $7, $8))
        ORDER BY a.granted_at, a.allocation_id, a.rank
        LIMIT $9
        """,
        *_visible(seen),
        job_id,
        node,
        held,
        after[0] if after else None,
        after[1] if after else None,
        after[2] if after else None,
        limit + 1,
    )
    page = [dict(r) for r in rows[:limit]]
    more = len(rows) > limit
    cursor = (
        encode_cursor(page[-1]["granted_at"], page[-1]["allocation_id"], page[-1]["rank"])
        if more and page
        else None
    )
    return page, cursor


def size_history(allocation_rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A job's sizes over time from its allocation rows (one per rank, in grant order): per allocation
    its workers, when it was granted and released, why, and the allocation it resized (None: a run)."""
    out: dict[str, dict[str, Any]] = {}
    for row in allocation_rows:
        entry = out.get(row["allocation_id"])
        if entry is None:
            entry = out[row["allocation_id"]] = {
                "allocation_id": row["allocation_id"],
                "workers": 0,
                "granted_at": row["granted_at"],
                "released_at": row["released_at"],
                "release_reason": row["release_reason"],
                "resizes": row.get("resizes"),
            }
        entry["workers"] += 1
    return list(out.values())


async def nodes(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        """
        SELECT node, state, gpu_count, gpu_model, gpus, nvlink_domain, leaf, spine, labels, health_reason,
               cordoned_gpus, gpu_health, registered_at, last_heartbeat_at, last_seq,
               (SELECT count(*) FROM allocations a
                 WHERE a.node = n.node AND a.released_at IS NULL) AS ranks_held,
               (SELECT coalesce(sum(cardinality(a.gpus)), 0) FROM allocations a
                 WHERE a.node = n.node AND a.released_at IS NULL) AS gpus_held
        FROM nodes n ORDER BY node
        """
    )
    out = []
    for r in rows:
        item = dict(r)
        for key in ("gpus", "labels", "gpu_health"):
            item[key] = _loaded(item[key])
        out.append(item)
    return out


async def node_known(conn: asyncpg.Connection, node: str) -> bool:
    """Whether the ledger has seen ``node`` (registered, or reported on)."""
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM nodes WHERE node = $1)", node))


async def node_pool_labels(conn: asyncpg.Connection, node: str) -> dict[str, str]:
    """The labels a pool layout may split the cluster by, as the ledger has them for ``node`` (its
    ``labels``, its topology, its GPU model: gangline.fold.adapter.pool_labels); empty if unknown."""
    row = await conn.fetchrow(
        "SELECT labels, spine, leaf, nvlink_domain, gpu_model FROM nodes WHERE node = $1", node
    )
    if row is None:
        return {}
    raw = row["labels"]
    labels = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    for name in ("spine", "leaf", "nvlink_domain", "gpu_model"):
        if row[name] is not None:
            labels[name] = row[name]
    return {str(k): str(v) for k, v in labels.items()}


CORDON_TYPES = ("gangline.node.cordoned.v1", "gangline.node.uncordoned.v1")


async def cordons(conn: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    """Per node an operator's cordon or drain stands for: its mode, reason, since, grace, who asked.

    The latest ``node.cordoned`` / ``node.uncordoned`` of each node in the ledger (nodes.operator).
    """
    rows = await conn.fetch(
        """
        SELECT DISTINCT ON (subject) subject, type, time, data FROM events
        WHERE type = ANY($1::text[])
        ORDER BY subject, time DESC, recorded_at DESC
        """,
        list(CORDON_TYPES),
    )
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["type"] != CORDON_TYPES[0]:
            continue
        data = _loaded(r["data"])
        out[r["subject"]] = {
            "mode": data.get("mode", "cordon"),
            "reason": data.get("reason"),
            "since": r["time"],
            "drain_grace_s": data.get("drain_grace_s"),
            "requested_by": data.get("requested_by"),
        }
    return out


def gpu_models(node_rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(node, gpu id) -> GPU model, from the registered inventory."""
    return {(n["node"], g["id"]): g["model"] for n in node_rows for g in n["gpus"]}


async def queue_usage(
    conn: asyncpg.Connection, models: Mapping[tuple[str, str], str]
) -> tuple[dict[str, dict[Resource, int]], dict[str, dict[str, int]]]:
    """Per queue: resources held now (whole GPUs by model, MIG slices by model/profile) and jobs per state."""
    held = await conn.fetch(
        """
        SELECT j.queue, j.gpu_type, j.mig_profile, j.spec->>'gpu_fraction_milli' AS fraction, a.node, a.gpus
        FROM allocations a JOIN jobs j ON j.job_id = a.job_id
        WHERE a.released_at IS NULL
        """
    )
    usage: dict[str, dict[Resource, int]] = defaultdict(lambda: defaultdict(int))
    for r in held:
        if r["fraction"] is not None:
            continue  # a shared slot holds no whole GPU and no quota unit of its own
        for gpu in r["gpus"]:
            model = models.get((r["node"], gpu)) or r["gpu_type"] or "gpu"
            resource = mig_resource(model, r["mig_profile"]) if r["mig_profile"] else gpu_resource(model)
            usage[r["queue"]][resource] += 1
    states = await conn.fetch("SELECT queue, state, count(*) AS n FROM jobs GROUP BY queue, state")
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for r in states:
        counts[r["queue"]][r["state"]] = int(r["n"])
    return {q: dict(u) for q, u in usage.items()}, dict(counts)


async def queue_statuses(conn: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    """Quota's latest ``queue.status`` per queue (the ``queue_status`` projection), by queue name."""
    rows = await conn.fetch(
        """
        SELECT queue, cohort, weight, dominant_share, dominant_resource, position, ranked_among, resources,
               as_of
        FROM queue_status
        """
    )
    return {r["queue"]: {**dict(r), "resources": _loaded(r["resources"])} for r in rows}
