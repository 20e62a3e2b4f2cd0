"""``python -m services.bench.failover``: how long a single-leader service takes to fail over after kill -9.

Runs two replicas of ``--service`` (quota, placement, preemption or node_health) as real processes, each
under a supervisor that starts it again a second after it exits (as ``make up``'s does), with admission
(and placement or quota where the load needs them) beside them, on a private set of topics of the
broker at ``--bootstrap`` (never restarted), and simulated nodes in this process. Under a steady load
of one- and two-GPU jobs (``--rate`` a second, in an unlimited queue and a limited one, each running a
second or two), it kills the leading replica with SIGKILL ``--kills`` times, waiting between kills until
the killed one runs again as a standby, and times, per kill:

- ``acquired_s``: until the standby logs that it holds the lock;
- ``processing_s``: until it logs that its processor started (restored, consuming);
- ``first_output_s``: until the first record the service wrote after the kill (its record timestamp,
  read_committed): what the cluster waits for. quota and placement answer every job; preemption and
  node_health write only when something calls for it, so for them ``processing_s`` is the figure.

Prints one JSON line: the service, the session timeouts in use, every kill's figures and their medians.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gangline.bus.admin import delete_topics, ensure_topics
from gangline.bus.security import client_options
from gangline.cluster_spec import load_cluster_spec
from services.agent.fake import FakeCluster
from services.bench.chaos import QUEUES, ROOT, Service, password, request_bytes
from services.common.replay import SOURCES
from services.common.topics import TopicNames

LEADERS = ("quota", "placement", "preemption", "node_health")
NEEDS = {
    "quota": ("admission", "placement"),
    "placement": ("admission", "quota"),
    "preemption": ("admission", "quota", "placement"),
    "node_health": ("admission", "quota", "placement"),
}
"""What else runs so that the load reaches the service under test."""


def now_ms() -> int:
    return int(time.time() * 1000)


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def count(service: Service, line: str) -> int:
    """How often ``line`` is in the service's log (every run appends to it)."""
    try:
        return service.log_path.read_text(errors="replace").count(line)
    except FileNotFoundError:
        return 0


class Replica(Service):
    """One replica of the service under test; remembers what its log said when it started."""

    acquired_at_start: int = 0
    joined_at_start: int = 0

    def start(self) -> None:
        self.acquired_at_start = count(self, '"leadership acquired"')
        self.joined_at_start = count(self, JOINED_LOCK)
        super().start()

    def waits(self) -> bool:
        """Whether its run now alive joined the lock's group (a standby ready to take over)."""
        alive = self.proc is not None and self.proc.poll() is None
        return alive and count(self, JOINED_LOCK) > self.joined_at_start


JOINED_LOCK = ".leader with generation"
"""aiokafka's "Successfully synced group <group>.leader with generation N": a member of the lock's group."""


class Failover:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.topics = TopicNames(prefix=f"failover-{uuid.uuid4().hex[:8]}.")
        self.logs = Path(tempfile.mkdtemp(prefix="gangline-failover-"))
        self.queues_file = self.logs / "queues.yaml"
        self.queues_file.write_text(QUEUES, encoding="utf-8")
        self.outputs: list[int] = []
        """Record timestamps of the service's outputs, as read (read_committed)."""
        name = args.service
        self.replicas = [
            Replica(name, self.env(f"{name}-{k}"), self.logs / f"{name}-{k}.log", args.restart_delay_s)
            for k in range(2)
        ]
        self.others = [
            Service(other, self.env(other), self.logs / f"{other}.log", args.restart_delay_s)
            for other in NEEDS[name]
        ]

    def env(self, instance: str) -> dict[str, str]:
        overrides = {
            k: v
            for k, v in (
                ("GANGLINE_SESSION_TIMEOUT_MS", self.args.session_timeout_ms),
                ("GANGLINE_LOCK_SESSION_TIMEOUT_MS", self.args.lock_session_timeout_ms),
            )
            if v is not None
        }
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("GANGLINE_")},
            "PYTHONPATH": f"{ROOT / 'libs'}:{ROOT}",
            "GANGLINE_KAFKA_BOOTSTRAP": self.args.bootstrap,
            "GANGLINE_KAFKA_USERNAME": os.environ.get("GANGLINE_KAFKA_USERNAME", "admin"),
            "GANGLINE_KAFKA_PASSWORD": os.environ.get("GANGLINE_KAFKA_PASSWORD", password("admin")),
            "GANGLINE_TOPIC_PREFIX": self.topics.prefix,
            "GANGLINE_GROUP_PREFIX": f"g-{self.topics.prefix.rstrip('.')}",
            "GANGLINE_INSTANCE_ID": instance,
            "GANGLINE_QUEUES_FILE": str(self.queues_file),
            "GANGLINE_SILENCE_S": "30",
            "GANGLINE_LOG_LEVEL": "INFO",
            **{k: str(v) for k, v in overrides.items()},
        }

    def note(self, what: str) -> None:
        print(f"[failover {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)

    async def run(self) -> dict[str, Any]:
        os.environ.setdefault("GANGLINE_KAFKA_USERNAME", "admin")
        os.environ.setdefault("GANGLINE_KAFKA_PASSWORD", password("admin"))
        specs = self.topics.specs()
        await ensure_topics(self.args.bootstrap, specs)
        self.note(f"topics {self.topics.prefix}* on {self.args.bootstrap}; logs in {self.logs}")
        tasks: list[asyncio.Task[Any]] = []
        try:
            cluster = FakeCluster(
                spec=load_cluster_spec(ROOT / "deploy" / "clusters" / "default.yaml"),
                bootstrap=self.args.bootstrap,
                topics=self.topics,
                group_id=f"g-{self.topics.prefix.rstrip('.')}.fake-nodes",
                heartbeat_s=1.0,
            )
            tasks.append(asyncio.create_task(cluster.run()))
            await asyncio.wait_for(cluster.ready.wait(), 60)
            for service in self.others:
                service.start()
                tasks.append(asyncio.create_task(service.supervise()))
            self.replicas[0].start()
            tasks.append(asyncio.create_task(self.replicas[0].supervise()))
            await self.until(lambda: self.acquired(self.replicas[0]), 90, "the first replica leads")
            self.replicas[1].start()
            tasks.append(asyncio.create_task(self.replicas[1].supervise()))
            tasks.append(asyncio.create_task(self.load()))
            tasks.append(asyncio.create_task(self.watch()))
            await asyncio.sleep(self.args.settle_s)
            kills = [await self.kill_leader(k) for k in range(self.args.kills)]
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for service in [*self.replicas, *self.others]:
                service.stop()
            await delete_topics(self.args.bootstrap, [s.name for s in specs])
        return {
            "service": self.args.service,
            "session_timeout_ms": self.args.session_timeout_ms,
            "lock_session_timeout_ms": self.args.lock_session_timeout_ms,
            "kills": kills,
            **{
                f"median_{figure}": median([k[figure] for k in kills])
                for figure in ("acquired_s", "processing_s", "first_output_s")
            },
            "logs": str(self.logs),
        }

    def acquired(self, replica: Replica) -> bool:
        """Whether the run of ``replica`` now alive leads (it logged the lock since it last started)."""
        alive = replica.proc is not None and replica.proc.poll() is None
        return alive and count(replica, '"leadership acquired"') > replica.acquired_at_start

    async def until(self, done: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"not within {timeout_s} s: {what} (logs {self.logs})")
            await asyncio.sleep(0.05)

    async def kill_leader(self, k: int) -> dict[str, Any]:
        await self.until(lambda: any(self.acquired(s) for s in self.replicas), 60, "a replica leads")
        leader = next(s for s in self.replicas if self.acquired(s))
        standby = next(s for s in self.replicas if s is not leader)
        await self.until(standby.waits, 120, "the standby joined the lock's group")
        await asyncio.sleep(self.args.between_s)
        acquired, processing = count(standby, '"leadership acquired"'), count(standby, '"processor started"')
        at = now_ms()
        leader.kill9()
        self.note(f"kill -9 {leader.log_path.stem} (kill {k + 1})")
        figures: dict[str, float | None] = {"acquired_s": None, "processing_s": None, "first_output_s": None}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and None in figures.values():
            if figures["acquired_s"] is None and count(standby, '"leadership acquired"') > acquired:
                figures["acquired_s"] = (now_ms() - at) / 1000
            if figures["processing_s"] is None and count(standby, '"processor started"') > processing:
                figures["processing_s"] = (now_ms() - at) / 1000
            first = min((t for t in self.outputs if t > at), default=None)
            if figures["first_output_s"] is None and first is not None:
                figures["first_output_s"] = (first - at) / 1000
            if self.args.service in ("preemption", "node_health") and figures["processing_s"] is not None:
                break  # they write only when asked to: no output to wait for
            await asyncio.sleep(0.05)
        self.note(f"  {figures}")
        return {"killed": leader.log_path.stem, **figures}

    async def load(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.args.bootstrap, **client_options(), linger_ms=5)
        await producer.start()
        try:
            k = 0
            began = time.monotonic()
            while True:
                delay = began + k / self.args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                job = f"fo-{k:06d}"
                spec = {
                    "queue": "team" if k % 2 else "default",
                    "workers": 1,
                    "gpus_per_worker": 1 + k % 2,
                    "duration_hint_s": 1 + k % 2,
                }
                await producer.send(self.topics.requests, value=request_bytes(job, spec), key=job.encode())
                k += 1
        finally:
            await producer.stop()

    async def watch(self) -> None:
        source = SOURCES[self.args.service]
        t = self.topics
        consumer = AIOKafkaConsumer(
            t.events,
            t.allocations,
            t.health,
            bootstrap_servers=self.args.bootstrap,
            **client_options(),
            group_id=None,
            isolation_level="read_committed",
            auto_offset_reset="latest",
        )
        await consumer.start()
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=100, max_records=5000)
                for records in batch.values():
                    for record in records:
                        with contextlib.suppress(ValueError):
                            if json.loads(record.value or b"{}").get("source") == source:
                                self.outputs.append(record.timestamp)
        finally:
            await consumer.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m services.bench.failover",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bootstrap", default=os.environ.get("GANGLINE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--service", choices=LEADERS, default="placement")
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--rate", type=float, default=5.0, help="jobs per second")
    p.add_argument("--settle-s", type=float, default=8.0, help="load before the first kill")
    p.add_argument("--between-s", type=float, default=6.0, help="after the standby is ready, before a kill")
    p.add_argument("--restart-delay-s", type=float, default=1.0, help="the supervisor's delay")
    p.add_argument("--session-timeout-ms", type=int, default=None, help="unset: the services' default")
    p.add_argument("--lock-session-timeout-ms", type=int, default=None, help="unset: the services' default")
    args = p.parse_args(argv)
    summary = asyncio.run(Failover(args).run())
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
