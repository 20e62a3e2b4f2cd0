"""A small cluster's day, as events the ledger projects: three nodes, two queues, jobs that cross
midnight, a preemption, a failure, a rejection. Used by test_accounting.py, and by
``python tests/integration/ledger/accounting_world.py DSN`` (fills that database; readme_examples.py runs the
README's example queries on it)."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import asyncpg

from gangline.bus import Delivery
from gangline.bus.records import RecordMeta
from gangline.events import allocations, jobs, nodes
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.registry import default_registry
from gangline.events.topics import topic_for
from gangline.store.migrate import migrate
from gangline.store.pool import create_pool
from services.ledger.store import project_batch

T0 = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
NODES = {"h0": ("H100-SXM5-80GB", 8), "h1": ("H100-SXM5-80GB", 8), "a0": ("A100-SXM4-40GB", 4)}


def _envelope(data: Event, n: int, time: datetime) -> Envelope:
    return make_envelope(data, event_id=f"acct-{n}", source="tests/accounting", time=time)


def _registration(node: str, model: str, count: int) -> nodes.NodeRegistered:
    gpus = [
        {"id": f"gpu{i}", "index": i, "uuid": f"GPU-{node}-{i}", "model": model, "memory_mib": 40960}
        for i in range(count)
    ]
    return nodes.NodeRegistered.model_validate(
        {
            "node": node,
            "address": f"{node}.local",
            "gpus": gpus,
            "nvlink_domain": node,
            "leaf": "l0",
            "spine": "s0",
        }
    )


def world(seed: int = 7, n_jobs: int = 24) -> list[Envelope]:
    """The events in time order (a node's GPUs are never granted twice at once: each job takes a whole
    node, one after the other on it)."""
    rng = random.Random(seed)
    out: list[tuple[datetime, Event]] = [
        (T0 - timedelta(hours=1), _registration(n, m, c)) for n, (m, c) in NODES.items()
    ]
    free_at = {n: T0 for n in NODES}
    for i in range(n_jobs):
        job = f"acct-{i:02d}"
        node = rng.choice(sorted(NODES))
        model, count = NODES[node]
        queue = "team-a" if i % 3 else "team-b"
        spec = jobs.JobSpec(queue=queue, workers=1, gpus_per_worker=count, gpu_type=model)
        asked = T0 + timedelta(minutes=rng.randrange(0, 6 * 60))
        out.append((asked, jobs.JobRequested(job_id=job, **spec.model_dump())))
        if i == 5:
            out.append((asked, jobs.JobRejected(job_id=job, code="unknown_queue", reason="no such queue")))
            continue
        admitted = asked + timedelta(seconds=1)
        out.append((admitted, jobs.JobAdmitted(job_id=job, spec=spec)))
        out.append((admitted, jobs.JobQueued(job_id=job, queue=queue, gpu_type=model)))
        start = max(admitted + timedelta(seconds=rng.randrange(5, 600)), free_at[node])
        placement = allocations.Placement(rank=0, node=node, gpus=tuple(f"gpu{g}" for g in range(count)))
        alloc = f"{job}.a1"
        out.append((start, jobs.JobPlaced(job_id=job, allocation_id=alloc, nodes=(node,))))
        out.append(
            (
                start,
                allocations.AllocationGranted(
                    job_id=job, allocation_id=alloc, queue=queue, gpu_type=model, placements=(placement,)
                ),
            )
        )
        out.append((start + timedelta(seconds=2), jobs.JobStarted(job_id=job, allocation_id=alloc)))
        end = start + timedelta(minutes=rng.randrange(20, 240))
        free_at[node] = end
        if i == 8:
            out.append(
                (
                    end,
                    jobs.JobPreempted(
                        job_id=job, allocation_id=alloc, checkpointed=True, lost_gpu_seconds=600
                    ),
                )
            )
            out.append(
                (end, allocations.AllocationReleased(job_id=job, allocation_id=alloc, reason="preempted"))
            )
            out.append((end, jobs.JobRequeued(job_id=job, reason="preempted", attempt=2)))
            again = max(end + timedelta(minutes=5), free_at[node])
            alloc = f"{job}.a2"
            out.append(
                (
                    again,
                    allocations.AllocationGranted(
                        job_id=job, allocation_id=alloc, queue=queue, gpu_type=model, placements=(placement,)
                    ),
                )
            )
            end = again + timedelta(minutes=30)
            free_at[node] = end
        failed = i % 7 == 0
        final: Event = (
            jobs.JobFailed(job_id=job, allocation_id=alloc, code="worker_exit", reason="rank 0 exited 1")
            if failed
            else jobs.JobCompleted(job_id=job, allocation_id=alloc)
        )
        out.append((end, final))
        reason: allocations.ReleaseReason = "failed" if failed else "completed"
        out.append((end, allocations.AllocationReleased(job_id=job, allocation_id=alloc, reason=reason)))
    ordered = sorted(enumerate(out), key=lambda x: (x[1][0], x[0]))
    return [_envelope(data, n, time) for n, (_, (time, data)) in enumerate(ordered)]


def deliveries(envelopes: Sequence[Envelope]) -> list[Delivery]:
    return [
        Delivery(
            envelope=e,
            meta=RecordMeta(
                topic=topic_for(e.data),
                partition=0,
                offset=i,
                key=e.subject.encode(),
                timestamp_ms=int(e.time.timestamp() * 1000),
                headers=(),
            ),
        )
        for i, e in enumerate(envelopes)
    ]


async def fill(pool: asyncpg.Pool, envelopes: Sequence[Envelope], batch: int = 16) -> None:
    """Project ``envelopes`` as the ledger does: a batch per transaction, in log order."""
    registry = default_registry()
    items = deliveries(envelopes)
    for k in range(0, len(items), batch):
        async with pool.acquire() as conn, conn.transaction():
            await project_batch(conn, items[k : k + batch], registry)


async def _main(dsn: str) -> None:
    pool = await create_pool(dsn)
    try:
        async with pool.acquire() as conn:
            await migrate(conn)
        await fill(pool, world())
    finally:
        await pool.close()
    print(f"filled; the README's queries on it: python tests/integration/ledger/readme_examples.py {dsn}")


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1]))
