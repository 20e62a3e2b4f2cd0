"""Helpers for end-to-end tests: a private set of topics, services as tasks or processes, log readers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition

from gangline.bus.admin import delete_topics, ensure_topics
from gangline.bus.security import KafkaSecurity, client_options
from gangline.bus.trust import WriterSigner, default_signer
from gangline.cluster_spec import ClusterSpec, load_cluster_spec
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.codec import DecodeError, decode
from services.agent.fake import FakeCluster
from services.bench.wire import plain_event
from services.common.topics import TopicNames

ROOT = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def private_topics(bootstrap: str, name: str) -> AsyncIterator[TopicNames]:
    """The catalogue's topics under a fresh prefix, deleted afterwards."""
    topics = TopicNames(prefix=f"e2e-{name}-{uuid.uuid4().hex[:8]}.")
    specs = topics.specs()
    await ensure_topics(bootstrap, specs)
    try:
        yield topics
    finally:
        await delete_topics(bootstrap, [s.name for s in specs])


def service_env(bootstrap: str, topics: TopicNames, **extra: str) -> dict[str, str]:
    return {
        "GANGLINE_KAFKA_BOOTSTRAP": bootstrap,
        "GANGLINE_TOPIC_PREFIX": topics.prefix,
        "GANGLINE_GROUP_PREFIX": f"g-{topics.prefix.rstrip('.')}",
        "GANGLINE_INSTANCE_ID": "i0",
        **{f"GANGLINE_{k.upper()}": v for k, v in extra.items()},
    }


class Tasks:
    """Services run as tasks of the test's event loop; all cancelled on exit."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[Any]] = {}

    def start(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self.tasks[name] = task
        return task

    def check(self) -> None:
        """Fail loudly when a service task died."""
        for name, task in self.tasks.items():
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError(f"service {name} died") from task.exception()

    async def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Proc:
    """A service as a real subprocess (``python -m services.<name>``), logging to a file."""

    def __init__(self, module: str, env: Mapping[str, str], log_path: Path) -> None:
        self.module = module
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LogReader:
    """Reads topics from the beginning (read_committed) and keeps every decoded event and raw record."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.events: dict[str, list[Envelope]] = {t: [] for t in topics}
        self.raw: dict[str, list[bytes | None]] = {t: [] for t in topics}
        self.headers: dict[str, list[list[tuple[str, bytes]]]] = {t: [] for t in topics}
        self.stamped: dict[str, list[tuple[int, Envelope]]] = {t: [] for t in topics}
        self.partitions: dict[str, list[int]] = {t: [] for t in topics}
        """The partition of each decoded event (``events``' order)."""
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> LogReader:
        self._consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.bootstrap,
            **client_options(),
            group_id=None,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def poll(self) -> int:
        assert self._consumer is not None
        batch = await self._consumer.getmany(timeout_ms=200, max_records=5000)
        n = 0
        for tp, records in batch.items():
            for record in records:
                self.raw[tp.topic].append(record.value)
                self.headers[tp.topic].append(list(record.headers))
                with contextlib.suppress(DecodeError):
                    envelope = decode(record.value or b"")
                    self.events[tp.topic].append(envelope)
                    self.stamped[tp.topic].append((record.timestamp, envelope))
                    self.partitions[tp.topic].append(tp.partition)
                n += 1
        return n

    async def until(
        self, done: Callable[[], bool], *, timeout_s: float, check: Callable[[], None] = lambda: None
    ) -> None:
        """Poll until ``done()``; raises TimeoutError after ``timeout_s`` (a bound, not a timed assertion)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not done():
            check()
            if loop.time() > deadline:
                raise TimeoutError(
                    f"the expected events did not all arrive; the log so far:\n{self.summary()}"
                )
            await self.poll()

    def summary(self, last: int = 40) -> str:
        lines = []
        for topic, events in self.events.items():
            lines.append(f"{topic}: {len(events)} events")
            lines += [f"  {e.type} {e.subject} {e.data.model_dump_json()[:300]}" for e in events[-last:]]
        return "\n".join(lines)

    def of(self, topic: str, kind: type[Any]) -> list[Any]:
        return [e.data for e in self.events[topic] if isinstance(e.data, kind)]

    def grants(self, topic: str, job: str) -> list[AllocationGranted]:
        """The grants to ``job`` read so far from ``topic`` (the allocations log), in log order."""
        return [g for g in self.of(topic, AllocationGranted) if g.job_id == job]


async def end_offsets(bootstrap: str, topic: str) -> int:
    # Subscribed to it, so that starting fetches its metadata (its partitions).
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, **client_options(), group_id=None)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        assert parts, f"{topic} does not exist or may not be read"
        tps = [TopicPartition(topic, p) for p in parts]
        ends = await consumer.end_offsets(tps)
        return sum(ends.values())
    finally:
        await consumer.stop()


def audit_allocations(stamped: list[tuple[int, Envelope]]) -> list[str]:
    """Replay allocations.log: problems when a GPU is held by two jobs at once or a gang is partial.

    Partitions are merged by record timestamp (a release is always written before the grant it
    made possible); on a tie the release goes first.
    """
    ordered = sorted(stamped, key=lambda te: (te[0], 0 if isinstance(te[1].data, AllocationReleased) else 1))
    events = [e for _, e in ordered]
    problems: list[str] = []
    holder: dict[tuple[str, str], str] = {}
    live: dict[str, AllocationGranted] = {}
    for envelope in events:
        data = envelope.data
        if isinstance(data, AllocationGranted):
            if data.allocation_id in live:
                problems.append(f"allocation {data.allocation_id} granted twice")
                continue
            ranks = sorted(p.rank for p in data.placements)
            if ranks != list(range(len(ranks))):
                problems.append(f"allocation {data.allocation_id} has ranks {ranks}")
            for p in data.placements:
                for gpu in p.gpus:
                    other = holder.get((p.node, gpu))
                    if other is not None:
                        problems.append(
                            f"GPU {p.node}/{gpu} granted to {data.allocation_id} while {other} holds it"
                        )
                    holder[(p.node, gpu)] = data.allocation_id
            live[data.allocation_id] = data
        elif isinstance(data, AllocationReleased):
            granted = live.pop(data.allocation_id, None)
            if granted is None:
                continue
            for p in granted.placements:
                for gpu in p.gpus:
                    if holder.get((p.node, gpu)) == data.allocation_id:
                        del holder[(p.node, gpu)]
    return problems


def start_pipeline(
    tasks: Tasks,
    env: Mapping[str, str],
    *,
    only: tuple[str, ...] | None = None,
    metrics_ports: Mapping[str, int] | None = None,
) -> None:
    """Every decision service (or those named in ``only``) as a task of the running loop; each serves
    ``/metrics`` on its port in ``metrics_ports`` (by default none: tests run side by side)."""
    from services.admission.settings import AdmissionSettings
    from services.admission.wiring import main as admission_main
    from services.node_health.settings import NodeHealthSettings
    from services.node_health.wiring import main as node_health_main
    from services.placement.settings import PlacementSettings
    from services.placement.wiring import main as placement_main
    from services.preemption.settings import PreemptionSettings
    from services.preemption.wiring import main as preemption_main
    from services.quota.settings import QuotaSettings
    from services.quota.wiring import main as quota_main

    ports = metrics_ports or {}

    def port(name: str) -> dict[str, int | None]:
        return {"metrics_port": ports.get(name)}

    mains: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
        "admission": lambda: admission_main(AdmissionSettings.from_env(env, **port("admission"))),
        "quota": lambda: quota_main(QuotaSettings.from_env(env, **port("quota"))),
        "placement": lambda: placement_main(PlacementSettings.from_env(env, **port("placement"))),
        "preemption": lambda: preemption_main(PreemptionSettings.from_env(env, **port("preemption"))),
        "node_health": lambda: node_health_main(NodeHealthSettings.from_env(env, **port("node_health"))),
    }
    for name, make in mains.items():
        if only is None or name in only:
            tasks.start(name, make())


async def start_cluster(
    tasks: Tasks, cluster: FakeCluster, env: Mapping[str, str], *, only: tuple[str, ...] | None = None
) -> None:
    """The fake nodes as a task, until they registered; then the decision services (``only`` those) as
    tasks (:func:`start_pipeline`)."""
    tasks.start("fake-nodes", cluster.run())
    await cluster.ready.wait()
    start_pipeline(tasks, env, only=only)


def placement_replica(
    env: Mapping[str, str], instance_id: str, log_path: Path, *, pool: str | None = None
) -> Proc:
    """A placement replica as its own process (not started), leading ``pool`` first when given."""
    group = {"GANGLINE_POOL_GROUP": pool} if pool is not None else {}
    return Proc("services.placement", {**env, "GANGLINE_INSTANCE_ID": instance_id, **group}, log_path)


def placement_requests(
    prefix: str, count: int, *, seed: int, workers: int | Sequence[int], gpus_per_worker: Sequence[int]
) -> list[tuple[str, bytes]]:
    """``count`` one-second jobs ``<prefix>-000``... in the default queue, of shapes drawn with ``seed``
    (``workers`` fixed, or drawn from those given, before each job's GPUs per worker)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        job = f"{prefix}-{i:03d}"
        shape = {
            "workers": workers if isinstance(workers, int) else rng.choice(workers),
            "gpus_per_worker": rng.choice(gpus_per_worker),
        }
        jobs.append((job, request_bytes(job, queue="default", **shape, duration_hint_s=1)))
    return jobs


URGENT = "urgent"
"""The urgent gang of the preemption stories: 2 x 8 GPUs at priority 100, one second long."""


async def urgent_gang_after(
    log: LogReader,
    bootstrap: str,
    topics: TopicNames,
    victims: Sequence[str],
    *,
    timeout_s: float,
    check: Callable[[], None],
) -> None:
    """Once every one of ``victims`` holds a grant (the cluster full of them), send the urgent gang."""
    await log.until(
        lambda: all(log.grants(topics.allocations, v) for v in victims), timeout_s=timeout_s, check=check
    )
    gang = request_bytes(
        URGENT, queue="default", workers=2, gpus_per_worker=8, priority=100, duration_hint_s=1
    )
    await send_raw(bootstrap, topics.requests, [(URGENT, gang)])


def request_bytes(job_id: str, **data: Any) -> bytes:
    """A job.requested envelope as any producer would write it: plain JSON, no Gangline code."""
    return plain_event("job.requested", job_id, data, source="test/raw-producer")


async def send_raw(
    bootstrap: str,
    topic: str,
    messages: list[tuple[str, bytes]],
    *,
    security: KafkaSecurity | None = None,
    signer: WriterSigner | None = None,
) -> None:
    """Write raw records as ``security``'s principal (None: the test session's, the super user), signed
    by ``signer`` when given (:mod:`gangline.bus.trust`), else, as the session's principal, with the key
    the environment gives it (as any Gangline writer would); another principal's records go unsigned."""
    from aiokafka import AIOKafkaProducer

    if signer is None and security is None:
        signer = default_signer()

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_options(security))
    await producer.start()
    try:
        deliveries = []
        for key, raw in messages:
            headers = signer.headers(topic, key.encode(), raw) if signer is not None else []
            deliveries.append(await producer.send(topic, value=raw, key=key.encode(), headers=headers))
        await producer.flush()
        for delivery in deliveries:
            await delivery  # a write the broker refused raises here
    finally:
        await producer.stop()


def fake_cluster(
    bootstrap: str, topics: TopicNames, spec: ClusterSpec | None = None, **options: Any
) -> FakeCluster:
    """The lightweight fake nodes on a test's private topics (``deploy/clusters/default.yaml`` by default)."""
    spec = spec or load_cluster_spec(ROOT / "deploy" / "clusters" / "default.yaml")
    return FakeCluster(
        spec=spec,
        pools=spec.pools.layout() if spec.pools is not None else None,
        bootstrap=bootstrap,
        topics=topics,
        group_id=f"g-{topics.prefix.rstrip('.')}.fake-nodes.{(spec.name if spec else 'default')}",
        **options,
    )


async def wait_healthy(url: str, procs: list[asyncio.subprocess.Process], *, timeout_s: float = 30) -> None:
    """Poll ``url``/healthz until it answers 200; fail if one of ``procs`` exits meanwhile."""
    async with httpx.AsyncClient() as client:
        for _ in range(int(timeout_s * 10)):
            try:
                if (await client.get(f"{url}/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert all(p.returncode is None for p in procs), "a service exited during start-up"
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url}/healthz did not answer 200 within {timeout_s} s")
