"""``make bench-vs-slurm``: Gangline and Slurm side by side on one fake cluster, real processes, one run.

Both get the cluster of ``deploy/clusters/vs-slurm.yaml`` (16 nodes x 8 fake GPUs, 4 nodes per leaf
switch). Slurm is the single-host peer of ``../shared/slurm-peer`` (Debian's 22.05 packages; one real
slurmd per node, fake GPU gres, slurmdbd on MariaDB for fair share, topology/tree, backfill, partition
preemption; :mod:`services.bench.slurm_peer` generates its configuration from the same spec). Gangline is
the five decision services as processes on private topics of the shared broker, and one NodeAgent per node
over the NVML stand-in whose ranks are real processes (``gangline fake-nodes --nvml standin --runner
process``). Each system runs alone on the machine: Slurm's four phases, Slurm stopped, then Gangline's.

Every job is a shell that appends ``<job id> <date +%s.%N>`` to a file when it starts (rank 0 only), then
sleeps its duration: "running" is that line, measured from just before the submitting call, on one clock.

1. idle-cluster latency: ``--latency-jobs`` one-GPU jobs, one every 0.25 s: submit -> first line;
2. the seeded mixed workload of the peer's ``bench/mixed.py`` (400 jobs, 1x1 ... 4x8 GPUs, 2-12 s, all at
   t=0): makespan against the GPU-seconds lower bound, GPU utilisation, mean and max wait per shape;
3. preemption: every GPU held by a low-priority preemptible one-GPU job, then an urgent 4x8 gang:
   submit -> the gang's line;
4. submission throughput with 1 and 8 submitters, each waiting for every submission's acceptance:
   ``sbatch -H`` (held: nothing launched) against a plain Kafka producer (the broker's ack) and against
   the API (its 202), both on topics no service reads.

Prints a table of every figure for both and the ratio Gangline / Slurm, then one JSON line. Stops what it
started and removes its scratch folders; ``--quick`` runs fewer jobs. Figures depend on what else runs on
the machine: the load average before the run is printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.bench.wire import plain_event

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "deploy" / "clusters" / "vs-slurm.yaml"
SERVICES = ("admission", "quota", "placement", "preemption", "node_health")

# -- the workloads (pure) --------------------------------------------------------------------------

MIXED_SHAPES = ((1, 1, 0.35), (1, 2, 0.2), (1, 4, 0.15), (1, 8, 0.15), (2, 8, 0.1), (4, 8, 0.05))
"""(nodes/workers, GPUs each, probability): the shapes of the peer's ``bench/mixed.py``."""


@dataclass(frozen=True)
class MixedJob:
    workers: int
    gpus: int
    duration_s: int
    account: str

    @property
    def shape(self) -> str:
        return f"{self.workers}x{self.gpus}"

    @property
    def gpu_seconds(self) -> int:
        return self.workers * self.gpus * self.duration_s


def mixed_jobs(count: int, seed: int) -> list[MixedJob]:
    """The jobs ``mixed.py COUNT SEED`` submits, drawn the same way from the same seeded generator."""
    rng = random.Random(seed)

    def pick() -> tuple[int, int]:
        r, acc = rng.random(), 0.0
        for n, g, p in MIXED_SHAPES:
            acc += p
            if r <= acc:
                return n, g
        return MIXED_SHAPES[-1][0], MIXED_SHAPES[-1][1]

    jobs = []
    for _ in range(count):
        n, g = pick()
        d = rng.randint(2, 12)
        account = f"a{rng.randint(1, 4)}"
        jobs.append(MixedJob(n, g, d, account))
    return jobs


def lower_bound_s(jobs: Sequence[MixedJob], total_gpus: int) -> float:
    """No schedule ends sooner than every job's GPU-seconds spread over every GPU."""
    return sum(j.gpu_seconds for j in jobs) / total_gpus


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile the peer's bench.py reports (``q`` in 0..1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_figures(latencies: Sequence[float]) -> dict[str, float]:
    return {
        "p50_s": round(percentile(latencies, 0.5), 3),
        "p90_s": round(percentile(latencies, 0.9), 3),
        "max_s": round(max(latencies), 3),
    }


def mixed_figures(
    jobs: Mapping[str, MixedJob],
    submitted: Mapping[str, float],
    started: Mapping[str, float],
    t0: float,
    total_gpus: int,
) -> dict[str, Any]:
    """Makespan (t0 to the last job's end: its start line plus its duration), the lower bound, their
    ratio, GPU utilisation over the makespan, and waits (submit -> start line) overall and per shape."""
    gpu_s = sum(j.gpu_seconds for j in jobs.values())
    makespan = max(started[k] + j.duration_s for k, j in jobs.items()) - t0
    waits: dict[str, list[float]] = {}
    for k, j in jobs.items():
        waits.setdefault(j.shape, []).append(started[k] - submitted[k])
    every = [w for ws in waits.values() for w in ws]
    bound = gpu_s / total_gpus
    return {
        "makespan_s": round(makespan, 2),
        "lower_bound_s": round(bound, 2),
        "makespan_over_bound": round(makespan / bound, 3),
        "gpu_utilisation": round(gpu_s / (total_gpus * makespan), 3),
        "mean_wait_s": round(statistics.fmean(every), 2),
        "max_wait_s": round(max(every), 2),
        "wait_by_shape": {
            shape: {"n": len(ws), "mean_s": round(statistics.fmean(ws), 2), "max_s": round(max(ws), 2)}
            for shape, ws in sorted(waits.items(), key=lambda kv: _shape_order(kv[0]))
        },
    }


def _shape_order(shape: str) -> tuple[int, int]:
    n, g = shape.split("x")
    return int(n) * int(g), int(n)


# -- the table (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One figure for both systems; ``lower`` says whether less is better (latency) or more (rate)."""

    name: str
    unit: str
    slurm: float | None
    gangline: float | None
    lower: bool = True

    @property
    def ratio(self) -> float | None:
        """Gangline / Slurm (None when either is missing or Slurm's is 0)."""
        if self.slurm is None or self.gangline is None or self.slurm == 0:
            return None
        return self.gangline / self.slurm


def rows_of(figures: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    """The table's rows from each system's figures (``{"slurm": {...}, "gangline": {...}}``)."""
    s, g = figures.get("slurm", {}), figures.get("gangline", {})

    def get(side: Mapping[str, Any], *path: str) -> float | None:
        value: Any = side
        for key in path:
            if not isinstance(value, Mapping) or key not in value:
                return None
            value = value[key]
        return float(value) if isinstance(value, int | float) else None

    def row(name: str, unit: str, *path: str, lower: bool = True) -> Row:
        return Row(name, unit, get(s, *path), get(g, *path), lower)

    rows = [
        row("idle latency p50", "s", "latency", "p50_s"),
        row("idle latency p90", "s", "latency", "p90_s"),
        row("idle latency max", "s", "latency", "max_s"),
        row("mixed makespan", "s", "mixed", "makespan_s"),
        row("mixed lower bound", "s", "mixed", "lower_bound_s"),
        row("mixed makespan / bound", "x", "mixed", "makespan_over_bound"),
        row("mixed GPU utilisation", "", "mixed", "gpu_utilisation", lower=False),
        row("mixed mean wait", "s", "mixed", "mean_wait_s"),
        row("mixed max wait", "s", "mixed", "max_wait_s"),
    ]
    shapes = {**s.get("mixed", {}).get("wait_by_shape", {}), **g.get("mixed", {}).get("wait_by_shape", {})}
    for shape in sorted(shapes, key=_shape_order):
        rows.append(row(f"  wait {shape} mean", "s", "mixed", "wait_by_shape", shape, "mean_s"))
        rows.append(row(f"  wait {shape} max", "s", "mixed", "wait_by_shape", shape, "max_s"))
    rows.append(row("preemption submit->running", "s", "preemption", "submit_to_running_s"))
    # Slurm's way in is sbatch under both of Gangline's (a plain Kafka producer, the API).
    for way, label in (("kafka", "Kafka producer"), ("api", "API")):
        for k in (1, 8):
            rows.append(
                Row(
                    f"submit, {k} submitter{'s' if k > 1 else ''}: sbatch vs {label}",
                    "jobs/s",
                    get(s, "throughput", f"sbatch_{k}"),
                    get(g, "throughput", f"{way}_{k}"),
                    lower=False,
                )
            )
    return rows


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def render_table(rows: Sequence[Row]) -> str:
    """A fixed-width table: figure, Slurm, Gangline, Gangline / Slurm, and which is better."""
    head = ("figure", "unit", "Slurm", "Gangline", "Gangline/Slurm", "better")
    body = []
    for r in rows:
        ratio = r.ratio
        better = "-"
        if ratio is not None and r.slurm != r.gangline and "bound" not in r.name:
            gangline_wins = (ratio < 1) == r.lower
            better = "Gangline" if gangline_wins else "Slurm"
        body.append((r.name, r.unit, _cell(r.slurm), _cell(r.gangline), _cell(ratio), better))
    widths = [max(len(str(line[k])) for line in (head, *body)) for k in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" if k < 2 else f"{{:>{w}}}" for k, w in enumerate(widths))
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*line) for line in body]
    return "\n".join(lines)


# -- common helpers --------------------------------------------------------------------------------


def line_command(starts: Path, job_id_var: str, sleep_s: float, *, rank_var: str | None = None) -> str:
    """The job's shell: one ``<id> <epoch>`` line when it starts (from rank 0 only), then sleep."""
    echo = f"echo ${job_id_var} $(date +%s.%N) >> {starts}"
    if rank_var is not None:
        echo = f'[ "${rank_var}" != 0 ] || {echo}'
    return f"{echo}; sleep {sleep_s:g}"


def read_starts(path: Path) -> dict[str, float]:
    """First start line per job id."""
    out: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                with contextlib.suppress(ValueError):
                    out.setdefault(parts[0], float(parts[1]))
    return out


def wait_for_lines(path: Path, ids: Sequence[str], timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        starts = read_starts(path)
        if all(i in starts for i in ids):
            return starts
        if time.monotonic() > deadline:
            missing = [i for i in ids if i not in starts]
            raise TimeoutError(f"{len(missing)} of {len(ids)} jobs wrote no start line in {timeout_s} s")
        time.sleep(0.05)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


PHASES = ("latency", "mixed", "preemption", "throughput")


@dataclass(frozen=True)
class Sizes:
    latency_jobs: int
    latency_spacing_s: float
    mixed_jobs: int
    seed: int
    throughput_jobs: int
    preempt_low_s: int
    phases: tuple[str, ...] = PHASES

    @classmethod
    def of(cls, quick: bool, seed: int, phases: Sequence[str] = PHASES) -> Sizes:
        if quick:
            return cls(12, 0.25, 60, seed, 100, 120, tuple(phases))
        return cls(60, 0.25, 400, seed, 1000, 300, tuple(phases))


# -- Slurm's side ----------------------------------------------------------------------------------


def run_slurm(sizes: Sizes, spec: Any, scratch: Path) -> dict[str, Any]:
    from services.bench.slurm_peer import SlurmPeer, ensure_packages

    ensure_packages(scratch / "apt.log")
    peer = SlurmPeer(spec, scratch / "slurm")
    figures: dict[str, Any] = {}
    try:
        began = time.monotonic()
        peer.start()
        log(f"slurm: {len(peer.nodes)} slurmd up in {time.monotonic() - began:.1f} s")
        out = scratch / "slurm-out"
        out.mkdir()
        phases: dict[str, Callable[[], dict[str, Any]]] = {
            "latency": lambda: slurm_latency(peer, sizes, out / "latency.txt"),
            "mixed": lambda: slurm_mixed(peer, sizes, out / "mixed.txt", spec.total_gpus),
            "preemption": lambda: slurm_preemption(peer, sizes, out / "preempt.txt", spec.total_gpus),
            "throughput": lambda: slurm_throughput(peer, sizes),
        }
        for phase in sizes.phases:
            figures[phase] = phases[phase]()
            log(f"slurm {phase}: {json.dumps(figures[phase])}")
    finally:
        killed = peer.stop()
        if killed:
            log(f"slurm: had to SIGKILL {killed}")
    return figures


def slurm_latency(peer: Any, sizes: Sizes, starts: Path) -> dict[str, float]:
    starts.touch()
    wrap = line_command(starts, "SLURM_JOB_ID", 1)
    submitted: dict[str, float] = {}
    began = time.time()
    for k in range(sizes.latency_jobs):
        delay = began + k * sizes.latency_spacing_s - time.time()
        if delay > 0:
            time.sleep(delay)
        ts = time.time()
        submitted[str(peer.sbatch(["--gres=gpu:1", "-t", "1"], wrap))] = ts
    seen = wait_for_lines(starts, list(submitted), 120)
    peer.cancel_all()
    return latency_figures([seen[j] - ts for j, ts in submitted.items()])


def slurm_mixed(peer: Any, sizes: Sizes, starts: Path, total_gpus: int) -> dict[str, Any]:
    """``bench/mixed.py`` as the peer measured it: sequential sbatch at t=0, -t 1, --exclusive for 8 GPUs."""
    starts.touch()
    jobs: dict[str, MixedJob] = {}
    submitted: dict[str, float] = {}
    t0 = time.time()
    for job in mixed_jobs(sizes.mixed_jobs, sizes.seed):
        args = ["-A", job.account, f"-N{job.workers}", f"--gres=gpu:{job.gpus}", "-t", "1"]
        if job.gpus == 8:
            args.insert(0, "--exclusive")
        ts = time.time()
        jid = str(peer.sbatch(args, line_command(starts, "SLURM_JOB_ID", job.duration_s)))
        jobs[jid], submitted[jid] = job, ts
    seen = wait_for_lines(starts, list(jobs), 900)
    while peer.queued():
        time.sleep(0.25)
    figures = mixed_figures(jobs, submitted, seen, t0, total_gpus)
    figures["submit_wall_s"] = round(max(submitted.values()) - t0, 2)
    return figures


def slurm_preemption(peer: Any, sizes: Sizes, starts: Path, total_gpus: int) -> dict[str, float]:
    """Every GPU under a one-GPU job of partition ``low``, then ``-p high -N4 --exclusive --gres=gpu:8``."""
    starts.touch()
    low = peer.sbatch(
        [f"--array=0-{total_gpus - 1}", "--gres=gpu:1", "-t", "10"],
        line_command(starts, "SLURM_JOB_ID", sizes.preempt_low_s),
    )
    deadline = time.monotonic() + 180
    while len(peer.run("squeue", "-h", "-r", "-t", "R", "-j", str(low), "-o", "%i").split()) < total_gpus:
        if time.monotonic() > deadline:
            raise TimeoutError("the low-priority array did not fill the cluster")
        time.sleep(0.25)
    time.sleep(1)
    ts = time.time()
    urgent = peer.sbatch(
        ["-p", "high", "-N4", "--exclusive", "--gres=gpu:8", "-t", "5"],
        line_command(starts, "SLURM_JOB_ID", 2),
    )
    seen = wait_for_lines(starts, [str(urgent)], 120)
    requeued = len(peer.run("squeue", "-h", "-r", "-t", "PD", "-j", str(low), "-o", "%i").split())
    peer.cancel_all()
    return {"submit_to_running_s": round(seen[str(urgent)] - ts, 3), "victims_requeued": requeued}


def slurm_throughput(peer: Any, sizes: Sizes) -> dict[str, float]:
    """``sbatch -H`` (held: accepted, nothing launched), each submitter one call after another."""
    out: dict[str, float] = {}
    for submitters in (1, 8):
        per = sizes.throughput_jobs // submitters

        def submit(_: int, per: int = per) -> None:
            for _ in range(per):
                peer.sbatch(["-H", "--gres=gpu:1", "-t", "1"], "true")

        began = time.monotonic()
        with ThreadPoolExecutor(submitters) as pool:
            list(pool.map(submit, range(submitters)))
        out[f"sbatch_{submitters}"] = round(per * submitters / (time.monotonic() - began), 1)
        peer.cancel_all()
    return out


# -- Gangline's side -------------------------------------------------------------------------------


def request_bytes(job_id: str, data: Mapping[str, Any]) -> bytes:
    """A job.requested envelope as any producer writes it: plain JSON."""
    return plain_event("job.requested", job_id, data, source="bench/vs-slurm")


def cancel_bytes(job_id: str) -> bytes:
    reason = {"reason": "the bench phase is over"}
    return plain_event("job.cancel_requested", job_id, reason, source="bench/vs-slurm")


CHECKPOINT_ON_TERM = "trap ': > \"$GANGLINE_CHECKPOINT_ACK\"; exit 0' TERM; "
"""A preemptible job's part of the contract: on the checkpoint signal it acknowledges (its state is
nothing, so at once: the agent made the ack file's directory, a redirection creates the file, no
process is forked) and exits; without the acknowledgement preemption waits out the grace."""


def job_data(
    workers: int, gpus: int, sleep_s: float, starts: Path, *, checkpoints: bool = False, **extra: Any
) -> dict[str, Any]:
    command = line_command(starts, "GANGLINE_JOB_ID", sleep_s, rank_var="RANK")
    if checkpoints:
        # sleep in the background: `wait` returns on the signal, so the trap runs at once
        command = CHECKPOINT_ON_TERM + command.replace(f"sleep {sleep_s:g}", f"sleep {sleep_s:g} & wait")
    return {
        "queue": "default",
        "workers": workers,
        "gpus_per_worker": gpus,
        "command": ["sh", "-c", command],
        "duration_hint_s": max(1, int(sleep_s)),
        **extra,
    }


class Allocations:
    """Reads allocations.log (which allocations are live: granted, not yet released) and jobs.events, with
    the Kafka timestamps of each job's grant and ``job.started``: where the time to a running job goes."""

    def __init__(self, bootstrap: str, topics: Any) -> None:
        from aiokafka import AIOKafkaConsumer

        from gangline.bus.security import client_options

        self.consumer = AIOKafkaConsumer(
            topics.allocations,
            topics.events,
            bootstrap_servers=bootstrap,
            **client_options(),
            group_id=None,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        self.granted: set[str] = set()
        self.released: set[str] = set()
        self.stamps: dict[str, dict[str, float]] = {
            k: {} for k in ("granted", "admitted", "started", "preempting", "checkpointed", "released")
        }
        self.held: dict[str, tuple[int, float, float | None]] = {}
        """Per allocation: its GPUs, when it was granted and released (Kafka timestamps, seconds)."""

    async def poll(self) -> None:
        batch = await self.consumer.getmany(timeout_ms=100, max_records=10_000)
        for records in batch.values():
            for r in records:
                value = r.value or b""
                job = (r.key or b"").decode()
                if b'"type":"gangline.allocation.granted.' in value:
                    data = json.loads(value)["data"]
                    self.granted.add(data["allocation_id"])
                    self.stamps["granted"].setdefault(job, r.timestamp / 1000)
                    gpus = sum(len(p["gpus"]) for p in data["placements"])
                    self.held[data["allocation_id"]] = (gpus, r.timestamp / 1000, None)
                elif b'"type":"gangline.allocation.released.' in value:
                    allocation = json.loads(value)["data"]["allocation_id"]
                    self.released.add(allocation)
                    self.stamps["released"][job] = r.timestamp / 1000
                    if allocation in self.held:
                        gpus, since, _ = self.held[allocation]
                        self.held[allocation] = (gpus, since, r.timestamp / 1000)
                elif b'"type":"gangline.job.admitted.' in value:
                    self.stamps["admitted"].setdefault(job, r.timestamp / 1000)
                elif b'"type":"gangline.job.started.' in value:
                    self.stamps["started"].setdefault(job, r.timestamp / 1000)
                elif b'"type":"gangline.job.preempting.' in value:
                    self.stamps["preempting"].setdefault(job, r.timestamp / 1000)
                elif b'"type":"gangline.job.checkpointed.' in value:
                    self.stamps["checkpointed"][job] = r.timestamp / 1000

    async def until_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        await self.poll()
        while self.granted - self.released:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.granted - self.released)} allocations still live")
            await self.poll()

    def held_gpu_s(self, since: float) -> float:
        """GPU-seconds allocations granted after ``since`` held, grant to release."""
        return sum(
            g * (end - start) for g, start, end in self.held.values() if start >= since and end is not None
        )

    def stages(self, submitted: Mapping[str, float], lines: Mapping[str, float]) -> dict[str, float]:
        """p50 of submit -> admitted -> granted -> the start line (and -> job.started), seconds."""
        admitted, granted, started = (self.stamps[k] for k in ("admitted", "granted", "started"))
        seen = [j for j in submitted if j in admitted and j in granted and j in lines]
        if not seen:
            return {}
        parts = {
            "submit_to_admitted": [admitted[j] - submitted[j] for j in seen],
            "admitted_to_granted": [granted[j] - admitted[j] for j in seen],
            "granted_to_line": [lines[j] - granted[j] for j in seen],
            "line_to_job_started": [started[j] - lines[j] for j in seen if j in started],
        }
        return {f"{k}_p50_s": round(percentile(v, 0.5), 3) for k, v in parts.items() if v}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gangline_env(bootstrap: str, prefix: str, queues: Path) -> dict[str, str]:
    import yaml

    env = dict(os.environ)
    if not env.get("GANGLINE_KAFKA_USERNAME") and env.get("GANGLINE_KAFKA_SECURITY_PROTOCOL") != "PLAINTEXT":
        credentials = yaml.safe_load((ROOT / "deploy" / "kafka" / "credentials.dev.yaml").read_text())
        env |= {"GANGLINE_KAFKA_USERNAME": "admin", "GANGLINE_KAFKA_PASSWORD": str(credentials["admin"])}
    paths = [str(ROOT / "libs"), str(ROOT), env.get("PYTHONPATH", "")]
    return env | {
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "GANGLINE_KAFKA_BOOTSTRAP": bootstrap,
        "GANGLINE_TOPIC_PREFIX": prefix,
        "GANGLINE_GROUP_PREFIX": f"g-{prefix.rstrip('.')}",
        "GANGLINE_INSTANCE_ID": "vs-slurm",
        "GANGLINE_LOG_LEVEL": "WARNING",
        "GANGLINE_METRICS_PORT": "off",
        "GANGLINE_SILENCE_S": "60",
        "GANGLINE_QUEUES_FILE": str(queues),
    }


class Gangline:
    """The services and the stand-in nodes as processes on private topics; :meth:`stop` ends them."""

    def __init__(self, bootstrap: str, scratch: Path) -> None:
        self.bootstrap = bootstrap
        self.scratch = scratch
        self.run = uuid.uuid4().hex[:8]
        from services.common.topics import TopicNames

        self.topics = TopicNames(prefix=f"vs-slurm-{self.run}.")
        self.held = TopicNames(prefix=f"vs-slurm-{self.run}-held.")
        scratch.mkdir(parents=True, exist_ok=True)
        queues = scratch / "queues.yaml"
        queues.write_text("queues:\n  - name: default\n    unlimited: true\n")
        self.env = gangline_env(bootstrap, self.topics.prefix, queues)
        self.logs = scratch / "logs"
        self.logs.mkdir()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start_process(self, name: str, args: list[str], env: Mapping[str, str]) -> None:
        with (self.logs / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, *args], cwd=ROOT, env=dict(env), stdout=out, stderr=subprocess.STDOUT
            )

    async def start(self) -> None:
        from gangline.bus.admin import ensure_topics

        await ensure_topics(self.bootstrap, [*self.topics.specs(), *self.held.specs()])
        nodes = ["-m", "services.agent", "--spec", str(SPEC), "--nvml", "standin", "--runner", "process"]
        self.start_process("nodes", [*nodes, "--heartbeat-s", "5"], self.env)
        for s in SERVICES:
            self.start_process(s, ["-m", f"services.{s}"], self.env)

    def check(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"Gangline processes exited: {dead} (logs in {self.logs})")

    async def stop(self) -> None:
        from gangline.bus.admin import delete_topics

        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log(f"gangline: {name} ignored SIGTERM; SIGKILL")
                proc.kill()
                proc.wait()
        with contextlib.suppress(Exception):
            await delete_topics(self.bootstrap, [s.name for s in (*self.topics.specs(), *self.held.specs())])


async def run_gangline(sizes: Sizes, spec: Any, bootstrap: str, scratch: Path) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer

    from gangline.bus.security import client_options

    system = Gangline(bootstrap, scratch / "gangline")
    figures: dict[str, Any] = {}
    out = scratch / "gangline-out"
    out.mkdir()
    os.environ.update({k: v for k, v in system.env.items() if k.startswith("GANGLINE_KAFKA_")})
    try:
        await system.start()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_options(), linger_ms=0)
        await producer.start()
        allocations = Allocations(bootstrap, system.topics)
        await allocations.consumer.start()
        try:
            side = GanglineSide(system, producer, allocations, sizes, spec.total_gpus)
            began = time.monotonic()
            await side.warm_up(out / "warm.txt")
            log(
                f"gangline: {spec.node_count} node agents and 5 services answering in "
                f"{time.monotonic() - began:.1f} s"
            )
            phases = {"latency": side.latency, "mixed": side.mixed, "preemption": side.preemption}
            for phase in sizes.phases:
                if phase in phases:
                    figures[phase] = await phases[phase](out / f"{phase}.txt")
                    log(f"gangline {phase}: {json.dumps(figures[phase])}")
        finally:
            await producer.stop()
            await allocations.consumer.stop()
        if "throughput" in sizes.phases:
            figures["throughput"] = await gangline_throughput(system, sizes)
            log(f"gangline throughput: {json.dumps(figures['throughput'])}")
    finally:
        await system.stop()
    return figures


class GanglineSide:
    def __init__(
        self, system: Gangline, producer: Any, allocations: Allocations, sizes: Sizes, gpus: int
    ) -> None:
        self.system = system
        self.producer = producer
        self.allocations = allocations
        self.sizes = sizes
        self.total_gpus = gpus
        self.tag = system.run

    async def submit(self, job_id: str, data: Mapping[str, Any]) -> float:
        ts = time.time()
        await self.producer.send(
            self.system.topics.requests, value=request_bytes(job_id, data), key=job_id.encode()
        )
        return ts

    async def lines(self, path: Path, ids: Sequence[str], timeout_s: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while True:
            self.system.check()
            starts = read_starts(path)
            if all(i in starts for i in ids):
                return starts
            if time.monotonic() > deadline:
                missing = [i for i in ids if i not in starts]
                raise TimeoutError(f"{len(missing)} of {len(ids)} Gangline jobs wrote no start line")
            await asyncio.sleep(0.05)

    async def warm_up(self, starts: Path) -> None:
        """Until a job placed on every node has run: the agents registered and the services are caught up."""
        await asyncio.to_thread(starts.touch)
        ids = [f"warm-{k}-{self.tag}" for k in range(self.total_gpus // 8)]
        deadline = time.monotonic() + 180
        while True:
            for job in ids:
                await self.submit(job, job_data(1, 8, 1, starts))
            try:
                await self.lines(starts, ids, 30)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
                ids = [f"{j}-again" for j in ids]
        await self.allocations.until_idle(60)

    async def latency(self, starts: Path) -> dict[str, Any]:
        await asyncio.to_thread(starts.touch)
        submitted: dict[str, float] = {}
        began = time.time()
        for k in range(self.sizes.latency_jobs):
            delay = began + k * self.sizes.latency_spacing_s - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            job = f"lat-{k:03d}-{self.tag}"
            submitted[job] = await self.submit(job, job_data(1, 1, 1, starts))
        seen = await self.lines(starts, list(submitted), 120)
        await self.allocations.until_idle(60)
        stages = self.allocations.stages(submitted, seen)
        return latency_figures([seen[j] - ts for j, ts in submitted.items()]) | {"stages": stages}

    async def mixed(self, starts: Path) -> dict[str, Any]:
        await asyncio.to_thread(starts.touch)
        jobs: dict[str, MixedJob] = {}
        submitted: dict[str, float] = {}
        t0 = time.time()
        for k, job in enumerate(mixed_jobs(self.sizes.mixed_jobs, self.sizes.seed)):
            jid = f"mixed-{k:03d}-{self.tag}"
            jobs[jid] = job
            submitted[jid] = await self.submit(jid, job_data(job.workers, job.gpus, job.duration_s, starts))
        await self.producer.flush()
        seen = await self.lines(starts, list(jobs), 900)
        await self.allocations.until_idle(120)
        figures = mixed_figures(jobs, submitted, seen, t0, self.total_gpus)
        figures["submit_wall_s"] = round(max(submitted.values()) - t0, 2)
        # What the jobs' GPUs were held for beyond their run (launch, exit, report, release): the
        # overhead on the makespan that no ordering removes.
        work = sum(j.gpu_seconds for j in jobs.values())
        figures["held_over_work"] = round(self.allocations.held_gpu_s(t0 - 1) / work, 3)
        return figures

    async def preemption(self, starts: Path) -> dict[str, Any]:
        await asyncio.to_thread(starts.touch)
        low = [f"low-{k:03d}-{self.tag}" for k in range(self.total_gpus)]
        for job in low:
            data = job_data(
                1,
                1,
                self.sizes.preempt_low_s,
                starts,
                checkpoints=True,
                preemptible=True,
                checkpoint_grace_s=5,
            )
            await self.submit(job, data)
        await self.producer.flush()
        await self.lines(starts, low, 180)
        await asyncio.sleep(1)
        urgent = f"urgent-{self.tag}"
        ts = await self.submit(urgent, job_data(4, 8, 2, starts, priority=100))
        await self.producer.flush()
        seen = await self.lines(starts, [urgent], 120)
        for _ in range(20):
            await self.allocations.poll()
        stages = self.allocations.stages({urgent: ts}, seen)
        # The victims' side, from the urgent job's admission: asked to checkpoint, acknowledged, released.
        admitted = self.allocations.stamps["admitted"].get(urgent)
        for event in ("preempting", "checkpointed", "released"):
            at = [t for job, t in self.allocations.stamps[event].items() if job.startswith("low-")]
            if admitted is not None and at:
                stages[f"admitted_to_first_{event}_s"] = round(min(at) - admitted, 3)
                stages[f"admitted_to_last_{event}_s"] = round(max(at) - admitted, 3)
        for job in low:
            await self.producer.send(self.system.topics.requests, value=cancel_bytes(job), key=job.encode())
        await self.producer.flush()
        await self.allocations.until_idle(120)
        return {"submit_to_running_s": round(seen[urgent] - ts, 3), "stages": stages}


def _kafka_submitter(env: dict[str, str], topic: str, ids: list[str], ready: Any, go: Any) -> float:
    """One submitter process: a plain aiokafka producer, each job sent and its ack awaited; returns when
    its last job was acknowledged (epoch seconds)."""
    os.environ.update(env)
    from aiokafka import AIOKafkaProducer

    from gangline.bus.security import client_options

    async def submit() -> float:
        producer = AIOKafkaProducer(bootstrap_servers=env["GANGLINE_KAFKA_BOOTSTRAP"], **client_options())
        await producer.start()
        try:
            data = {"queue": "default", "workers": 1, "gpus_per_worker": 1, "command": ["true"]}
            await producer.send_and_wait(
                topic, value=request_bytes(f"{ids[0]}-connect", data), key=b"connect"
            )
            ready.put(os.getpid())
            await asyncio.to_thread(go.wait)
            for job in ids:
                await producer.send_and_wait(topic, value=request_bytes(job, data), key=job.encode())
            return time.time()
        finally:
            await producer.stop()

    return asyncio.run(submit())


def _api_submitter(url: str, token: str, ids: list[str], ready: Any, go: Any) -> float:
    """One submitter process: POST /v1/jobs one after another (each answered 202 before the next)."""
    import httpx

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        client.get("/healthz")
        ready.put(os.getpid())
        go.wait()
        for job in ids:
            body = {
                "job_id": job,
                "queue": "default",
                "workers": 1,
                "gpus_per_worker": 1,
                "command": ["true"],
            }
            answer = client.post("/v1/jobs", json=body)
            if answer.status_code != 202:
                raise RuntimeError(f"POST /v1/jobs answered {answer.status_code}: {answer.text[:300]}")
    return time.time()


def _submitter_main(
    submit: Callable[..., float], args: tuple[Any, ...], ready: Any, go: Any, done: Any
) -> None:
    try:
        done.put(submit(*args, ready, go))
    except BaseException as error:
        ready.put(-1)
        done.put(repr(error))
        raise


def _rate(
    submit: Callable[..., float], args: Callable[[list[str]], tuple[Any, ...]], n: int, k: int, tag: str
) -> float:
    """Jobs/s of ``k`` submitter processes sending ``n`` jobs in all: from the moment all are connected and
    told to go to the last acceptance."""
    per = n // k
    ctx = multiprocessing.get_context("spawn")
    ready, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(
            target=_submitter_main,
            args=(submit, args([f"{tag}-{s}-{j:05d}" for j in range(per)]), ready, go, done),
            daemon=True,
        )
        for s in range(k)
    ]
    for proc in procs:
        proc.start()
    try:
        if any(ready.get(timeout=180) == -1 for _ in procs):
            raise RuntimeError(f"a submitter failed: {done.get(timeout=5)}")
        began = time.time()
        go.set()
        ends: list[object] = [done.get(timeout=900) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    last = [e for e in ends if isinstance(e, float)]
    if len(last) < len(ends):
        raise RuntimeError(f"a submitter failed: {next(e for e in ends if not isinstance(e, float))}")
    return round(per * k / (max(last) - began), 1)


async def gangline_throughput(system: Gangline, sizes: Sizes) -> dict[str, float]:
    """A plain Kafka producer and the API, 1 and 8 submitters, onto topics no decision service reads (like
    ``sbatch -H``: accepted, nothing launched)."""
    from services.api.auth import hash_token

    env = gangline_env(system.bootstrap, system.held.prefix, system.scratch / "queues.yaml")
    out: dict[str, float] = {}
    for k in (1, 8):
        out[f"kafka_{k}"] = await asyncio.to_thread(
            _rate,
            _kafka_submitter,
            lambda ids: (env, system.held.requests, ids),
            sizes.throughput_jobs,
            k,
            f"kafka{k}-{system.run}",
        )
    token = f"vs-slurm-{uuid.uuid4().hex}"
    tokens = system.scratch / "tokens.yaml"
    tokens.write_text(
        json.dumps({"tenants": [{"name": "bench", "token_sha256": hash_token(token), "admin": True}]})
    )
    port = _free_port()
    api_env = env | {
        "GANGLINE_PORT": str(port),
        "GANGLINE_TOKENS_FILE": str(tokens),
        "GANGLINE_RATE_LIMIT_PER_S": "1000000",
        "GANGLINE_RATE_LIMIT_BURST": "1000000",
    }
    system.start_process("api", ["-m", "services.api"], api_env)
    url = f"http://127.0.0.1:{port}"
    await _until_healthy(url, system)
    for k in (1, 8):
        out[f"api_{k}"] = await asyncio.to_thread(
            _rate,
            _api_submitter,
            lambda ids: (url, token, ids),
            sizes.throughput_jobs,
            k,
            f"api{k}-{system.run}",
        )
    return out


async def _until_healthy(url: str, system: Gangline) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        for _ in range(300):
            system.check()
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{url}/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"the API at {url} did not answer /healthz")


# -- the run ---------------------------------------------------------------------------------------


def goals(figures: Mapping[str, Mapping[str, Any]]) -> dict[str, bool | None]:
    """Issue 17's goals for Gangline, each met or not (None: a figure is missing)."""
    s, g = figures.get("slurm", {}), figures.get("gangline", {})
    try:
        shapes_s, shapes_g = s["mixed"]["wait_by_shape"], g["mixed"]["wait_by_shape"]
        return {
            "latency_p50_10x_lower": g["latency"]["p50_s"] * 10 <= s["latency"]["p50_s"],
            "makespan_within_1.03x_bound": g["mixed"]["makespan_over_bound"] <= 1.03,
            "mean_wait_at_most_half": g["mixed"]["mean_wait_s"] * 2 <= s["mixed"]["mean_wait_s"],
            "no_shape_waits_longer": all(
                shapes_g[k]["mean_s"] <= shapes_s[k]["mean_s"] for k in shapes_g if k in shapes_s
            ),
            "preemption_4x_faster": g["preemption"]["submit_to_running_s"] * 4
            <= s["preemption"]["submit_to_running_s"],
        }
    except (KeyError, TypeError):
        return {}


def _stop_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # so that every `finally` stops what it started


async def _cancelled_on_sigterm(work: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """``work`` as a task that SIGTERM cancels (its `finally` blocks still await their stops)."""
    task = asyncio.ensure_future(work)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        raise SystemExit(128 + signal.SIGTERM) from None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make bench-vs-slurm", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("GANGLINE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument(
        "--quick", action="store_true", help="fewer jobs (12 latency, 60 mixed, 100 per throughput case)"
    )
    p.add_argument(
        "--seed", type=int, default=1, help="the mixed workload's seed (mixed.py's second argument)"
    )
    p.add_argument("--only", choices=("slurm", "gangline"), help="run one side only (development)")
    p.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)} (development)"
    )
    args = p.parse_args(argv)
    from gangline.cluster_spec import load_cluster_spec

    spec = load_cluster_spec(SPEC)
    phases = [p for p in args.phases.split(",") if p]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"unknown phases {unknown}; choose from {','.join(PHASES)}")
    sizes = Sizes.of(args.quick, args.seed, phases)
    if args.only != "gangline" and os.geteuid() != 0:
        raise SystemExit(
            "the Slurm peer needs root (apt-get, munged, one slurmd per node); --only gangline runs without"
        )
    load = os.getloadavg()
    log(
        f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
        f"cluster {spec.name}: {spec.node_count} nodes x 8 GPUs"
    )
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    scratch = Path(tempfile.mkdtemp(prefix="gangline-vs-slurm-"))
    figures: dict[str, Any] = {}
    try:
        if args.only != "gangline":
            figures["slurm"] = run_slurm(sizes, spec, scratch)
        if args.only != "slurm":
            figures["gangline"] = asyncio.run(
                _cancelled_on_sigterm(run_gangline(sizes, spec, args.bootstrap, scratch))
            )
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(render_table(rows_of(figures)))
    met = goals(figures)
    print()
    for goal, ok in met.items():
        print(f"goal {goal}: {'met' if ok else 'NOT met'}")
    summary = {
        "load_before": [round(x, 2) for x in load],
        "quick": args.quick,
        "seed": args.seed,
        "cluster": {"nodes": spec.node_count, "gpus": spec.total_gpus, "nodes_per_leaf": 4},
        **figures,
        "ratios": {r.name.strip(): round(r.ratio, 3) for r in rows_of(figures) if r.ratio is not None},
        "goals": met,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
