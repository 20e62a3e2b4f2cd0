"""The analytics app on the real, secured broker: its own principal, its figures, and a kill -9 mid-stream.

The app (``python -m services.analytics``, as User:analytics with the ACLs of deploy/kafka/access.yaml)
reads a stream of job lifecycles written as the services would write them. Its hourly GPU-hours must
equal what the pure fold (``services.analytics.figures``) says of the same events; killed with SIGKILL
while a second stream is being read, the restarted app must show the first stream's hours unchanged
(read back from its changelog topics) and count the second exactly once. Sent SIGTERM while it reads
a stream written in transactions (as the services write theirs), it exits within the grace up.sh gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness import ROOT, Proc, private_topics, service_env
from e2e.test_metrics import check_catalogue
from gangline.bus.acl import apply_access, load_access
from gangline.bus.admin import load_catalogue
from gangline.bus.security import KafkaSecurity, client_options
from gangline.events import allocations, jobs
from gangline.events.allocations import Placement
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.codec import encode
from services.analytics import figures
from services.common.topics import TopicNames

CREDENTIALS = yaml.safe_load((ROOT / "deploy" / "kafka" / "credentials.dev.yaml").read_text(encoding="utf-8"))
QUEUES = ("team-a", "team-b")
MODELS = ("H100-SXM5-80GB", "A100-SXM4-40GB")
STOP_GRACE_S = 20
"""What ``deploy/local/up.sh`` (``make run``, ``make down``) gives a service between SIGTERM and SIGKILL."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lifecycles(prefix: str, n: int, start: datetime, rng: random.Random) -> list[tuple[str, Envelope]]:
    """(topic kind, envelope) for ``n`` jobs admitted from ``start`` on: granted, some preempted and run
    again, all completed or failed; written in time order, as the services would."""
    out: list[tuple[datetime, str, Envelope]] = []

    def add(kind: str, data: Event, time: datetime) -> None:
        out.append(
            (time, kind, make_envelope(data, event_id=f"{data.subject()}-{len(out)}", source="t", time=time))
        )

    for i in range(n):
        job = f"{prefix}-{i:03d}"
        queue, model = rng.choice(QUEUES), rng.choice(MODELS)
        spec = jobs.JobSpec(queue=queue, workers=rng.choice([1, 2]), gpus_per_worker=rng.choice([1, 4, 8]))
        t = start + timedelta(minutes=rng.randrange(0, 120))
        add("events", jobs.JobAdmitted(job_id=job, spec=spec), t)
        attempts = 2 if i % 5 == 0 else 1
        for attempt in range(1, attempts + 1):
            t += timedelta(seconds=rng.randrange(1, 900))
            alloc = f"{job}.a{attempt}"
            placements = tuple(
                Placement(rank=r, node=f"n{r}", gpus=tuple(f"g{g}" for g in range(spec.gpus_per_worker)))
                for r in range(spec.workers)
            )
            add(
                "allocations",
                allocations.AllocationGranted(
                    job_id=job, allocation_id=alloc, queue=queue, gpu_type=model, placements=placements
                ),
                t,
            )
            t += timedelta(seconds=rng.randrange(60, 7200))
            if attempt < attempts:
                lost = rng.randrange(0, 3600)
                add(
                    "events",
                    jobs.JobPreempted(
                        job_id=job, allocation_id=alloc, checkpointed=True, lost_gpu_seconds=lost
                    ),
                    t,
                )
                add(
                    "allocations",
                    allocations.AllocationReleased(job_id=job, allocation_id=alloc, reason="preempted"),
                    t,
                )
                t += timedelta(seconds=1)
                add("events", jobs.JobRequeued(job_id=job, reason="preempted", attempt=attempt + 1), t)
            else:
                ok = i % 7 != 0
                end: Event = (
                    jobs.JobCompleted(job_id=job, allocation_id=alloc)
                    if ok
                    else jobs.JobFailed(job_id=job, allocation_id=alloc, code="worker_exit", reason="exit 1")
                )
                add("events", end, t)
                add(
                    "allocations",
                    allocations.AllocationReleased(
                        job_id=job, allocation_id=alloc, reason="completed" if ok else "failed"
                    ),
                    t,
                )
    return [(kind, env) for _, kind, env in sorted(out, key=lambda x: x[0])]


def expected_hourly(events: list[tuple[str, Envelope]]) -> dict[tuple[str, str, str], float]:
    """GPU-hours per (hour start, queue, model), by the pure fold the app runs (per job, in order)."""
    facts: dict[str, figures.JobFacts] = {}
    hours: dict[tuple[str, str, str], float] = {}
    for _, envelope in events:
        state, measures = figures.fold_job(envelope.subject, facts.get(envelope.subject), envelope)
        facts[envelope.subject] = state
        for m in measures:
            if m.kind == "gpu_seconds":
                hour = datetime.fromtimestamp(m.at, UTC).isoformat().replace("+00:00", "Z")
                hours[(hour, m.queue, m.gpu_model)] = (
                    hours.get((hour, m.queue, m.gpu_model), 0.0) + m.value / 3600
                )
    return hours


def finals(events: list[tuple[str, Envelope]]) -> int:
    return sum(isinstance(e.data, jobs.JobCompleted | jobs.JobFailed) for _, e in events)


def as_hourly(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    return {(r["start"], r["queue"], r["gpu_model"]): r["gpu_hours"] for r in rows}


def same(a: dict[tuple[str, str, str], float], b: dict[tuple[str, str, str], float]) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], abs_tol=1e-5) for k in a)


def differences(
    got: dict[tuple[str, str, str], float], want: dict[tuple[str, str, str], float]
) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
    return {
        k: (got.get(k), want.get(k))
        for k in sorted(set(got) | set(want))
        if not math.isclose(got.get(k, -1.0), want.get(k, -1.0), abs_tol=1e-5)
    }


async def publish(
    bootstrap: str,
    topics: TopicNames,
    events: list[tuple[str, Envelope]],
    *,
    transactional_id: str | None = None,
) -> None:
    """Write ``events`` in order; with ``transactional_id`` each in a transaction of its own (a commit marker
    after every record, as the services' outputs have them)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, **client_options(), acks="all", transactional_id=transactional_id
    )
    await producer.start()
    try:
        for kind, envelope in events:
            topic = topics.events if kind == "events" else topics.allocations
            if transactional_id is None:
                await producer.send(topic, encode(envelope), key=envelope.subject.encode())
                continue
            async with producer.transaction():
                await producer.send(topic, encode(envelope), key=envelope.subject.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def committed_records(bootstrap: str, group: str, topics: TopicNames) -> int:
    """How many input records ``group`` has committed, over allocations.log and jobs.events."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    inputs = {topics.allocations, topics.events}
    return sum(meta.offset for tp, meta in offsets.items() if tp.topic in inputs and meta.offset > 0)


async def until(
    probe: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], proc: Proc, *, timeout_s: float
) -> Any:
    """Poll ``probe()`` until ``done(result)``; TimeoutError (with the last result) past ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Any = None
    while True:
        if not proc.alive():
            raise AssertionError(f"the analytics app exited; see {proc.log_path}")
        try:
            last = await probe()
            if done(last):
                return last
        except httpx.HTTPError:
            pass
        if loop.time() > deadline:
            if proc.proc is not None:  # mode's worker logs every task's stack on SIGUSR1: where it waits
                proc.proc.send_signal(signal.SIGUSR1)
                await asyncio.sleep(2)
            raise TimeoutError(f"not there after {timeout_s}s; last: {last!r}; log {proc.log_path}")
        await asyncio.sleep(0.5)


@dataclass
class Worker:
    """The analytics app as a process (``proc``, not started yet) on private topics, and its HTTP pages."""

    topics: TopicNames
    group: str
    proc: Proc
    http: httpx.AsyncClient

    async def hourly(self) -> dict[tuple[str, str, str], float]:
        response = await self.http.get("/analytics/gpu-hours", params={"window": "hour"})
        response.raise_for_status()
        return as_hourly(response.json())

    async def ended(self) -> int:
        response = await self.http.get("/analytics/jobs")
        response.raise_for_status()
        return sum(n for row in response.json() for n in row["jobs"].values())


@contextlib.asynccontextmanager
async def analytics_worker(bootstrap: str, tmp_path: Path, name: str) -> AsyncIterator[Worker]:
    """Private topics with the ACLs of deploy/kafka/access.yaml, and the app as User:analytics on them
    (stopped with SIGTERM on the way out, if still running)."""
    async with private_topics(bootstrap, name) as topics:
        group_prefix = f"g-{topics.prefix.rstrip('.')}"
        await apply_access(
            bootstrap,
            load_access(ROOT / "deploy" / "kafka" / "access.yaml"),
            load_catalogue(ROOT / "schemas" / "topics.yaml"),
            topic_prefix=topics.prefix,
            group_prefix=group_prefix,
        )
        port = _free_port()
        env = service_env(
            bootstrap,
            topics,
            kafka_username="analytics",
            kafka_password=str(CREDENTIALS["analytics"]),
            analytics_port=str(port),
            analytics_data_dir=str(tmp_path / "faust"),
        )
        proc = Proc("services.analytics", env, tmp_path / "analytics.log")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            try:
                yield Worker(topics, f"{group_prefix}.analytics", proc, http)
            finally:
                proc.terminate()


async def test_hourly_gpu_hours_survive_a_kill_9_mid_stream(kafka_bootstrap: str, tmp_path: Path) -> None:
    rng = random.Random(14)
    base = (datetime.now(UTC) - timedelta(days=2)).replace(hour=0, minute=0, second=0, microsecond=0)
    first = lifecycles("a", 40, base + timedelta(hours=1), rng)
    second = lifecycles("b", 40, base + timedelta(hours=12), rng)  # hours the first stream never touches
    want_first, want_all = expected_hourly(first), expected_hourly(first + second)
    assert set(want_first) < set(want_all)

    async with analytics_worker(kafka_bootstrap, tmp_path, "analytics") as app:
        topics, proc, hourly, ended = app.topics, app.proc, app.hourly, app.ended
        proc.start()
        await publish(kafka_bootstrap, topics, first)
        before = await until(hourly, lambda h: same(h, want_first), proc, timeout_s=180)
        assert await until(ended, lambda n: n >= finals(first), proc, timeout_s=60) == finals(first)

        # The first stream's offsets are committed: the restarted app will not read it again, so its
        # hours after the restart can only come from the changelog topics.
        await until(
            lambda: committed_records(kafka_bootstrap, app.group, topics),
            lambda n: n >= len(first),
            proc,
            timeout_s=60,
        )

        # Mid-stream: the second stream's first half is being read when the app is killed.
        half = len(second) // 2
        await publish(kafka_bootstrap, topics, second[:half])
        await until(hourly, lambda h: len(h) > len(before), proc, timeout_s=120)
        proc.kill9()
        await publish(kafka_bootstrap, topics, second[half:])
        proc.start()

        try:
            after = await until(hourly, lambda h: same(h, want_all), proc, timeout_s=240)
        except TimeoutError:
            got = await hourly()
            raise AssertionError(
                f"hours that differ (got, want): {differences(got, want_all)}; "
                f"jobs ended {await ended()} of {finals(first) + finals(second)}"
            ) from None
        assert same({k: after[k] for k in before}, before)  # the first stream's hours, unchanged
        every = finals(first) + finals(second)
        assert await until(ended, lambda n: n >= every, proc, timeout_s=60) == every  # each once

        metrics = (await app.http.get("/metrics")).text
        scraped = {family.name: family for family in text_string_to_metric_families(metrics)}
        check_catalogue(scraped, "analytics")  # every analytics family of the catalogue, of its type
        assert "gangline_analytics_undecodable_records_total 0.0" in metrics


async def test_the_worker_stops_on_sigterm_mid_stream_within_its_grace(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """SIGTERM while a transactional stream is being read: the worker commits, ends its transactions and
    exits 0 before up.sh would SIGKILL it. (Its last commit used to fail, "Not in the middle of a
    transaction", which left the consumer's thread running and the process alive after its loop closed.)"""
    rng = random.Random(15)
    base = (datetime.now(UTC) - timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    stream = lifecycles("t", 60, base, rng)
    half = len(stream) // 2
    assert finals(stream[:half]) > 0 and finals(stream[half:]) > 0  # jobs end in both halves
    async with analytics_worker(kafka_bootstrap, tmp_path, "analytics-term") as app:
        app.proc.start()
        await publish(kafka_bootstrap, app.topics, stream[:half], transactional_id=f"{app.group}.t0")
        await until(app.ended, lambda n: n > 0, app.proc, timeout_s=180)
        rest = asyncio.create_task(
            publish(kafka_bootstrap, app.topics, stream[half:], transactional_id=f"{app.group}.t1")
        )
        try:
            seen = await app.ended()
            await until(app.ended, lambda n: n > seen, app.proc, timeout_s=120)  # it reads the rest now
            assert app.proc.proc is not None
            app.proc.proc.send_signal(signal.SIGTERM)
            try:
                code = await asyncio.to_thread(app.proc.proc.wait, STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"still running {STOP_GRACE_S} s after SIGTERM (up.sh would SIGKILL it); "
                    f"see {app.proc.log_path}"
                ) from None
        finally:
            await rest
        log = app.proc.log_path.read_text(encoding="utf-8", errors="replace")
        assert code == 0, log[-4000:]
        assert "Error while stopping" not in log, log[-4000:]


async def test_the_analytics_principal_reads_its_inputs_and_writes_nothing_public(
    kafka_bootstrap: str,
) -> None:
    async with private_topics(kafka_bootstrap, "analytics-acl") as topics:
        group_prefix = f"g-{topics.prefix.rstrip('.')}"
        await apply_access(
            kafka_bootstrap,
            load_access(ROOT / "deploy" / "kafka" / "access.yaml"),
            load_catalogue(ROOT / "schemas" / "topics.yaml"),
            topic_prefix=topics.prefix,
            group_prefix=group_prefix,
        )
        analytics = KafkaSecurity(username="analytics", password=str(CREDENTIALS["analytics"]))
        consumer = AIOKafkaConsumer(
            topics.allocations,
            topics.events,
            bootstrap_servers=kafka_bootstrap,
            **analytics.client_options(),
            group_id=f"{group_prefix}.analytics",
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            await consumer.getmany(timeout_ms=500)  # joins its group and fetches: allowed
        finally:
            await consumer.stop()
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, **analytics.client_options())
        await producer.start()
        try:
            for topic in (topics.allocations, topics.events, topics.requests, f"{topics.allocations}.dlq"):
                with pytest.raises(Exception, match=r"(?i)authoriz"):
                    await producer.send_and_wait(topic, b"{}", key=b"k")
        finally:
            await producer.stop()
