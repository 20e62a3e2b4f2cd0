"""``python -m services.agent.demo``: feed a running system a slice of the Philly trace and watch it.

Publishes, time-compressed, the first ``--jobs`` jobs of the Philly trace (preemptible, priority 0,
their run time as ``duration_hint_s``), a few gangs with topology constraints, and after
``--urgent-after-s`` an urgent gang that needs preemption. Shows, until every job it sent has finished
or was rejected, a table of the queues, the GPUs by state, the last events and its counters
(:mod:`services.agent.demo_view`), read from jobs.events, allocations.log, nodes.* and queues.status:
redrawn in place every two seconds on a terminal, printed every ten seconds otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from gangline.bus import EventConsumer, EventProducer
from gangline.events.base import make_envelope
from gangline.events.jobs import JobRequested, Topology
from gangline.events.types import JobId, QueueName
from gangline.fold.cluster import ClusterFold
from gangline.queues_file import unlimited_queues
from gangline.sim.trace import load_philly
from services.agent.demo_view import DemoView, every_s, frame, render
from services.common.env import ServiceSettings, topic_names

SOURCE = "gangline/demo"


def demo_jobs(
    philly: Path, count: int, *, spread_s: float, run: str = ""
) -> list[tuple[float, JobRequested]]:
    """The demo's jobs and when to send them; ``run`` ends every job id, so a second demo against a system
    still up sends new jobs (admission takes a job id again with the same spec as the retry it is)."""
    trace = load_philly(philly, limit=count)
    first = min(j.submit_s for j in trace)
    span = max(1.0, max(j.submit_s for j in trace) - first)
    out: list[tuple[float, JobRequested]] = []
    for j in trace:
        out.append(
            (
                (j.submit_s - first) / span * spread_s,
                JobRequested(
                    job_id=JobId(f"{j.id}{run}"),
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
            job_id=JobId(f"gang-h100-2x8{run}"),
            queue=QueueName("default"),
            workers=2,
            gpus_per_worker=8,
            gpu_type="H100-SXM5-80GB",
            topology=Topology(level="leaf"),
            duration_hint_s=1800,
        ),
        JobRequested(
            job_id=JobId(f"gang-gb200-4x4-nvlink{run}"),
            queue=QueueName("default"),
            workers=4,
            gpus_per_worker=4,
            gpu_type="GB200-186GB",
            topology=Topology(level="nvlink"),
            duration_hint_s=1800,
        ),
        JobRequested(
            job_id=JobId(f"gang-l40s-2x4{run}"),
            queue=QueueName("default"),
            workers=2,
            gpus_per_worker=4,
            gpu_type="L40S-48GB",
            duration_hint_s=900,
        ),
    ]
    out += [(spread_s * (k + 1) / 4, g) for k, g in enumerate(gangs)]
    return sorted(out, key=lambda t: t[0])


def where_to_look(settings: ServiceSettings) -> str:
    """The addresses to open while the demo runs (the ports ``make run`` gives the services)."""
    api = os.environ.get("GANGLINE_API_PORT", "8080")
    analytics = os.environ.get("GANGLINE_ANALYTICS_PORT", "8091")
    return "\n".join(
        [
            f"Dashboard: http://127.0.0.1:{api}/dashboard/#token=dev-ops-admin-token (the dev admin; a "
            "tenant's token, e.g. dev-team-a-token, shows its own queues)",
            f"API:       http://127.0.0.1:{api} (OpenAPI: /docs); 'gangline top' for the cluster map",
            "Metrics:   http://127.0.0.1:9471/metrics (admission) .. 9478 (fake nodes)",
            f"Analytics: http://127.0.0.1:{analytics}/analytics/gpu-hours?window=hour (JSON), /metrics",
            f"Kafka:     {settings.kafka_bootstrap}"
            + (f", topics prefixed {settings.topic_prefix!r}" if settings.topic_prefix else ""),
        ]
    )


async def feed_and_watch(args: argparse.Namespace, settings: ServiceSettings) -> None:
    topics = topic_names(settings)
    jobs = demo_jobs(Path(args.philly), args.jobs, spread_s=args.spread_s, run=f"-{uuid.uuid4().hex[:4]}")
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
    view = DemoView(
        started=datetime.now(UTC),
        sent={str(j.job_id): str(j.queue) for _, j in jobs},
        fold=ClusterFold(unlimited_queues=unlimited_queues(settings.queues_file)),
    )
    started = time.monotonic()
    tty = sys.stdout.isatty()
    links = where_to_look(settings)
    print(links, flush=True)
    if not tty:
        links = ""  # said once above; a log need not repeat it in every table

    async def feed(producer: EventProducer) -> None:
        for at, job in jobs:
            delay = at - (time.monotonic() - started)
            if delay > 0:
                await asyncio.sleep(delay)
            envelope = make_envelope(job, event_id=str(uuid.uuid4()), source=SOURCE, time=datetime.now(UTC))
            await producer.publish(topics.requests, envelope)
            view.requested(envelope)

    # From the start of each topic: the nodes' registrations and quota's figures were written before the
    # demo began, and the fold needs the grants still held; what came before is folded, not counted.
    consumer = EventConsumer(
        settings.kafka_bootstrap,
        [
            topics.events,
            topics.allocations,
            topics.inventory,
            topics.health,
            topics.operator,
            topics.queue_status,
        ],
        service="demo",
        group_id=f"demo-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
    )
    async with EventProducer(settings.kafka_bootstrap) as producer, consumer:
        feeding = asyncio.create_task(feed(producer))
        last = float("-inf")
        while time.monotonic() - started < args.max_s:
            for d in await consumer.getmany(timeout_ms=200):
                view.read(d.envelope)
            now = time.monotonic() - started
            if now - last >= every_s(tty=tty):
                last = now
                print(frame(render(view, now, links=links), tty=tty), flush=True)
            if feeding.done() and view.all_finished:
                break
        feeding.cancel()
    print(frame(render(view, time.monotonic() - started, links=links), tty=tty), flush=True)  # the final view
    print(f"done: {len(view.finished)} of {len(view.sent)} jobs finished; {dict(view.counts)}")


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
