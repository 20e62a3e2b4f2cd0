"""``make bench-e2e``: request-to-grant throughput and latency through Kafka, everything running.

Starts the five decision services as real processes and 1,000 simulated 8-GPU nodes (one process,
niced: they stand for other machines) on a private set of topics, then

1. publishes ``--burst`` one-GPU jobs as fast as a plain aiokafka producer can and measures the
   sustained rate from the first request to the last grant;
2. once the cluster has settled (every burst job released, every service's consumer group caught
   up with the log, then ``--settle-s`` seconds of quiet), publishes jobs at a fixed ``--offered``
   rate for ``--offered-s`` seconds and measures each job's latency from its request's Kafka
   timestamp to its grant's, in total and per stage (admitted, queued, granted), with the CPU each
   process and the whole machine used meanwhile (the services share the machine's cores);
3. restarts placement on the history just written and reports how long the restore took.

Prints the figures and ends with one JSON line: jobs_per_s, p50_ms, p99_ms, offered_per_s (and more).
How busy the machine was before the bench started and while the cluster stood idle says how much
other work skewed the figures. ``GANGLINE_BENCH_GCTRACE`` / ``GANGLINE_BENCH_PROFILE`` (see
:func:`start`) time garbage collections or profile chosen processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from gangline.bus.admin import delete_topics, ensure_topics
from gangline.bus.security import client_options
from gangline.cluster_spec import uniform_cluster
from services.bench.wire import plain_event
from services.common.topics import TopicNames

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("admission", "quota", "placement", "preemption", "node_health")


def request(job_id: str, duration_s: int, queue: str = "default") -> bytes:
    data = {"queue": queue, "workers": 1, "gpus_per_worker": 1, "duration_hint_s": duration_s}
    return plain_event("job.requested", job_id, data, source="bench")


METERED = "metered"


def write_queues(folder: Path, nodes: int) -> Path:
    """The bench's queues file: ``default`` unlimited, ``metered`` with a quota of the whole cluster."""
    path = folder / "queues.yaml"
    path.write_text(
        "queues:\n"
        "  - name: default\n"
        "    unlimited: true\n"
        f"  - name: {METERED}\n"
        f"    quotas: {{H100-SXM5-80GB: {{nominal: {nodes * 8}}}}}\n",
        encoding="utf-8",
    )
    return path


STAGES = (b"job.admitted", b"job.queued")
"""The job.events types whose Kafka timestamps split request->grant into stages."""


class Grants:
    """Reads allocations.log (grant timestamps by job id) and jobs.events (admitted, queued: per stage)."""

    def __init__(self, bootstrap: str, topic: str, events_topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            topic,
            events_topic,
            bootstrap_servers=bootstrap,
            **client_options(),
            group_id=None,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        self.at: dict[str, int] = {}
        self.released: set[str] = set()
        self.node_failed = 0
        """Releases because a node failed: on simulated nodes, heartbeats that came too late."""
        self.stage_at: dict[bytes, dict[str, int]] = {stage: {} for stage in STAGES}

    async def poll(self) -> None:
        batch = await self.consumer.getmany(timeout_ms=100, max_records=10_000)
        for records in batch.values():
            for r in records:
                value = r.value or b""
                # Records are keyed by job id (the envelope's subject): no decoding, so the bench takes
                # less of the CPU the services it measures share.
                if b'"type":"gangline.allocation.granted.' in value:
                    self.at.setdefault((r.key or b"").decode(), r.timestamp)
                    continue
                if b'"type":"gangline.allocation.released.' in value:
                    self.released.add((r.key or b"").decode())
                    if b'"reason":"node_failed"' in value:
                        self.node_failed += 1  # node_health failed the node (silent past --silence-s)
                    continue
                for stage in STAGES:
                    if b'"type":"gangline.' + stage in value:
                        self.stage_at[stage].setdefault((r.key or b"").decode(), r.timestamp)

    async def wait_for_releases(self, jobs: list[str], timeout_s: float) -> int:
        """Read until every job in ``jobs`` was released (or ``timeout_s`` passed); how many were."""
        deadline = time.monotonic() + timeout_s
        left = [j for j in jobs if j not in self.released]
        while left and time.monotonic() < deadline:
            await self.poll()
            left = [j for j in left if j not in self.released]
        return len(jobs) - len(left)

    async def wait_for_stages(self, jobs: dict[str, int], timeout_s: float, *, metered: bool) -> None:
        """Read jobs.events on until every job's admitted (and, ``metered``, queued) were seen (it may
        lag the grants)."""
        stages = STAGES if metered else STAGES[:1]
        deadline = time.monotonic() + timeout_s
        left = [j for j in jobs if not all(j in self.stage_at[stage] for stage in stages)]
        while left and time.monotonic() < deadline:
            await self.poll()
            left = [j for j in left if not all(j in self.stage_at[stage] for stage in stages)]

    async def wait_for(self, jobs: dict[str, int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(j in self.at for j in jobs):
            if time.monotonic() > deadline:
                missing = sum(1 for j in jobs if j not in self.at)
                raise SystemExit(f"{missing} of {len(jobs)} jobs got no grant within {timeout_s} s")
            await self.poll()


async def publish(
    producer: AIOKafkaProducer,
    topic: str,
    jobs: list[str],
    rate: float | None,
    duration_s: int,
    queue: str = "default",
) -> dict[str, int]:
    """Send the jobs (at ``rate`` per second, or as fast as possible); request timestamps by job id."""
    sent: dict[str, int] = {}
    futures = []
    started = time.monotonic()
    for k, job in enumerate(jobs):
        if rate is not None:
            delay = started + k / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        value = request(job, duration_s, queue)
        futures.append((job, await producer.send(topic, value=value, key=job.encode())))
    for job, future in futures:
        sent[job] = (await future).timestamp
    return sent


def stage_figures(grants: Grants, sent: dict[str, int], *, metered: bool) -> str:
    """p50/p99 of request->admitted, admitted->queued, queued->granted (jobs seen at every stage); for
    the unlimited queue, whose jobs quota does not queue, request->admitted and admitted->granted."""
    admitted, queued = grants.stage_at[b"job.admitted"], grants.stage_at[b"job.queued"]
    seen = [j for j in sent if j in admitted and (j in queued or not metered) and j in grants.at]
    if not seen:
        return "n/a"
    stages = {"request->admitted": [float(admitted[j] - sent[j]) for j in seen]}
    if metered:
        stages["admitted->queued"] = [float(queued[j] - admitted[j]) for j in seen]
        stages["queued->granted"] = [float(grants.at[j] - queued[j]) for j in seen]
    else:
        stages["admitted->granted"] = [float(grants.at[j] - admitted[j]) for j in seen]
    return ", ".join(f"{k} {percentile(v, 0.5):.0f}/{percentile(v, 0.99):.0f}" for k, v in stages.items())


async def backlog(
    admin: AIOKafkaAdminClient, consumer: AIOKafkaConsumer, groups: list[str], topics: dict[str, int]
) -> dict[str, int]:
    """Records each consumer group has yet to process on ``topics`` (name: partitions), per group.

    Only partitions a group has committed offsets on count (those are the ones it reads). A
    transaction's commit marker takes an offset no consumer commits past, so one record per
    partition is not counted: a group is caught up at (end - committed) <= 1 everywhere.
    """
    partitions = [TopicPartition(topic, p) for topic, count in topics.items() for p in range(count)]
    ends = await consumer.end_offsets(partitions)
    behind: dict[str, int] = {}
    for group in groups:
        committed = await admin.list_consumer_group_offsets(group, partitions=partitions)
        behind[group] = sum(
            max(0, ends[tp] - meta.offset - 1) for tp, meta in committed.items() if meta.offset >= 0
        )
    return behind


async def wait_until_caught_up(
    bootstrap: str, consumer: AIOKafkaConsumer, groups: list[str], topics: dict[str, int], timeout_s: float
) -> dict[str, int]:
    """Poll the groups' backlogs until all are zero (or ``timeout_s``); the last backlogs seen."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options())
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            behind = await backlog(admin, consumer, groups, topics)
            if not any(behind.values()) or time.monotonic() > deadline:
                return behind
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


HISTORY_READERS = ("quota", "placement", "preemption", "node_health")
"""The services that read the topics ``--history`` writes (jobs.events, allocations.log)."""


def fake_nodes_group(env: dict[str, str], args: argparse.Namespace) -> str:
    """The simulated nodes' consumer group (services.agent.main), for the uniform cluster of ``--nodes``."""
    return f"{env['GANGLINE_GROUP_PREFIX']}.fake-nodes.{uniform_cluster(args.nodes).name}"


async def commit_at_end(bootstrap: str, groups: list[str], topics: dict[str, int]) -> None:
    """Commit each of ``groups``' offsets at the end of every partition of ``topics`` (name: count)."""
    partitions = [TopicPartition(topic, p) for topic, count in topics.items() for p in range(count)]
    for group in groups:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, **client_options(), group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            consumer.assign(partitions)
            ends = await consumer.end_offsets(partitions)
            await consumer.commit({tp: offset for tp, offset in ends.items() if offset > 0})
        finally:
            await consumer.stop()


def gc_summaries(logs: Path) -> list[str]:
    """One line per process whose garbage collections were timed (services.bench.gctrace)."""
    lines = []
    for traced in sorted(logs.glob("*.gc.json")):
        report = json.loads(traced.read_text())
        lines.append(
            f"GC {traced.name.removesuffix('.gc.json')}: collections per generation {report['count']}, "
            f"total ms {report['total_ms']} (CPU {report.get('cpu_ms')}), longest ms {report['max_ms']}, "
            f"{len(report['long'])} pauses >= 20 ms"
        )
    return lines


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (Linux /proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float | None:
    """The most resident memory a process has had so far, in MiB (Linux /proc VmHWM); None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return round(int(found.group(1)) / 1024, 1) if found else None


def admin_credentials() -> None:
    """The dev broker's super user, unless the environment names a principal (as the test fixtures do)."""
    if (
        os.environ.get("GANGLINE_KAFKA_USERNAME")
        or os.environ.get("GANGLINE_KAFKA_SECURITY_PROTOCOL") == "PLAINTEXT"
    ):
        return
    credentials = yaml.safe_load(
        (ROOT / "deploy" / "kafka" / "credentials.dev.yaml").read_text(encoding="utf-8")
    )
    os.environ["GANGLINE_KAFKA_USERNAME"] = "admin"
    os.environ["GANGLINE_KAFKA_PASSWORD"] = str(credentials["admin"])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start(
    module: str, args: list[str], env: dict[str, str], logs: Path, name: str, run: str = ""
) -> subprocess.Popen[bytes]:
    # GANGLINE_BENCH_PROFILE=placement,quota runs those under cProfile (<logs>/<name><run>.prof on exit);
    # GANGLINE_BENCH_GCTRACE=placement,quota times their garbage collections (<logs>/<name><run>.gc.json).
    profiled = name in os.environ.get("GANGLINE_BENCH_PROFILE", "").split(",")
    profiler = ["-m", "cProfile", "-o", str(logs / f"{name}{run}.prof")] if profiled else []
    command = [*profiler, "-m", module, *args]
    if name in os.environ.get("GANGLINE_BENCH_GCTRACE", "").split(","):
        gctrace = ["-m", "services.bench.gctrace", str(logs / f"{name}{run}.gc.json")]
        command = [*profiler, *gctrace, module, *args]
    return subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
        stdout=(logs / f"{name}.log").open("ab"),
        stderr=subprocess.STDOUT,
    )


async def bench(args: argparse.Namespace) -> dict[str, float]:
    bootstrap = args.bootstrap
    topics = TopicNames(prefix=f"bench-{uuid.uuid4().hex[:8]}.")
    await ensure_topics(bootstrap, topics.specs())
    logs = Path(tempfile.mkdtemp(prefix="gangline-bench-"))
    env = {
        **os.environ,
        "GANGLINE_KAFKA_BOOTSTRAP": bootstrap,
        "GANGLINE_TOPIC_PREFIX": topics.prefix,
        "GANGLINE_GROUP_PREFIX": f"g-{topics.prefix.rstrip('.')}",
        "GANGLINE_INSTANCE_ID": "bench",
        "GANGLINE_SILENCE_S": str(args.silence_s),
        "GANGLINE_LOG_LEVEL": "WARNING",
        "GANGLINE_QUEUES_FILE": str(write_queues(logs, args.nodes)),
    }
    metered = args.queue == METERED
    procs: dict[str, subprocess.Popen[bytes]] = {}
    figures: dict[str, float] = {}
    # The bench shares the machine: what else keeps its cores busy skews every figure below.
    quiet_before = machine_busy_s()
    await asyncio.sleep(2)
    quiet_busy_s, quiet_all_s = (a - b for a, b in zip(machine_busy_s(), quiet_before, strict=True))
    figures["background_busy"] = round(quiet_busy_s / max(quiet_all_s, 1e-9), 2)
    print(
        f"before starting: the machine's cores were {figures['background_busy']:.0%} busy; "
        f"{args.nodes} simulated nodes will run at nice {args.nodes_nice}; jobs go to queue {args.queue}",
        flush=True,
    )
    try:
        if args.history > 0:
            began = time.monotonic()
            # services.bench.restart's generated history, on the simulated cluster's nodes.
            from services.bench.restart import write_history

            node_names = [r.node for r in uniform_cluster(args.nodes).registrations()]
            records = await write_history(bootstrap, topics, args.history, node_names, live=args.live)
            figures["history_write_s"] = round(time.monotonic() - began, 1)
            # As a cluster that ran it: the readers of the history's topics are past it (their restore folds
            # it; their processors and the simulated nodes go on after it instead of reading it all again).
            readers = [
                *(f"{env['GANGLINE_GROUP_PREFIX']}.{s}" for s in HISTORY_READERS),
                fake_nodes_group(env, args),
            ]
            await commit_at_end(
                bootstrap,
                readers,
                {
                    spec.name: spec.partitions
                    for spec in topics.specs()
                    if spec.name in (topics.events, topics.allocations)
                },
            )
            print(
                f"history: {args.history} jobs ({args.history - args.live} finished, {args.live} still "
                f"holding a GPU; {records} records) written in {figures['history_write_s']} s; every "
                "service restores them at start, its consumer group committed past them",
                flush=True,
            )
        procs["fake-nodes"] = start(
            "services.agent",
            ["--nodes", str(args.nodes), "--heartbeat-s", str(args.heartbeat_s)],
            env,
            logs,
            "fake-nodes",
        )
        # The simulated nodes stand for a thousand other machines: on these shared cores they yield to
        # the services measured (a node's own work, running jobs and acknowledging them, stays on time).
        os.setpriority(os.PRIO_PROCESS, procs["fake-nodes"].pid, args.nodes_nice)
        await asyncio.sleep(4)
        for s in SERVICES:
            procs[s] = start(f"services.{s}", [], {**env, "GANGLINE_LOG_LEVEL": "INFO"}, logs, s)
        grants = Grants(bootstrap, topics.allocations, topics.events)
        await grants.consumer.start()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_options(), linger_ms=5)
        await producer.start()
        try:
            # Warm-up: the services are up and the cluster registered when a grant comes back.
            warm = await publish(
                producer, topics.requests, [f"warm-{k}" for k in range(20)], None, args.job_s
            )
            await grants.wait_for(warm, timeout_s=args.start_s)

            jobs = [f"burst-{k:06d}" for k in range(args.burst)]
            burst_cpu_before = {name: cpu_seconds(proc.pid) for name, proc in procs.items()}
            sent = await publish(producer, topics.requests, jobs, None, args.job_s, args.queue)
            await grants.wait_for(sent, timeout_s=300)
            first = min(sent.values())
            last = max(grants.at[j] for j in jobs)
            figures["jobs_per_s"] = round(args.burst / max(1e-3, (last - first) / 1000), 1)
            burst_lat = [float(grants.at[j] - sent[j]) for j in jobs]
            figures["burst_p50_ms"] = percentile(burst_lat, 0.50)
            figures["burst_p99_ms"] = percentile(burst_lat, 0.99)
            print(
                f"burst: {args.burst} jobs, request->grant sustained {figures['jobs_per_s']} jobs/s "
                f"(p50 {figures['burst_p50_ms']} ms, p99 {figures['burst_p99_ms']} ms)",
                flush=True,
            )

            # The burst's jobs end (started, completed, released: thousands of events) about --job-s
            # after their grants; the fixed-load phase measures the steady state after that.
            if args.settle_s > 0:
                # Settled: every burst job released, every service caught up with the log, then a pause.
                began = time.monotonic()
                released = await grants.wait_for_releases(jobs, timeout_s=args.job_s + 60)
                figures["burst_released"] = released
                figures["release_wait_s"] = round(time.monotonic() - began, 1)
                groups = [f"{env['GANGLINE_GROUP_PREFIX']}.{s}" for s in SERVICES]
                behind = await wait_until_caught_up(
                    bootstrap,
                    grants.consumer,
                    groups,
                    {
                        spec.name: spec.partitions
                        for spec in topics.specs()
                        if spec.name in (topics.requests, topics.events, topics.allocations)
                    },
                    timeout_s=60,
                )
                figures["catch_up_s"] = round(time.monotonic() - began - figures["release_wait_s"], 1)
                # What the burst cost, from its first request until its last job was released and every
                # service caught up: CPU seconds, not wall-clock, so other work on the machine skews it less.
                burst_cpu = {
                    name: round(cpu_seconds(procs[name].pid) - before, 2)
                    for name, before in burst_cpu_before.items()
                }
                services_cpu = sum(burst_cpu[s] for s in SERVICES)
                figures["burst_cpu_ms_per_job"] = round(1000 * services_cpu / len(jobs), 3)
                print(
                    f"burst CPU seconds per process, until released and caught up: {burst_cpu}; the five "
                    f"services {figures['burst_cpu_ms_per_job']} ms per job",
                    flush=True,
                )
                idle_before = machine_busy_s()
                await asyncio.sleep(args.settle_s)
                idle_busy_s, idle_all_s = (a - b for a, b in zip(machine_busy_s(), idle_before, strict=True))
                figures["idle_machine_busy"] = round(idle_busy_s / max(idle_all_s, 1e-9), 2)
                figures["settle_s"] = round(time.monotonic() - began, 1)
                print(
                    f"settled in {figures['settle_s']} s: {released} of {len(jobs)} burst jobs released "
                    f"{figures['release_wait_s']} s after the last grant was read, services caught up "
                    f"{figures['catch_up_s']} s later, then {args.settle_s} s idle (no jobs; heartbeats "
                    f"kept the machine's cores {figures['idle_machine_busy']:.0%} busy)",
                    flush=True,
                )
                if released < len(jobs):
                    busy = len(jobs) - released
                    print(f"  {busy} burst jobs still hold GPUs: the cluster is not idle", flush=True)
                if any(behind.values()):
                    print(f"  services still behind the log (records): {behind}", flush=True)
            count = int(args.offered * args.offered_s)
            jobs = [f"steady-{k:06d}" for k in range(count)]
            cpu_before = {name: cpu_seconds(proc.pid) for name, proc in procs.items()}
            cpu_before["bench"] = cpu_seconds(os.getpid())
            busy_before = machine_busy_s()
            sent = await publish(producer, topics.requests, jobs, args.offered, args.job_s, args.queue)
            busy_after = machine_busy_s()
            cpu_steady = {
                name: round(cpu_seconds(proc.pid) - cpu_before[name], 1) for name, proc in procs.items()
            }
            cpu_steady["bench"] = round(cpu_seconds(os.getpid()) - cpu_before["bench"], 1)
            await grants.wait_for(sent, timeout_s=300)
            await grants.wait_for_stages(sent, timeout_s=10, metered=metered)
            latencies = [float(grants.at[j] - sent[j]) for j in jobs]
            figures["offered_per_s"] = args.offered
            figures["p50_ms"] = percentile(latencies, 0.50)
            figures["p99_ms"] = percentile(latencies, 0.99)
            figures["mean_ms"] = round(statistics.fmean(latencies), 1)
            print(
                f"offered {args.offered} jobs/s for {args.offered_s} s: p50 {figures['p50_ms']} ms, "
                f"p99 {figures['p99_ms']} ms, mean {figures['mean_ms']} ms",
                flush=True,
            )
            print(f"  per stage (p50/p99 ms): {stage_figures(grants, sent, metered=metered)}", flush=True)
            busy_s, all_s = (after - before for after, before in zip(busy_after, busy_before, strict=True))
            figures["steady_machine_busy"] = round(busy_s / max(all_s, 1e-9), 2)
            print(
                f"  while publishing: CPU seconds per process {cpu_steady} "
                f"({sum(cpu_steady.values()):.1f} in all); the machine's cores were "
                f"{figures['steady_machine_busy']:.0%} busy ({busy_s:.1f} CPU seconds, the broker and "
                "anything else running included)",
                flush=True,
            )
            # For looking at the tail: when each job was requested, admitted, queued and granted.
            admitted, queued = grants.stage_at[b"job.admitted"], grants.stage_at[b"job.queued"]
            (logs / "steady.csv").write_text(
                "job,requested_ms,admitted_ms,queued_ms,granted_ms\n"
                + "".join(
                    f"{j},{sent[j]},{admitted.get(j, '')},{queued.get(j, '')},{grants.at[j]}\n" for j in jobs
                )
            )
        finally:
            await producer.stop()
            await grants.consumer.stop()

        figures["released_node_failed"] = grants.node_failed
        if grants.node_failed:
            print(f"  {grants.node_failed} allocations released because their node failed", flush=True)
        cpu = {name: round(cpu_seconds(proc.pid), 1) for name, proc in procs.items()}
        print(f"CPU seconds used per process: {cpu}", flush=True)
        peaks = {name: peak_rss_mib(proc.pid) for name, proc in procs.items()}
        figures |= {f"peak_mib_{name}": mib for name, mib in peaks.items() if mib is not None}
        print(f"peak memory per process (VmHWM, MiB): {peaks}", flush=True)

        # Restart placement on the history just written (every job: requested, admitted, queued,
        # placed, granted, started, completed, released).
        history = args.history + args.burst + int(args.offered * args.offered_s) + 20
        procs["placement"].terminate()
        procs["placement"].wait(timeout=30)
        began = time.monotonic()
        procs["placement"] = start(
            "services.placement", [], {**env, "GANGLINE_LOG_LEVEL": "INFO"}, logs, "placement", "-restart"
        )
        restored = None
        while restored is None and time.monotonic() - began < 120:
            await asyncio.sleep(0.2)
            text = (logs / "placement.log").read_text()
            found = re.findall(r'"message": "processor started"', text)
            if len(found) >= 2:
                restored = time.monotonic() - began
        seconds = re.findall(
            r'"state restored from the log", "events": (\d+), "seconds": ([0-9.]+)',
            (logs / "placement.log").read_text(),
        )
        if seconds:
            events, took = seconds[-1]
            figures["restore_events"] = int(events)
            figures["restore_s"] = float(took)
        if restored is not None:
            figures["restart_to_ready_s"] = round(restored, 2)
        restarted_peak = peak_rss_mib(procs["placement"].pid)
        if restarted_peak is not None:
            figures["peak_mib_placement_restarted"] = restarted_peak
        print(
            f"placement restart with {history} jobs of history: state restored from "
            f"{figures.get('restore_events')} events in {figures.get('restore_s')} s; "
            f"process start to processing {figures.get('restart_to_ready_s')} s, peak memory "
            f"{restarted_peak} MiB",
            flush=True,
        )
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for line in gc_summaries(logs):
            print(line, flush=True)
        if args.keep_topics:
            print(f"topics kept under prefix {topics.prefix}", flush=True)
        else:
            await delete_topics(bootstrap, [s.name for s in topics.specs()])
        print(f"logs: {logs}", flush=True)
    return figures


def main() -> int:
    p = argparse.ArgumentParser(prog="make bench-e2e", description=__doc__)
    p.add_argument("--bootstrap", default=os.environ.get("GANGLINE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--burst", type=int, default=7000)
    p.add_argument("--heartbeat-s", type=float, default=5.0, help="each simulated node's heartbeat interval")
    p.add_argument(
        "--silence-s",
        type=float,
        default=60.0,
        help="how long node_health waits for a heartbeat before it fails the node (GANGLINE_SILENCE_S); "
        "many --nodes with a long --heartbeat-s on a busy machine need more, or nodes fail falsely",
    )
    p.add_argument(
        "--start-s",
        type=float,
        default=120.0,
        help="how long the services may take to restore and grant the first jobs (a long --history, many "
        "--nodes or a busy machine need more)",
    )
    p.add_argument(
        "--history",
        type=int,
        default=0,
        help="before the services start, write this many finished jobs (admitted, granted, completed, "
        "released) on the simulated nodes: the state every service restores and keeps",
    )
    p.add_argument(
        "--live",
        type=int,
        default=0,
        help="of the --history jobs, this many (the last) are granted and never end: one GPU each, live in "
        "every service's state next to the finished ones (at most --nodes x 8)",
    )
    p.add_argument("--offered", type=float, default=200.0)
    p.add_argument("--offered-s", type=float, default=15.0)
    p.add_argument(
        "--job-s", type=int, default=5, help="each job's duration hint (simulated nodes run it that long)"
    )
    p.add_argument(
        "--settle-s",
        type=float,
        default=3.0,
        help="after the burst's jobs are released, pause this long before the fixed-load phase (0: no pause)",
    )
    p.add_argument(
        "--nodes-nice",
        type=int,
        default=10,
        help="niceness of the simulated nodes' process (0: compete with the services for the CPU)",
    )
    p.add_argument(
        "--queue",
        choices=("default", METERED),
        default="default",
        help="the jobs' queue: default is unlimited (admission -> placement); metered has a quota as big as "
        "the cluster, so quota queues every job (admission -> quota -> placement)",
    )
    p.add_argument("--keep-topics", action="store_true", help="leave the topics for inspection")
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run the whole bench this many times (fresh topics and processes each time); the last line "
        "then gives the median of each figure and every run's figures under 'runs'",
    )
    args = p.parse_args()
    if not 0 <= args.live <= min(args.history, args.nodes * 8):
        p.error("--live must be between 0 and the smaller of --history and --nodes x 8")
    admin_credentials()
    runs = []
    for k in range(args.runs):
        if args.runs > 1:
            print(f"--- run {k + 1} of {args.runs}", flush=True)
        runs.append(asyncio.run(bench(args)))
    figures = runs[0] if len(runs) == 1 else medians(runs)
    print(
        json.dumps({k: figures.get(k) for k in ("jobs_per_s", "p50_ms", "p99_ms", "offered_per_s")} | figures)
    )
    return 0


def medians(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Each figure's median over the runs that have it, with every run's figures under ``runs``."""
    keys = sorted({k for run in runs for k in run})
    summary: dict[str, Any] = {k: statistics.median([run[k] for run in runs if k in run]) for k in keys}
    summary["runs"] = runs
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
