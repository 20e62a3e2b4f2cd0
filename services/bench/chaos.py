"""``make chaos``: kill -9 every decision service under load, restart the broker, fail two nodes; then
check that nothing was lost or granted twice and that every decision replays identical.

Everything runs on loopback, on a broker of its own (``deploy/local/kafka.sh`` on a private port and
data dir: ``--port``, 19192 by default; never the shared one), for a bounded time:

1. the broker is formatted and started; the five decision services run as real processes, each as
   its own Kafka principal, under a supervisor that starts again whatever exits (after
   ``--restart-delay-s``, as ``make up``'s does); the simulated nodes of
   ``deploy/clusters/default.yaml`` run in this process (:class:`~services.agent.fake.FakeCluster`);
2. for ``--load-s`` seconds, jobs arrive at ``--rate`` per second (seeded): singles and gangs (some
   held inside a leaf), in an unlimited queue and a limited one, some preemptible, a few urgent;
3. meanwhile, at seeded random moments: each service is killed with SIGKILL ``--kills`` times, the
   broker is restarted once on the data it keeps (``kafka.sh restart``) and frozen once (SIGSTOP) for
   ``--pause-s`` (8 s: an outage shorter than node_health's 10 s silence, which must fail no node),
   one node goes silent and another reports XID 79 on a GPU;
4. the load stops and the run waits (``--drain-s``; on past it, up to twice that, while the jobs left
   keep finishing) until every job is finished or waits
   with a reason;
5. the log is read from the beginning (read_committed) and :func:`gangline.replay.invariants.check_log`
   counts what must be 0 (lost, duplicated grants, GPUs double-held, partial gangs, stuck jobs) and the
   recovery times; nodes declared failed that were not failed on purpose are counted too;
6. ``gangline replay --from kafka --verify --decider all`` runs over the same log.

Prints one JSON summary on the last line; exits 1 when an invariant is violated, a node failed that
should not have, or the replay differs. ``--short`` is the version the test suite runs.

``--kafka-nodes 3`` (``make chaos-brokers``) runs it on a replicated broker instead: three KRaft nodes
(``kafka.sh`` with ``GANGLINE_KAFKA_NODES=3``: topics with three replicas and min.insync.replicas=2), and
the broker fault is a ``kill -9`` of the node leading the most partitions of the public topics, which
stays dead for the rest of the run. On top of the invariants, every job request the load had
acknowledged (acks=all) must be in the log at the offset the broker acknowledged, and the services must
keep deciding after the kill (their first output after it: ``recovery``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from gangline.bus.admin import started_admin
from gangline.bus.security import client_options
from gangline.cluster_spec import load_cluster_spec
from gangline.events.types import NodeId
from gangline.replay.invariants import Fault, Kill, check_log
from gangline.replay.kafka import KafkaSource
from services.agent.fake import FakeCluster
from services.bench.wire import plain_event
from services.common.replay import SOURCES, decider_topics
from services.common.topics import TopicNames

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("admission", "quota", "placement", "preemption", "node_health")
CREDENTIALS = ROOT / "deploy" / "kafka" / "credentials.dev.yaml"
KAFKA_SH = ROOT / "deploy" / "local" / "kafka.sh"
QUEUES = """\
queues:
  - name: default
    unlimited: true
  - name: team
    quotas:
      H100-SXM5-80GB: {nominal: 24}
      GB200-186GB: {nominal: 8}
      L40S-48GB: {nominal: 8}
"""
"""An unlimited queue (admission → placement) and a limited one (quota queues and holds jobs)."""
NODE_HEALTH = {"GANGLINE_SILENCE_S": "10", "GANGLINE_CHECK_EVERY_S": "0.5"}
"""node_health's defaults: a node is failed after 10 s of silence, counted over the time the bus was heard
(the broker's restart, shorter or longer than the silence, is a pause of every node's heartbeats, which
counts toward no node: services/node_health/handlers.py)."""


PROGRESS_S = 30.0
"""Past ``--drain-s`` the drain goes on while fewer jobs are left unfinished within this long."""


def now_ms() -> int:
    return int(time.time() * 1000)


# -- the workload ----------------------------------------------------------------------------------


def job_spec(rng: random.Random, k: int) -> dict[str, Any]:
    """One job of the mix: mostly singles, some gangs, a few urgent; half in the limited queue; one in
    fifty a request admission must reject (no workers), which stays in the log the replay reads."""
    queue = "team" if k % 2 else "default"
    if k % 50 == 49:
        return {"queue": queue, "workers": 0, "gpus_per_worker": 1}
    roll = rng.random()
    spec: dict[str, Any]
    if roll < 0.6:
        spec = {"workers": 1, "gpus_per_worker": rng.choice([1, 1, 2, 4]), "priority": rng.choice([0, 0, 10])}
    elif roll < 0.9:
        spec = {
            "workers": rng.choice([2, 2, 4]),
            "gpus_per_worker": rng.choice([1, 2, 4]),
            "gpu_type": "H100-SXM5-80GB",
            "topology": {"level": "leaf", "mode": "required"},
        }
    elif roll < 0.97:
        spec = {"workers": 1, "gpus_per_worker": 8, "gpu_type": "H100-SXM5-80GB", "preemptible": True}
    else:
        spec = {"workers": 2, "gpus_per_worker": 8, "gpu_type": "H100-SXM5-80GB", "priority": 100}
    if rng.random() < 0.3:
        spec["preemptible"] = True
        spec["checkpoint_grace_s"] = 5
    return {"queue": queue, "duration_hint_s": rng.choice([1, 2, 3, 4]), **spec}


def request_bytes(job_id: str, spec: Mapping[str, Any]) -> bytes:
    """A job.requested envelope as any producer writes it (plain JSON)."""
    return plain_event("job.requested", job_id, spec, source="chaos/load")


# -- processes -------------------------------------------------------------------------------------


def password(principal: str) -> str:
    return str(yaml.safe_load(CREDENTIALS.read_text(encoding="utf-8"))[principal])


@dataclass
class Service:
    """One decision service as a supervised process: started again ``delay_s`` after it exits."""

    name: str
    env: dict[str, str]
    log_path: Path
    delay_s: float
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)
    """Exit statuses of the runs that ended (SIGKILL: -9)."""
    killed: bool = False

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{self.name}"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def ready_count(self) -> int:
        """How many runs logged that they process (each start restores, then logs it once)."""
        try:
            return self.log_path.read_text(errors="replace").count('"processor started"')
        except FileNotFoundError:
            return 0

    async def supervise(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            if self.proc is not None and self.proc.poll() is not None:
                self.exits.append(self.proc.returncode)
                self.proc = None
                await asyncio.sleep(self.delay_s)
                self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def kafka_sh(action: str, port: int, nodes: int = 1) -> str:
    """Run ``kafka.sh action`` for the broker (``nodes`` of them) on ``port``; its standard output."""
    env = {
        **os.environ,
        "GANGLINE_KAFKA_PORT": str(port),
        "GANGLINE_KAFKA_HEAP": "384m",
        "GANGLINE_KAFKA_NODES": str(nodes),
    }
    done = subprocess.run(
        [str(KAFKA_SH), action], cwd=ROOT, env=env, check=True, stdout=subprocess.PIPE, text=True
    )
    return done.stdout


def cluster_bootstrap(port: int, nodes: int) -> str:
    """Every node's client address (kafka.sh: node i listens on port + 2(i-1))."""
    return ",".join(f"127.0.0.1:{port + 2 * i}" for i in range(nodes))


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Plan:
    """When each fault happens, in seconds from the start of the load."""

    kills: list[tuple[float, str]]
    broker_at: float
    silent_at: float
    xid_at: float
    pause_at: float


def plan(rng: random.Random, load_s: float, kills: int, *, replicated: bool = False) -> Plan:
    """Seeded moments: the kills spread over the load, the broker restart and node faults in between.

    A replicated broker's node is killed late (70-80% of the load), after the silent node has been
    failed (10 s of silence after at most 30%), so that each fault's effects can be told apart.
    """
    window = (0.1 * load_s, 0.8 * load_s)
    moments = sorted((rng.uniform(*window), service) for service in SERVICES for _ in range(kills))
    broker = (0.7, 0.8) if replicated else (0.5, 0.65)
    return Plan(
        kills=moments,
        broker_at=rng.uniform(broker[0] * load_s, broker[1] * load_s),
        silent_at=rng.uniform(0.15 * load_s, 0.3 * load_s),
        xid_at=rng.uniform(0.35 * load_s, 0.45 * load_s),
        pause_at=rng.uniform(0.7 * load_s, 0.78 * load_s),
    )


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.bootstrap = cluster_bootstrap(args.port, args.kafka_nodes)
        self.topics = TopicNames()
        self.logs = Path(tempfile.mkdtemp(prefix="gangline-chaos-"))
        self.queues_file = self.logs / "queues.yaml"
        self.queues_file.write_text(QUEUES, encoding="utf-8")
        self.kills: list[Kill] = []
        self.faults: list[Fault] = []
        self.offered: list[str] = []
        self.broker_down_s: float | None = None
        """How long the broker restart kept the broker away (an outage node_health must ride out)."""
        self.broker_paused_s: float | None = None
        """How long the broker was frozen (an outage shorter than node_health's silence)."""
        self.broker_away = False
        """The broker is being restarted or is frozen now."""
        self.acked: dict[str, tuple[int, int]] = {}
        """Per job request the load sent, the (partition, offset) the broker acknowledged it at."""
        self.sent_ms: dict[str, int] = {}
        self.broker_killed_ms: int | None = None
        self.drained_s: float | None = None
        """How long the drain waited for the jobs left to finish."""
        self.broker_killed_node: int | None = None
        self.recovering: dict[str, asyncio.Task[None]] = {}
        """Per service, the timing of its recovery from the latest kill."""
        self.services = {
            name: Service(name, self.env(name), self.logs / f"{name}.log", args.restart_delay_s)
            for name in SERVICES
        }

    def env(self, principal: str) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("GANGLINE_")},
            "PYTHONPATH": f"{ROOT / 'libs'}:{ROOT}",
            "GANGLINE_KAFKA_BOOTSTRAP": self.bootstrap,
            "GANGLINE_KAFKA_USERNAME": principal,
            "GANGLINE_KAFKA_PASSWORD": password(principal),
            "GANGLINE_INSTANCE_ID": "chaos",
            "GANGLINE_QUEUES_FILE": str(self.queues_file),
            "GANGLINE_SESSION_TIMEOUT_MS": str(self.args.session_timeout_ms),
            "GANGLINE_LOG_LEVEL": "INFO",
            **NODE_HEALTH,
        }

    def note(self, what: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)

    async def run(self) -> dict[str, Any]:
        # This process's own clients (load, nodes, reader) are the broker's super user.
        os.environ.update(
            {
                "GANGLINE_KAFKA_BOOTSTRAP": self.bootstrap,
                "GANGLINE_KAFKA_USERNAME": "admin",
                "GANGLINE_KAFKA_PASSWORD": password("admin"),
            }
        )
        for key in (
            "GANGLINE_KAFKA_PASSWORD_FILE",
            "GANGLINE_KAFKA_SECURITY_PROTOCOL",
            "GANGLINE_TOPIC_PREFIX",
        ):
            os.environ.pop(key, None)
        nodes = self.args.kafka_nodes
        self.note(f"broker on {self.bootstrap} ({nodes} node(s), own data dir), logs in {self.logs}")
        # A fresh log: nothing of an earlier run (down reads the size an earlier up recorded).
        await asyncio.to_thread(kafka_sh, "down", self.args.port, nodes)
        try:
            await asyncio.to_thread(kafka_sh, "up", self.args.port, nodes)
            replication = await self.replication() if nodes > 1 else None
            summary = await self.under_chaos()
            if replication is not None:
                summary["replication"] = replication
            if nodes > 1:
                summary |= await self.acknowledged_are_readable()
            summary["replay"] = await asyncio.to_thread(self.replay)
        finally:
            if not self.args.keep:
                await asyncio.to_thread(kafka_sh, "down", self.args.port, nodes)
        summary["service_exits"] = {name: s.exits for name, s in self.services.items()}
        summary["logs"] = str(self.logs)
        return summary

    async def under_chaos(self) -> dict[str, Any]:
        """The services and nodes under load and faults, then drained; the checker's figures."""
        cluster = FakeCluster(
            spec=load_cluster_spec(ROOT / "deploy" / "clusters" / "default.yaml"),
            bootstrap=self.bootstrap,
            topics=self.topics,
            group_id="gangline.chaos-nodes",
            time_scale=self.args.time_scale,
            heartbeat_s=0.5,
        )
        tasks: list[asyncio.Task[Any]] = []
        try:
            nodes = asyncio.create_task(cluster.run(), name="fake-nodes")
            tasks.append(nodes)
            await asyncio.wait_for(cluster.ready.wait(), 60)
            for service in self.services.values():
                service.start()
                tasks.append(asyncio.create_task(service.supervise(), name=f"supervise-{service.name}"))
            await self.until_ready(timeout_s=90)
            self.note("every service processes; load starts")
            began = time.monotonic()
            faults = asyncio.create_task(
                self.faults_of(
                    plan(self.rng, self.args.load_s, self.args.kills, replicated=self.args.kafka_nodes > 1),
                    cluster,
                    began,
                )
            )
            tasks.append(faults)
            await self.load(began)
            await faults
            await asyncio.gather(*self.recovering.values())
            self.note("load over; draining")
            summary = await self.drain()
            if nodes.done():
                raise RuntimeError("the simulated nodes stopped") from nodes.exception()
        finally:
            tasks += self.recovering.values()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for service in self.services.values():
                service.stop()
        return summary

    async def until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(s.ready_count() >= 1 for s in self.services.values()):
            if time.monotonic() > deadline:
                late = [n for n, s in self.services.items() if s.ready_count() < 1]
                raise RuntimeError(f"services not processing within {timeout_s} s: {late} (logs {self.logs})")
            await asyncio.sleep(0.2)

    async def load(self, began: float) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, **client_options(), enable_idempotence=True, linger_ms=5
        )
        await producer.start()
        try:
            count = int(self.args.load_s * self.args.rate)
            for k in range(count):
                delay = began + k / self.args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                job = f"chaos-{k:05d}"
                value = request_bytes(job, job_spec(self.rng, k))
                while True:
                    try:
                        sent = await (
                            await producer.send(self.topics.requests, value=value, key=job.encode())
                        )
                        self.acked[job] = (sent.partition, sent.offset)
                        self.sent_ms[job] = now_ms()
                        break
                    except KafkaError as e:  # the broker restarting: the same record again (same id)
                        self.note(f"request {job} not sent ({e!r}); again")
                        await asyncio.sleep(0.5)
                self.offered.append(job)
        finally:
            await producer.stop()

    async def faults_of(self, plan: Plan, cluster: FakeCluster, began: float) -> None:
        moments: list[tuple[float, str]] = [(t, s) for t, s in plan.kills]
        moments += [(plan.broker_at, "broker"), (plan.silent_at, "silent"), (plan.xid_at, "xid")]
        if self.args.kafka_nodes == 1:  # a replicated cluster loses a node instead (kill_broker)
            moments += [(plan.pause_at, "broker-pause")]
        for at, what in sorted(moments):
            delay = began + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if what in self.services:
                await self.kill(what)
            elif what == "broker" and self.args.kafka_nodes > 1:
                await self.kill_broker()
            elif what == "broker":
                await self.restart_broker()
            elif what == "broker-pause":
                await self.pause_broker()
            else:
                node = self.victim(cluster)
                if what == "silent":
                    self.faults.append(Fault(node, what, now_ms()))
                    self.note(f"node {node} goes silent")
                    await cluster.fail_node(NodeId(node))
                else:
                    gpu = cluster.nodes[NodeId(node)].gpus[0].id
                    self.faults.append(Fault(node, what, now_ms(), gpu=gpu))
                    self.note(f"node {node} reports XID 79 on {gpu}")
                    await cluster.report_xid(NodeId(node), 79)

    def victim(self, cluster: FakeCluster) -> str:
        """A node not failed yet, one running a gang if any does (seeded among equals)."""
        spared = {f.node for f in self.faults}
        busy: dict[str, int] = {}
        for granted in cluster.running_allocations():
            for p in granted.placements:
                busy[p.node] = max(busy.get(p.node, 0), len(granted.placements))
        nodes = sorted(n for n in cluster.nodes if n not in spared)
        best = max((busy.get(n, 0) for n in nodes), default=0)
        return self.rng.choice([n for n in nodes if busy.get(n, 0) == best])

    async def kill(self, name: str) -> None:
        """SIGKILL ``name`` once it processes again after its last kill; its recovery is timed meanwhile."""
        service = self.services[name]
        previous = self.recovering.get(name)
        if previous is not None:
            await previous
        for _ in range(300):  # between runs (it exited: the supervisor starts it again), 60 s at most
            if service.proc is not None:
                break
            await asyncio.sleep(0.2)
        if service.proc is None:
            self.note(f"{name} did not run again within 60 s; not killed")
            return
        ready = service.ready_count()
        at = now_ms()
        service.kill9()
        self.note(f"kill -9 {name}")

        async def recovered() -> None:
            self.kills.append(Kill(name, at, (SOURCES[name],), await self.ready_after(service, ready)))

        self.recovering[name] = asyncio.create_task(recovered())

    async def ready_after(self, service: Service, ready: int, timeout_s: float = 60) -> int | None:
        """When ``service`` logged that a run after this moment processes (None: not within the bound,
        which does not run while the broker is away: nothing can get ready then)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.broker_away:
                deadline = max(deadline, time.monotonic() + timeout_s)
            if service.ready_count() > ready:
                return now_ms()
            await asyncio.sleep(0.1)
        return None

    async def restart_broker(self) -> None:
        at = now_ms()
        self.note("broker restart (kafka.sh restart: its data kept)")
        # Down for as long as the restart takes (a JVM's start: seconds, or minutes on a busy machine), an
        # outage no node's silence may count (services/node_health/handlers.py).
        self.broker_away = True
        try:
            await asyncio.to_thread(kafka_sh, "restart", self.args.port)
        finally:
            self.broker_away = False
        back = now_ms()
        self.broker_down_s = (back - at) / 1000
        self.note(f"broker back after {self.broker_down_s:.1f} s")
        self.kills.append(Kill("broker", at, (), back))

    async def pause_broker(self) -> None:
        """The broker frozen (SIGSTOP) for ``--pause-s``, then let go: an outage shorter than node_health's
        silence, whatever the machine's speed (a restart's length depends on how fast the JVM starts)."""
        pid = int((ROOT / ".cache" / "kafka" / str(self.args.port) / "kafka.pid").read_text().strip())
        at = now_ms()
        self.note(f"broker paused for {self.args.pause_s:g} s (SIGSTOP)")
        self.broker_away = True
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(self.args.pause_s)
        finally:
            os.kill(pid, signal.SIGCONT)
            self.broker_away = False
        back = now_ms()
        self.broker_paused_s = (back - at) / 1000
        self.kills.append(Kill("broker-pause", at, (), back))

    async def kill_broker(self) -> None:
        """kill -9 the node leading the most partitions of the public topics; it stays dead. Ready again
        when every partition of them has a leader among the others."""
        admin = await started_admin(self.bootstrap, 10_000)
        try:
            topics = await admin.describe_topics(decider_topics(""))
            leaders = [p["leader"] for t in topics for p in t["partitions"]]
            victim = max(sorted(set(leaders)), key=leaders.count)
            pids = dict(
                line.split() for line in kafka_sh("pids", self.args.port, self.args.kafka_nodes).splitlines()
            )
            at = now_ms()
            os.kill(int(pids[str(victim)]), signal.SIGKILL)
            self.broker_killed_ms, self.broker_killed_node = at, victim
            self.note(
                f"kill -9 broker node {victim} (leads {leaders.count(victim)} of {len(leaders)} partitions)"
            )
            ready: int | None = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(KafkaError):
                    topics = await admin.describe_topics(decider_topics(""))
                    if all(p["leader"] not in (-1, victim) for t in topics for p in t["partitions"]):
                        ready = now_ms()
                        break
                await asyncio.sleep(0.2)
            self.note(f"every partition led again after {((ready or now_ms()) - at) / 1000:.1f} s")
            self.kills.append(Kill("broker", at, (), ready))
        finally:
            await admin.close()

    async def replication(self) -> dict[str, list[Any]]:
        """The replica counts and min.insync.replicas the public topics were made with (distinct values)."""
        names = decider_topics("")
        admin = await started_admin(self.bootstrap, 10_000)
        try:
            topics = await admin.describe_topics(names)
            resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
            configs = [
                entry["config_value"]
                for response in await admin.describe_configs(resources)
                for resource in response.to_object()["resources"]
                for entry in resource["config_entries"]
                if entry["config_names"] == "min.insync.replicas"
            ]
        finally:
            await admin.close()
        return {
            "replicas": sorted({len(p["replicas"]) for t in topics for p in t["partitions"]}),
            "min_insync_replicas": sorted(set(configs)),
        }

    async def acknowledged_are_readable(self) -> dict[str, Any]:
        """Every request the broker acknowledged is in jobs.requests where it said (read_committed)."""
        records = await KafkaSource(self.bootstrap).fetch([self.topics.requests])
        at = {(r.partition, r.offset): r.key for r in records}
        missing = sorted(job for job, where in self.acked.items() if at.get(where) != job)
        after = [
            job for job in self.offered if self.sent_ms.get(job, 0) > (self.broker_killed_ms or now_ms())
        ]
        return {
            "broker_killed_node": self.broker_killed_node,
            "acknowledged": len(self.acked),
            "acknowledged_missing": len(missing),
            "acknowledged_missing_first": missing[:5],
            "offered_after_broker_kill": len(after),
        }

    async def drain(self) -> dict[str, Any]:
        """Wait until the log holds no violation: ``--drain-s``, and on past it for as long as the jobs left
        keep moving (fewer of them unfinished within ``PROGRESS_S``; a starved machine drains slowly, a
        stuck job never moves), at most ``--drain-s`` more."""
        started = time.monotonic()
        deadline, cap = started + self.args.drain_s, started + 2 * self.args.drain_s
        left, moved = None, started
        while True:
            records = await KafkaSource(self.bootstrap).fetch(decider_topics(""))
            kills = sorted(self.kills, key=lambda k: k.at_ms)
            summary = check_log(records, kills=kills, faults=self.faults)
            now = time.monotonic()
            unfinished = len(summary.problems) + summary.waiting
            if left is None or unfinished < left:
                left, moved = unfinished, now
            if summary.ok or now > cap or (now > deadline and now - moved > PROGRESS_S):
                break
            await asyncio.sleep(2)
        self.drained_s = round(time.monotonic() - started, 1)
        figures = summary.to_json()
        failed = sorted(
            {
                str(r.envelope.get("data", {}).get("node"))
                for r in records
                if r.type == "gangline.node.failed.v1"
            }
        )
        meant = {f.node for f in self.faults if f.kind == "silent"}
        figures["nodes_failed"] = failed
        figures["nodes_failed_unexpectedly"] = len(set(failed) - meant)
        figures["offered_by_load"] = len(self.offered)
        figures["broker_down_s"] = self.broker_down_s
        figures["broker_paused_s"] = self.broker_paused_s
        figures["silence_s"] = float(NODE_HEALTH["GANGLINE_SILENCE_S"])
        figures["drained_s"] = self.drained_s
        return figures

    def replay(self) -> dict[str, Any]:
        """``gangline replay --from kafka --verify --decider all`` over the run's log, as a user runs it."""
        env = {**self.env("admin"), "GANGLINE_LOG_LEVEL": "WARNING"}
        command = [
            sys.executable,
            "-m",
            "services.tools.cli",
            "replay",
            "--from",
            "kafka",
            "--bootstrap",
            self.bootstrap,
            "--verify",
            "--decider",
            "all",
            "--max-problems",
            "10",
        ]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        out = done.stdout + done.stderr
        (self.logs / "replay.txt").write_text(out, encoding="utf-8")
        found = re.search(r"all services: .*?(\d+) outputs compared: (identical|(\d+) difference)", out)
        chain = re.search(r"hash chain: .*: (OK|\d+ problem)", out)
        return {
            "status": done.returncode,
            "outputs_compared": int(found.group(1)) if found else None,
            "differences": (0 if found.group(2) == "identical" else int(found.group(3))) if found else None,
            "chain": chain.group(1) if chain else None,
            "first": [line.strip() for line in out.splitlines() if "difference:" in line][:3],
        }


def verdict(summary: Mapping[str, Any]) -> bool:
    replay = summary.get("replay", {})
    replicated = "acknowledged" not in summary or (
        summary["acknowledged_missing"] == 0
        and summary["offered_after_broker_kill"] > 0
        and all(
            r["first_output_s"] is not None for r in summary.get("recovery", []) if r["killed"] == "broker"
        )
    )
    return bool(
        summary.get("ok")
        and summary.get("nodes_failed_unexpectedly") == 0
        and replay.get("status") == 0
        and replay.get("differences") == 0
        and replicated
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="make chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--port", type=int, default=int(os.environ.get("GANGLINE_CHAOS_KAFKA_PORT", "19192")))
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--load-s", type=float, default=150.0, help="how long jobs arrive")
    p.add_argument("--rate", type=float, default=3.0, help="jobs per second")
    p.add_argument("--kills", type=int, default=3, help="kill -9 of each service")
    p.add_argument("--drain-s", type=float, default=150.0, help="at most this long for the jobs to finish")
    p.add_argument("--time-scale", type=float, default=1.0, help="real seconds per second of a job's hint")
    p.add_argument("--restart-delay-s", type=float, default=1.0, help="the supervisor's delay")
    p.add_argument("--session-timeout-ms", type=int, default=4000)
    p.add_argument(
        "--pause-s", type=float, default=8.0, help="the broker frozen this long: shorter than the silence"
    )
    p.add_argument("--short", action="store_true", help="the suite's version: 30 s of load, 1 kill each")
    p.add_argument("--keep", action="store_true", help="leave the broker and its data for inspection")
    p.add_argument(
        "--kafka-nodes",
        type=int,
        default=1,
        help="a replicated broker of this many KRaft nodes (on --port, --port+2, ...); one is killed -9",
    )
    args = p.parse_args(argv)
    if args.short:
        args.load_s, args.kills, args.drain_s = 30.0, min(args.kills, 1), 90.0
    if args.port <= 9093 < args.port + 2 * args.kafka_nodes:
        p.error("chaos kills its broker: give it one of its own (--port), never the shared 9092")
    summary = asyncio.run(Chaos(args).run())
    summary["passed"] = verdict(summary)
    print(json.dumps(summary))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
