"""A recorded log made without Kafka: nodes register, jobs arrive and end, placement decides (pure).

`record_log` plays a small workload through `PlacementModel` on a virtual clock and writes every
message as the services would: `node.registered` on nodes.inventory, `job.requested` on
jobs.requests, `allocation.granted` / `allocation.released` on allocations.log with the hash-chain
headers (`gangline.replay.chain`). Ids and times are derived from the inputs, so the same workload
always gives the same bytes. Tests and the what-if demo use it; the services' own logs (issue 5)
have the same shape.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from gangline.core.framework.profile import Profile
from gangline.core.model import JobId, Node
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.chain import ChainWriter
from gangline.events.jobs import JobRequested
from gangline.events.nodes import GpuInfo, NodeRegistered
from gangline.replay.decide import PlacementModel
from gangline.replay.log import LogRecord
from gangline.sim.trace import TraceJob

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
PARTITIONS = {"jobs.requests": 3, "allocations.log": 3, "nodes.inventory": 1}


def _partition(topic: str, key: str) -> int:
    n = PARTITIONS.get(topic, 1)
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % n


class LogWriter:
    """Appends envelopes to topic partitions with offsets, chaining allocations.log per partition."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []
        self._offsets: dict[tuple[str, int], int] = {}
        self._chains: dict[tuple[str, int, str], ChainWriter] = {}
        self._n = 0

    def append(self, topic: str, data: Event, *, at: float, source: str) -> LogRecord:
        self._n += 1
        env: Envelope = make_envelope(
            data,
            event_id=f"evt-{self._n:08d}",
            source=source,
            time=EPOCH + timedelta(seconds=at),
        )
        body = env.model_dump(mode="json", exclude={"data"}, exclude_none=True)
        body["data"] = env.data.model_dump(mode="json")
        key = env.subject
        part = _partition(topic, key)
        offset = self._offsets.get((topic, part), 0)
        self._offsets[(topic, part)] = offset + 1
        headers: dict[str, str] = {}
        if topic == "allocations.log":
            chain = self._chains.setdefault((topic, part, source), ChainWriter())
            headers = chain.headers_for(body)
        rec = LogRecord(topic, part, offset, key, body, headers, int((EPOCH.timestamp() + at) * 1000))
        self.records.append(rec)
        return rec


def registration(node: Node) -> NodeRegistered:
    """The `node.registered` event of a core node."""
    return NodeRegistered(
        node=node.id,
        address=f"{node.id}.local",
        gpus=tuple(
            GpuInfo(id=g.id, index=g.index, uuid=f"GPU-{g.id}", model=g.model, memory_mib=g.memory_mib)
            for g in node.gpus
        ),
        nvlink_domain=node.domain,
        leaf=node.leaf,
        spine=node.spine,
    )


def request(job: TraceJob) -> JobRequested:
    """The `job.requested` event of a trace job."""
    return JobRequested(
        job_id=job.id,
        queue=job.queue,
        workers=job.workers,
        gpus_per_worker=job.gpus_per_worker,
        gpu_type=job.gpu_type,
        gpu_fraction_milli=job.gpu_milli,
        priority=job.priority,
        preemptible=job.preemptible,
        duration_hint_s=max(1, round(job.duration_s)),
    )


def record_log(
    nodes: Sequence[Node], jobs: Sequence[TraceJob], profile: Profile | None = None
) -> list[LogRecord]:
    """Play `jobs` on `nodes` through placement and return the log, in processing order."""
    model = PlacementModel(profile) if profile is not None else PlacementModel()
    log = LogWriter()
    ends: list[tuple[float, int, str, str]] = []
    seq = 0

    def feed(rec: LogRecord, at: float) -> None:
        nonlocal seq
        for g in model.step(rec):
            granted = AllocationGranted.model_validate(g)
            log.append("allocations.log", granted, at=at, source="gangline/placement")
            job = by_id[JobId(granted.job_id)]
            seq += 1
            heapq.heappush(ends, (at + job.duration_s, seq, granted.job_id, granted.allocation_id))

    by_id = {j.id: j for j in jobs}
    for n in nodes:
        feed(log.append("nodes.inventory", registration(n), at=0.0, source=f"gangline/agent/{n.id}"), 0.0)
    arrivals = sorted(jobs, key=lambda j: (j.submit_s, j.id))
    k = 0
    while k < len(arrivals) or ends:
        next_arrival = arrivals[k].submit_s if k < len(arrivals) else float("inf")
        if ends and ends[0][0] <= next_arrival:
            at, _, job_id, alloc_id = heapq.heappop(ends)
            released = AllocationReleased(job_id=job_id, allocation_id=alloc_id, reason="completed")
            feed(log.append("allocations.log", released, at=at, source="gangline/placement"), at)
        else:
            j = arrivals[k]
            k += 1
            feed(log.append("jobs.requests", request(j), at=j.submit_s, source="gangline/api"), j.submit_s)
    return log.records
