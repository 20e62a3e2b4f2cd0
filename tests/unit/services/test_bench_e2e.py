"""The e2e bench's reader of grants, releases and stages (no Kafka: a stand-in consumer)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from svc_helpers import admitted, env

from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.codec import encode
from gangline.events.jobs import JobQueued, JobStarted
from gangline.events.types import AllocationId, GpuId, JobId, NodeId, QueueName
from services.bench.e2e import Grants, medians, peak_rss_mib, percentile


@dataclass
class Record:
    key: bytes
    value: bytes
    timestamp: int


class Consumer:
    def __init__(self, batches: list[list[Record]]) -> None:
        self.batches = batches

    async def getmany(self, **_: Any) -> dict[str, list[Record]]:
        return {"tp": self.batches.pop(0)} if self.batches else {}


def granted(job: str) -> AllocationGranted:
    return AllocationGranted(
        job_id=JobId(job),
        allocation_id=AllocationId(f"{job}.1"),
        queue=QueueName("default"),
        placements=(Placement(rank=0, node=NodeId("n-0"), gpus=(GpuId("gpu0"),)),),
    )


def record(job: str, event: Any, at: int) -> Record:
    return Record(job.encode(), encode(env(event)), at)


async def test_grants_releases_and_stages_are_read_by_job_id() -> None:
    grants = Grants("unused:9092", "allocations", "events")
    released = AllocationReleased(job_id=JobId("a"), allocation_id=AllocationId("a.1"), reason="completed")
    grants.consumer = Consumer(  # type: ignore[assignment]
        [
            [
                Record(b"a", encode(admitted("a")), 10),
                record("a", JobQueued(job_id=JobId("a"), queue=QueueName("default")), 20),
                record("a", granted("a"), 30),
                record("b", granted("b"), 31),
                record("a", granted("a"), 99),  # read again: the first grant counts
                record("a", JobStarted(job_id=JobId("a"), allocation_id=AllocationId("a.1")), 40),
            ],
            [record("a", released, 50)],
        ]
    )
    await grants.wait_for({"a": 0, "b": 0}, timeout_s=5)
    assert grants.at == {"a": 30, "b": 31}
    assert grants.stage_at[b"job.admitted"] == {"a": 10} and grants.stage_at[b"job.queued"] == {"a": 20}
    assert await grants.wait_for_releases(["a", "b"], timeout_s=0.1) == 1
    assert grants.released == {"a"}


def test_percentile_picks_the_value_at_or_above_the_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 100.0
    assert percentile([7.0], 0.99) == 7.0


def test_medians_over_runs_keep_every_run() -> None:
    runs = [
        {"p99_ms": 120.0, "jobs_per_s": 900.0},
        {"p99_ms": 300.0, "jobs_per_s": 1000.0, "restore_s": 2.5},
        {"p99_ms": 110.0, "jobs_per_s": 1100.0},
    ]
    summary = medians(runs)
    assert summary["p99_ms"] == 120.0 and summary["jobs_per_s"] == 1000.0
    assert summary["restore_s"] == 2.5  # only runs that have a figure count for it
    assert summary["runs"] == runs


def test_peak_memory_is_read_from_the_process_status() -> None:

    peak = peak_rss_mib(os.getpid())
    assert peak is not None and peak > 1.0  # this interpreter holds more than a MiB
    assert peak_rss_mib(2**22 + 1) is None  # above the kernel's pid limit: no such process
