"""``python -m services.bench.restart``: how long a restarted placement takes to process again, with and
without a snapshot, over a generated history of ``--jobs`` jobs.

For each size, on a private set of topics on the broker:

1. **History.** ``--nodes`` 8-GPU nodes register, then every job is admitted, granted one GPU, completes and
   is released (four events: admitted and completed on jobs.events, granted and released on
   allocations.log, each job's on the partition its id keys it to); the last ``--live`` jobs still hold
   their GPUs. The records are pre-encoded from one real envelope per event type (the codec's bytes with
   the ids, node, GPU and time swapped in) and produced in batches straight to the partitions. Placement's
   consumer group is given the end of every input as its committed offsets, as a placement that had run
   through that history would have left them.
2. **Before: no snapshot.** A probe job is admitted, placement is started (a real process) and the time
   from its spawn to its first output (the probe's grant, by the record's timestamp) is taken, and from
   its first log line (the interpreter started, the imports done: ``*_main_s``) to that output: the whole
   log is read back first, as every start did before snapshots. Its first batch then writes the first
   snapshot (timed too, from its log).
3. **After: from the snapshot.** Placement is stopped, another probe admitted, placement started again: it
   loads the snapshot, reads only the tail, and the same time is taken, with the CPU the process had used
   by then (user + system, read from ``/proc`` when the grant is seen: the figure a busy machine inflates
   least).

``--seed-snapshot`` skips step 2 (at 1,000,000 jobs it reads 4,000,000 events, twenty minutes on the
busy machine): the bench writes the first snapshot itself, of the state the history folds to
(:func:`folded_state`: the registrations and the live jobs' records folded, every earlier job put among
the retired as its four records leave it; tests/unit/services/test_bench_restart.py checks it is the
state folding the whole history builds), covering the inputs to their ends. ``--profile DIR`` runs the
restart from the snapshot under pyinstrument and leaves its report there.

The topics are deleted afterwards. Prints the figures and ends with one JSON line (per size:
``before_s``, ``after_s``, the restores' own seconds and events, the snapshot's size). The machine is
shared: how busy its cores were before each size is printed with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gangline.bus.admin import delete_topics, ensure_topics
from gangline.bus.chain import partition_for
from gangline.bus.security import client_options
from gangline.bus.snapshots import read_latest, snapshot_records
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Event, make_envelope
from gangline.events.codec import decode, encode
from gangline.events.jobs import JobAdmitted, JobCompleted, JobSpec
from gangline.events.types import AllocationId, JobId
from gangline.fold.retired import allocation_id_of
from services.bench.e2e import admin_credentials, machine_busy_s
from services.common.snapshots import encode_state
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState
from services.placement.settings import PlacementSettings
from services.placement.wiring import SERVICE, new_state, snapshot_config

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GPUS_PER_NODE = 8
_TIME = "2026-01-01T00:00:00Z"


def _template(event: Event, source: str) -> str:
    """The codec's bytes of ``event`` with placeholders (JOBXX, EVIDXX, NODEXX, GPUXX, the time)."""
    return encode(make_envelope(event, event_id="EVIDXX", source=source, time=T0)).decode()


def templates() -> dict[str, str]:
    job = JobId("JOBXX")
    allocation = AllocationId("JOBXX.1")
    granted = AllocationGranted.model_validate(
        {
            "job_id": "JOBXX",
            "allocation_id": "JOBXX.1",
            "queue": "default",
            "placements": [{"rank": 0, "node": "NODEXX", "gpus": ["GPUXX"]}],
        }
    )
    return {
        "admitted": _template(
            JobAdmitted(job_id=job, spec=JobSpec(queue="default", workers=1, gpus_per_worker=1)),
            "gangline/admission",
        ),
        "granted": _template(granted, "gangline/placement"),
        "completed": _template(JobCompleted(job_id=job, allocation_id=allocation), "gangline/agent"),
        "released": _template(
            AllocationReleased(job_id=job, allocation_id=allocation, reason="completed"), "gangline/placement"
        ),
    }


def fill(template: str, *, job: str, event_id: str, at: str, node: str = "", gpu: str = "") -> bytes:
    text = template.replace("JOBXX", job).replace("EVIDXX", event_id).replace(_TIME, at)
    if node:
        text = text.replace("NODEXX", node).replace("GPUXX", gpu)
    return text.encode()


def history(jobs: int, nodes: Sequence[str], live: int) -> Iterator[tuple[str, str, bytes]]:
    """``(topic kind, key, value)`` of every job's records, in the order they happened: job ``k`` on one GPU
    of node ``k mod N``, which the job ``N * 8`` before it gave back."""
    forms = templates()
    for k in range(jobs):
        job = f"h{k:07d}"
        node, gpu = nodes[k % len(nodes)], f"gpu{(k // len(nodes)) % GPUS_PER_NODE}"
        at = (T0 + timedelta(milliseconds=10 * k)).isoformat().replace("+00:00", "Z")
        yield "events", job, fill(forms["admitted"], job=job, event_id=f"{job}-a", at=at)
        yield (
            "allocations",
            job,
            fill(forms["granted"], job=job, event_id=f"{job}-g", at=at, node=node, gpu=gpu),
        )
        if k < jobs - live:
            yield "events", job, fill(forms["completed"], job=job, event_id=f"{job}-c", at=at)
            yield "allocations", job, fill(forms["released"], job=job, event_id=f"{job}-r", at=at)


class BatchWriter:
    """Records appended to one open batch per partition, each sent when full (a few sends per MiB)."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self._open: dict[tuple[str, int], Any] = {}
        self._sent: list[asyncio.Future[Any]] = []
        self.records = 0

    async def append(self, topic: str, partition: int, key: bytes, value: bytes) -> None:
        batch = self._open.get((topic, partition))
        if batch is None:
            batch = self._open[(topic, partition)] = self._producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            await self._send(topic, partition)
            batch = self._open[(topic, partition)] = self._producer.create_batch()
            batch.append(key=key, value=value, timestamp=None)
        self.records += 1

    async def _send(self, topic: str, partition: int) -> None:
        batch = self._open.pop((topic, partition))
        batch.close()
        self._sent.append(await self._producer.send_batch(batch, topic, partition=partition))
        if len(self._sent) >= 64:
            await asyncio.gather(*self._sent)
            self._sent.clear()

    async def flush(self) -> None:
        for topic, partition in list(self._open):
            await self._send(topic, partition)
        await asyncio.gather(*self._sent)
        self._sent.clear()


def cluster_registrations(nodes: int) -> list[tuple[str, bytes]]:
    """``(node, record)`` of the registrations of ``nodes`` 8-GPU nodes."""
    spec = ClusterSpec(
        name="bench",
        groups=(
            NodeGroup(
                name="n",
                count=nodes,
                gpu_model="H100-SXM5-80GB",
                gpus_per_node=GPUS_PER_NODE,
                memory_mib=81920,
                leaf="leaf-0",
            ),
        ),
    )
    return [
        (
            registration.node,
            encode(make_envelope(registration, event_id=f"reg-{registration.node}", source="bench", time=T0)),
        )
        for registration in spec.registrations()
    ]


async def generate(
    bootstrap: str, topics: TopicNames, jobs: int, registrations: Sequence[tuple[str, bytes]], live: int
) -> int:
    """Write the history; the number of records."""
    return await write_history(
        bootstrap, topics, jobs, [node for node, _ in registrations], live, registrations
    )


async def write_history(
    bootstrap: str,
    topics: TopicNames,
    jobs: int,
    nodes: Sequence[str],
    live: int,
    registrations: Sequence[tuple[str, bytes]] = (),
) -> int:
    """Write ``registrations`` (node, record) to nodes.inventory, then the :func:`history` of ``jobs`` jobs on
    ``nodes`` straight to their partitions; the number of records."""
    partitions = {spec.name: spec.partitions for spec in topics.specs()}
    names = {"events": topics.events, "allocations": topics.allocations}
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, **client_options(), max_batch_size=512 * 1024, linger_ms=50, acks=1
    )
    await producer.start()
    try:
        writer = BatchWriter(producer)
        for node, value in registrations:
            await writer.append(topics.inventory, 0, node.encode(), value)
        for kind, job, value in history(jobs, nodes, live):
            topic = names[kind]
            key = job.encode()
            await writer.append(topic, partition_for(key, partitions[topic]), key, value)
        await writer.flush()
        return writer.records
    finally:
        await producer.stop()


def folded_state(
    jobs: int,
    nodes: Sequence[str],
    live: int,
    registrations: Sequence[tuple[str, bytes]],
    settings: PlacementSettings,
) -> PlacementState:
    """The state placement's restore of the :func:`history` leaves, built without folding every job: the
    registrations and the live jobs' records are folded (topic by topic, as the restore reads them), and
    each earlier job is put among the retired as its four records leave it (its one grant released)."""
    state = new_state(settings)
    for _, value in registrations:
        state.restore(decode(value))
    records = [r for r in history(jobs, nodes, live) if int(r[1][1:]) >= jobs - live]
    for kind in ("events", "allocations"):
        for _, _, value in (r for r in records if r[0] == kind):
            state.restore(decode(value))
    for k in range(jobs - live):
        job = JobId(f"h{k:07d}")
        state.retired[job] = (allocation_id_of(job, 1),)
    return state


async def seed_snapshot(
    bootstrap: str,
    topics: TopicNames,
    state: PlacementState,
    events: int,
) -> int:
    """Write a snapshot of ``state`` to placement's snapshot topic, covering its inputs to their ends, as
    a placement that folded the whole history would have written it; the payload's size."""
    ends_now = await ends(bootstrap, placement_inputs(topics)[:5])
    payload = encode_state(state)
    records = snapshot_records(
        payload,
        snapshot_id=uuid.uuid4().hex,
        kind=f"{SERVICE}/{state.SNAPSHOT_VERSION}",
        config=snapshot_config(state),
        positions={(tp.topic, tp.partition): offset for tp, offset in ends_now.items()},
        written_at=datetime.now(UTC),
        events=events,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, **client_options(), max_request_size=2 * 1024 * 1024
    )
    await producer.start()
    try:
        for record in records:
            await producer.send_and_wait(
                topics.snapshots(SERVICE),
                record.value,
                key=record.key,
                partition=0,
                headers=list(record.headers),
            )
    finally:
        await producer.stop()
    return len(payload)


def cpu_s(pid: int) -> float | None:
    """The CPU (user + system, seconds) process ``pid`` has used so far, from /proc (None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def placement_inputs(topics: TopicNames) -> list[str]:
    return [
        topics.inventory,
        topics.health,
        topics.operator,
        topics.events,
        topics.allocations,
        topics.heartbeats,
        topics.requests,
    ]


async def ends(bootstrap: str, names: list[str]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **client_options(), enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        tps = [TopicPartition(t, p) for t in names for p in sorted(consumer.partitions_for_topic(t) or ())]
        found: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        return found
    finally:
        await consumer.stop()


async def commit_as_caught_up(bootstrap: str, group: str, names: list[str]) -> None:
    """Placement's group offsets at the end of every input: the previous placement had read it all."""
    offsets = await ends(bootstrap, names)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, **client_options(), group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def admit_probe(bootstrap: str, topics: TopicNames, job: str) -> None:
    value = fill(templates()["admitted"], job=job, event_id=f"{job}-a", at=datetime.now(UTC).isoformat())
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_options())
    await producer.start()
    try:
        await producer.send_and_wait(topics.events, value, key=job.encode())
    finally:
        await producer.stop()


async def grant_time(
    bootstrap: str, topics: TopicNames, job: str, after: dict[TopicPartition, int], timeout_s: float
) -> float:
    """The timestamp (s) of the grant of ``job`` on allocations.log, written after ``after``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **client_options(),
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        tps = [tp for tp in after if tp.topic == topics.allocations]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, after[tp])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    if record.key == job.encode() and b"allocation.granted" in (record.value or b""):
                        return float(record.timestamp) / 1000
        raise TimeoutError(f"no grant for {job} after {timeout_s} s")
    finally:
        await consumer.stop()


def service_env(bootstrap: str, topics: TopicNames) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GANGLINE_TRUST") and k != "GANGLINE_WRITER_KEY_FILE"
    }
    return {
        **env,
        "GANGLINE_KAFKA_BOOTSTRAP": bootstrap,
        "GANGLINE_TOPIC_PREFIX": topics.prefix,
        "GANGLINE_GROUP_PREFIX": f"g-{topics.prefix.rstrip('.')}",
        "GANGLINE_INSTANCE_ID": "bench",
        "GANGLINE_METRICS_PORT": "off",
        "GANGLINE_LOG_LEVEL": "INFO",
    }


def log_figures(text: str) -> dict[str, float]:
    """The restore's and the snapshots' own figures, from the service's JSON log lines."""
    out: dict[str, float] = {}
    restored = re.findall(r'"state restored from the log", "events": (\d+), "seconds": ([0-9.]+)', text)
    if restored:
        out["restore_events"] = int(restored[-1][0])
        out["restore_s"] = float(restored[-1][1])
    loaded = re.findall(r'"state loaded from a snapshot".*?"bytes": (\d+).*?"seconds": ([0-9.]+)', text)
    if loaded:
        out["snapshot_bytes"] = int(loaded[-1][0])
        out["snapshot_load_s"] = float(loaded[-1][1])
    written = re.findall(
        r'"snapshot taken".*?"bytes": (\d+), "compressed": (\d+), "seconds": ([0-9.]+)', text
    )
    if written:
        out["snapshot_state_bytes"] = int(written[0][0])
        out["snapshot_compressed_bytes"] = int(written[0][1])
        out["snapshot_write_s"] = float(written[0][2])
    return out


def spawn(env: dict[str, str], log: Path, profile: Path | None = None) -> subprocess.Popen[bytes]:
    """Placement, under pyinstrument writing its report to ``profile`` when given."""
    profiler = ["-m", "pyinstrument", "-r", "text", "--show-all", "-o", str(profile)] if profile else []
    return subprocess.Popen(
        [sys.executable, *profiler, "-m", "services.placement"],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


async def restart(
    bootstrap: str,
    topics: TopicNames,
    env: dict[str, str],
    log: Path,
    probe: str,
    timeout_s: float,
    profile: Path | None = None,
) -> tuple[subprocess.Popen[bytes], float, float, float | None]:
    """Admit ``probe``, start placement; the process, the seconds from its spawn to the probe's grant, when
    that grant was written, and the CPU seconds the process had used when the grant was seen."""
    await admit_probe(bootstrap, topics, probe)
    before = await ends(bootstrap, [topics.allocations])
    spawned = time.time()
    proc = spawn(env, log, profile)
    granted = await grant_time(bootstrap, topics, probe, before, timeout_s)
    return proc, granted - spawned, granted, cpu_s(proc.pid)


def first_line_at(log: Path) -> float | None:
    """When the service logged its first line (its imports done, its main begun), from the log."""
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return datetime.fromisoformat(json.loads(line)["time"]).timestamp()
    return None


async def wait_for_snapshot(bootstrap: str, topic: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await read_latest(bootstrap, topic) is not None:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"no snapshot on {topic} after {timeout_s} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def one_size(bootstrap: str, jobs: int, args: argparse.Namespace) -> dict[str, Any]:
    topics = TopicNames(prefix=f"bench-restart-{uuid.uuid4().hex[:8]}.")
    await ensure_topics(bootstrap, topics.specs())
    logs = Path(tempfile.mkdtemp(prefix="gangline-bench-restart-"))
    env = service_env(bootstrap, topics)
    figures: dict[str, Any] = {"jobs": jobs}
    busy_before = machine_busy_s()
    await asyncio.sleep(2)
    busy, total = (a - b for a, b in zip(machine_busy_s(), busy_before, strict=True))
    figures["background_busy"] = round(busy / max(total, 1e-9), 2)
    proc: subprocess.Popen[bytes] | None = None
    registrations = cluster_registrations(args.nodes)
    try:
        began = time.monotonic()
        figures["events"] = await generate(bootstrap, topics, jobs, registrations, args.live)
        figures["generate_s"] = round(time.monotonic() - began, 1)
        print(
            f"{jobs:,} jobs: {figures['events']:,.0f} records written in {figures['generate_s']} s "
            f"(the machine's cores {figures['background_busy']:.0%} busy before)",
            flush=True,
        )
        await commit_as_caught_up(
            bootstrap, f"{env['GANGLINE_GROUP_PREFIX']}.placement", placement_inputs(topics)
        )

        if args.seed_snapshot:
            began = time.monotonic()
            state = folded_state(
                jobs,
                [node for node, _ in registrations],
                args.live,
                registrations,
                PlacementSettings.from_env(service_env(bootstrap, topics)),
            )
            size = await seed_snapshot(bootstrap, topics, state, figures["events"])
            del state
            print(
                f"  the snapshot written by the bench ({size:,} bytes) in {time.monotonic() - began:.1f} s",
                flush=True,
            )
        else:
            before_log = logs / "placement-before.log"
            proc, figures["before_s"], granted, figures["before_cpu_s"] = await restart(
                bootstrap, topics, env, before_log, "probe-0", args.timeout_s
            )
            figures["before_main_s"] = round(granted - (first_line_at(before_log) or granted), 3)
            await wait_for_snapshot(bootstrap, topics.snapshots("placement"), args.timeout_s)
            stop(proc)
            proc = None
            b = log_figures(before_log.read_text())
            print(
                f"  before (no snapshot): spawn to first output {figures['before_s']:.2f} s "
                f"({figures['before_cpu_s']} s of CPU), of which "
                f"{figures['before_main_s']:.2f} s from the service's first log line; the restore read "
                f"{b.get('restore_events', 0):,.0f} events in {b.get('restore_s')} s; the first snapshot "
                f"then took {b.get('snapshot_write_s')} s ({b.get('snapshot_state_bytes', 0):,.0f} bytes, "
                f"{b.get('snapshot_compressed_bytes', 0):,.0f} compressed)",
                flush=True,
            )
            figures |= {f"before_{k}": v for k, v in b.items()}
        runs: list[dict[str, float | None]] = []
        for run in range(args.after_runs):
            after_log = logs / f"placement-after-{run}.log"
            profile = Path(args.profile) / f"restart-{jobs}-{run}.txt" if args.profile else None
            load = os.getloadavg()[0]
            proc, after_s, granted, cpu = await restart(
                bootstrap, topics, env, after_log, f"probe-{run + 1}", args.timeout_s, profile
            )
            main_s = round(granted - (first_line_at(after_log) or granted), 3)
            stop(proc)
            proc = None
            a = log_figures(after_log.read_text())
            runs.append(
                {
                    "after_s": round(after_s, 3),
                    "after_cpu_s": cpu,
                    "after_main_s": main_s,
                    "load": round(load, 1),
                }
                | {f"after_{k}": v for k, v in a.items()}
            )
            print(
                f"  after (from the snapshot), load {load:.1f}: spawn to first output {after_s:.2f} s "
                f"({cpu} s of CPU), of which {main_s:.2f} s from the service's first log line; snapshot "
                f"loaded in {a.get('snapshot_load_s')} s, the restore (load and tail) took "
                f"{a.get('restore_s')} s for {a.get('restore_events', 0):,.0f} events of tail",
                flush=True,
            )
        figures["after_runs"] = runs
        for name in ("after_s", "after_cpu_s", "after_main_s"):
            values = sorted(v for r in runs if (v := r.get(name)) is not None)
            if values:
                figures[name] = values[len(values) // 2]
    finally:
        if proc is not None:
            stop(proc)
        await delete_topics(bootstrap, [s.name for s in topics.specs()], timeout_s=120)
        print(f"  logs: {logs}", flush=True)
    return figures


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m services.bench.restart", description=__doc__)
    p.add_argument("--bootstrap", default=os.environ.get("GANGLINE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--jobs", type=int, action="append", help="jobs of history (repeat for several sizes)")
    p.add_argument("--nodes", type=int, default=125, help="8-GPU nodes (1,000 GPUs by default)")
    p.add_argument("--live", type=int, default=200, help="jobs still running at the end of the history")
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--after-runs", type=int, default=1, help="restarts from the snapshot (their median)")
    p.add_argument(
        "--seed-snapshot",
        action="store_true",
        help="no restart over the whole log: the bench writes the first snapshot (module docstring)",
    )
    p.add_argument("--profile", help="a folder for pyinstrument's reports of the restarts from the snapshot")
    args = p.parse_args()
    if args.live >= args.nodes * GPUS_PER_NODE:
        p.error("--live must leave a GPU free for the probe")
    admin_credentials()
    sizes = args.jobs or [10_000]
    results = [asyncio.run(one_size(args.bootstrap, jobs, args)) for jobs in sizes]
    print(json.dumps({"sizes": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
