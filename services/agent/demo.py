"""``python -m services.agent.demo``: feed a running system a slice of the Philly trace and watch it.

Publishes, time-compressed, the first ``--jobs`` jobs of the Philly trace (preemptible, priority 0,
their run time as ``duration_hint_s``), a few gangs with topology constraints, and after
``--urgent-after-s`` an urgent gang that needs preemption. Prints progress every two seconds from
``jobs.events`` and ``allocations.log`` until every job it sent has finished or was rejected.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from gangline.bus import EventConsumer, EventProducer
from gangline.events.base import make_envelope
from gangline.events.jobs import JobRequested, Topology
from gangline.events.types import JobId, QueueName
from gangline.sim.trace import load_philly
from services.common.env import ServiceSettings, topic_names

SOURCE = "gangline/demo"
FINAL = {"gangline.job.completed.v1", "gangline.job.rejected.v1", "gangline.job.failed.v1"}


def demo_jobs(philly: Path, count: int, *, spread_s: float) -> list[tuple[float, JobRequested]]:
    trace = load_philly(philly, limit=count)
    first = min(j.submit_s for j in trace)
    span = max(1.0, max(j.submit_s for j in trace) - first)
    out: list[tuple[float, JobRequested]] = []
    for j in trace:
        out.append(
            (
                (j.submit_s - first) / span * spread_s,
                JobRequested(
                    job_id=JobId(str(j.id)),
                    queue=QueueName("default"),
                    workers=j.workers,
                    gpus_per_worker=j.gpus_per_worker,
                    preemptible=True,
                    checkpoint_grace_s=10,
                    # Capped at 30 simulated minutes so the demo ends while you watch.
                    duration_hint_s=max(1, min(1800, int(j.duration_s))),
                ),
            )
        )
    gangs = [
        JobRequested(
            job_id=JobId("gang-h100-2x8"),
            queue=QueueName("default"),
            workers=2,
            gpus_per_worker=8,
            gpu_type="H100-SXM5-80GB",
            topology=Topology(level="leaf"),
            duration_hint_s=1800,
        ),
        JobRequested(
            job_id=JobId("gang-gb200-4x4-nvlink"),
            queue=QueueName("default"),
            workers=4,
            gpus_per_worker=4,
            gpu_type="GB200-186GB",
            topology=Topology(level="nvlink"),
            duration_hint_s=1800,
        ),
        JobRequested(
            job_id=JobId("gang-l40s-2x4"),
            queue=QueueName("default"),
            workers=2,
            gpus_per_worker=4,
            gpu_type="L40S-48GB",
            duration_hint_s=900,
        ),
    ]
    out += [(spread_s * (k + 1) / 4, g) for k, g in enumerate(gangs)]
    return sorted(out, key=lambda t: t[0])


async def feed_and_watch(args: argparse.Namespace, settings: ServiceSettings) -> None:
    topics = topic_names(settings)
    jobs = demo_jobs(Path(args.philly), args.jobs, spread_s=args.spread_s)
    urgent = JobRequested(
        job_id=JobId(f"urgent-{uuid.uuid4().hex[:6]}"),
        queue=QueueName("default"),
        workers=2,
        gpus_per_worker=8,
        gpu_type="H100-SXM5-80GB",
        priority=100,
        duration_hint_s=600,
    )
    jobs.append((args.urgent_after_s, urgent))
    jobs.sort(key=lambda t: t[0])
    sent = {str(j.job_id) for _, j in jobs}
    counts: Counter[str] = Counter()
    finished: set[str] = set()
    started = time.monotonic()

    async def feed(producer: EventProducer) -> None:
        for at, job in jobs:
            delay = at - (time.monotonic() - started)
            if delay > 0:
                await asyncio.sleep(delay)
            envelope = make_envelope(job, event_id=str(uuid.uuid4()), source=SOURCE, time=datetime.now(UTC))
            await producer.publish(topics.requests, envelope)
            counts["requested"] += 1

    consumer = EventConsumer(
        settings.kafka_bootstrap,
        [topics.events, topics.allocations],
        service="demo",
        group_id=f"demo-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="latest",
    )
    async with EventProducer(settings.kafka_bootstrap) as producer, consumer:
        feeding = asyncio.create_task(feed(producer))
        last = 0.0
        while time.monotonic() - started < args.max_s:
            for d in await consumer.getmany(timeout_ms=200):
                if d.envelope.subject not in sent:
                    continue
                counts[d.envelope.type.split(".")[1] + "." + d.envelope.type.split(".")[2]] += 1
                if d.envelope.type in FINAL:
                    finished.add(d.envelope.subject)
            now = time.monotonic() - started
            if now - last >= 2:
                last = now
                shown = " ".join(
                    f"{k.split('.')[-1]}={counts[k]}"
                    for k in (
                        "requested",
                        "job.admitted",
                        "job.rejected",
                        "allocation.granted",
                        "job.preempting",
                        "job.requeued",
                        "allocation.released",
                        "job.completed",
                    )
                )
                print(f"[{now:6.1f}s] {shown}  finished {len(finished)}/{len(sent)}", flush=True)
            if feeding.done() and finished >= sent:
                break
        feeding.cancel()
    print(f"done: {len(finished)} of {len(sent)} jobs finished; {dict(counts)}")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m services.agent.demo", description=__doc__)
    p.add_argument(
        "--philly",
        default=str(Path(__file__).resolve().parents[3] / "shared/traces/pollux-philly/philly.csv"),
    )
    p.add_argument("--jobs", type=int, default=120)
    p.add_argument("--spread-s", type=float, default=30.0, help="real seconds over which the slice arrives")
    p.add_argument("--urgent-after-s", type=float, default=20.0)
    p.add_argument("--max-s", type=float, default=600.0)
    args = p.parse_args()
    try:
        asyncio.run(feed_and_watch(args, ServiceSettings.from_env()))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
