"""Trace adapters: real and user traces turned into `TraceJob`s (pure, reads files only).

Three formats, each one loader:

* **Philly** (`pollux-philly/philly.csv`: `timestamp,duration,num_gpus,gpu_time,cluster`): one job
  per row, the virtual cluster (VC) is the queue. A job of up to 8 GPUs is one worker with all its
  GPUs (Philly placed those inside one server); a bigger job is a gang of 8-GPU workers (or 4/2/1
  when 8 does not divide it). Submit times are seconds from the first submission (the wall
  clock read as UTC, so no daylight-saving jumps).
* **Alibaba 2023** (`openb_pod_list_*.csv`): one job per pod that asks for GPUs (0-GPU pods are
  skipped). A fractional pod (`num_gpu` 1, `gpu_milli` < 1000) is one worker with a milli share; a
  pod of k whole GPUs is k workers of 1000 milli that must share one node (one pod, `pod_workers`
  k). Duration: `deletion_time - scheduled_time` (or `- creation_time` for pods never scheduled).
  The queue is the pod's QoS class; `gpu_spec` (types separated by `|`) keeps the first type.
* **Generic CSV** (documented for users): header `submit_time_s,duration_s,workers,gpus_per_worker,queue`
  with optional `gpu_type,priority,preemptible,job_id,time_limit_s`; seconds from trace start;
  `gpus_per_worker` may be a fraction below 1 (e.g. `0.5`) for a shared GPU; `time_limit_s` is the
  job's own time limit (what a Slurm user gives with `--time`), read by `easy-backfill` only.

Philly and Alibaba give no time limits (`TraceJob.time_limit_s` is None).

`time_scale` divides submit times (2.0 = the same jobs arriving twice as fast), for load what-ifs.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gangline.core.model import (
    GpuModel,
    Job,
    JobId,
    Milli,
    QueueName,
    Seconds,
    TopologyConstraint,
    TopologyLevel,
)

GENERIC_REQUIRED = ("submit_time_s", "duration_s", "workers", "gpus_per_worker", "queue")
GENERIC_OPTIONAL = ("gpu_type", "priority", "preemptible", "job_id", "time_limit_s")
PHILLY_HEADER = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
ALIBABA_HEADER = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")


class TraceError(ValueError):
    """A trace file that cannot be read: names the file, the line and the problem."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: when it arrives, how long it runs once started, and what it asks for.

    `pod_workers` is how many workers form one indivisible pod for pod-level baselines (a
    Kubernetes pod of k GPUs); 1 means each worker is its own pod.
    """

    id: JobId
    submit_s: float
    duration_s: float
    queue: QueueName
    workers: int
    gpus_per_worker: int = 1
    gpu_milli: Milli | None = None
    gpu_type: GpuModel | None = None
    priority: int = 0
    preemptible: bool = False
    pod_workers: int = 1
    same_node: bool = False
    time_limit_s: float | None = None
    """The limit the submitter gave (None: the trace gives none); not the run time, which the
    simulator alone knows."""
    min_workers: int | None = None
    """An elastic job: it runs with any worker count from this to ``workers`` (None: not elastic)."""

    @property
    def gpus(self) -> float:
        """GPU-equivalents held while running (a 500-milli worker holds 0.5)."""
        if self.gpu_milli is not None:
            return self.workers * self.gpu_milli / 1000.0
        return float(self.workers * self.gpus_per_worker)

    def to_job(self) -> Job:
        """The core's `Job` for this trace job."""
        return Job(
            id=self.id,
            queue=self.queue,
            workers=self.workers,
            gpus_per_worker=self.gpus_per_worker,
            gpu_type=self.gpu_type,
            gpu_milli=self.gpu_milli,
            priority=self.priority,
            preemptible=self.preemptible,
            topology=TopologyConstraint(TopologyLevel.NODE) if self.same_node else None,
            duration_hint_s=Seconds(max(1, math.ceil(self.duration_s))),
            time_limit_s=Seconds(max(1, math.ceil(self.time_limit_s)))
            if self.time_limit_s is not None
            else None,
            min_workers=self.min_workers,
        )


def _rows(path: Path, need: Iterable[str]) -> tuple[list[str], Iterable[tuple[int, dict[str, str]]]]:
    fh = path.open(newline="", encoding="utf-8")
    reader = csv.DictReader(fh)
    header = list(reader.fieldnames or [])
    missing = [c for c in need if c not in header]
    if missing:
        fh.close()
        raise TraceError(f"{path}: header lacks {', '.join(missing)} (has {', '.join(header)})")

    def gen() -> Iterable[tuple[int, dict[str, str]]]:
        with fh:
            yield from enumerate(reader, start=2)

    return header, gen()


def _finish(jobs: list[TraceJob], time_scale: float, limit: int | None) -> list[TraceJob]:
    """Order by (submit time, id), keep the first `limit`, shift to start at 0, scale submit times."""
    if time_scale <= 0:
        raise TraceError(f"time_scale must be > 0, got {time_scale}")
    if not jobs:
        return []
    jobs = sorted(jobs, key=lambda j: (j.submit_s, j.id))[:limit]
    t0 = jobs[0].submit_s
    out = [
        TraceJob(
            id=j.id,
            submit_s=(j.submit_s - t0) / time_scale,
            duration_s=j.duration_s,
            queue=j.queue,
            workers=j.workers,
            gpus_per_worker=j.gpus_per_worker,
            gpu_milli=j.gpu_milli,
            gpu_type=j.gpu_type,
            priority=j.priority,
            preemptible=j.preemptible,
            pod_workers=j.pod_workers,
            same_node=j.same_node,
            time_limit_s=j.time_limit_s,
        )
        for j in jobs
    ]
    return out


def philly_shape(num_gpus: int) -> tuple[int, int]:
    """(workers, gpus_per_worker) for a Philly job of `num_gpus` GPUs (see module docstring)."""
    if num_gpus <= 8:
        return 1, num_gpus
    for g in (8, 4, 2, 1):
        if num_gpus % g == 0:
            return num_gpus // g, g
    raise AssertionError("unreachable: 1 divides everything")


def load_philly(path: str | Path, *, time_scale: float = 1.0, limit: int | None = None) -> list[TraceJob]:
    """Jobs of the Philly summary trace (see module docstring)."""
    p = Path(path)
    _, rows = _rows(p, PHILLY_HEADER)
    jobs: list[TraceJob] = []
    for n, row in rows:
        try:
            submit = datetime.fromisoformat(row["timestamp"]).replace(tzinfo=UTC).timestamp()
            duration = float(row["duration"])
            gpus = int(row["num_gpus"])
        except ValueError as e:
            raise TraceError(f"{p}:{n}: {e}") from e
        if gpus < 1 or duration < 0:
            raise TraceError(f"{p}:{n}: num_gpus must be >= 1 and duration >= 0")
        workers, per = philly_shape(gpus)
        jobs.append(
            TraceJob(
                id=JobId(f"philly-{n - 1:06d}"),
                submit_s=submit,
                duration_s=max(1.0, duration),
                queue=QueueName(row["cluster"]),
                workers=workers,
                gpus_per_worker=per,
            )
        )
    return _finish(jobs, time_scale, limit)


def load_alibaba(path: str | Path, *, time_scale: float = 1.0, limit: int | None = None) -> list[TraceJob]:
    """GPU pods of an Alibaba 2023 `openb_pod_list_*.csv` (see module docstring)."""
    p = Path(path)
    _, rows = _rows(p, ALIBABA_HEADER)
    jobs: list[TraceJob] = []
    for n, row in rows:
        try:
            num_gpu = int(row["num_gpu"])
            milli = int(row["gpu_milli"])
            created = float(row["creation_time"])
            deleted = float(row["deletion_time"])
            scheduled = float(row["scheduled_time"]) if row["scheduled_time"] else created
        except ValueError as e:
            raise TraceError(f"{p}:{n}: {e}") from e
        if num_gpu <= 0 or milli <= 0:
            continue
        spec = (row.get("gpu_spec") or "").split("|")[0].strip()
        duration = max(1.0, deleted - scheduled)
        queue = QueueName(row.get("qos") or "default")
        job_id = JobId(row["name"])
        if num_gpu == 1:
            jobs.append(
                TraceJob(
                    id=job_id,
                    submit_s=created,
                    duration_s=duration,
                    queue=queue,
                    workers=1,
                    gpu_milli=Milli(min(milli, 1000)),
                    gpu_type=GpuModel(spec) if spec else None,
                )
            )
        else:
            jobs.append(
                TraceJob(
                    id=job_id,
                    submit_s=created,
                    duration_s=duration,
                    queue=queue,
                    workers=num_gpu,
                    gpu_milli=Milli(1000),
                    gpu_type=GpuModel(spec) if spec else None,
                    pod_workers=num_gpu,
                    same_node=True,
                )
            )
    return _finish(jobs, time_scale, limit)


def _flag(text: str) -> bool:
    t = text.strip().lower()
    if t in ("", "0", "false", "no", "n"):
        return False
    if t in ("1", "true", "yes", "y"):
        return True
    raise ValueError(f"not a boolean: {text!r}")


def load_generic(path: str | Path, *, time_scale: float = 1.0, limit: int | None = None) -> list[TraceJob]:
    """Jobs of a generic CSV trace (see module docstring)."""
    p = Path(path)
    header, rows = _rows(p, GENERIC_REQUIRED)
    jobs: list[TraceJob] = []
    for n, row in rows:
        try:
            per = float(row["gpus_per_worker"])
            workers = int(row["workers"])
            gpu_type = (row.get("gpu_type") or "").strip() if "gpu_type" in header else ""
            milli: Milli | None = None
            whole = 1
            if per < 1:
                milli = Milli(round(per * 1000))
                if not 0 < milli < 1000:
                    raise ValueError(f"gpus_per_worker {per} rounds to {milli} milli")
            else:
                if per != int(per):
                    raise ValueError(f"gpus_per_worker {per} must be whole when >= 1")
                whole = int(per)
            job = TraceJob(
                id=JobId((row.get("job_id") or "").strip() or f"job-{n - 1:06d}"),
                submit_s=float(row["submit_time_s"]),
                duration_s=max(1.0, float(row["duration_s"])),
                queue=QueueName(row["queue"].strip()),
                workers=workers,
                gpus_per_worker=whole,
                gpu_milli=milli,
                gpu_type=GpuModel(gpu_type) if gpu_type else None,
                priority=int(row.get("priority") or 0),
                preemptible=_flag(row.get("preemptible") or ""),
                time_limit_s=_time_limit(row.get("time_limit_s") or ""),
            )
            job.to_job()  # validates the shape
        except ValueError as e:
            raise TraceError(f"{p}:{n}: {e}") from e
        if not job.queue:
            raise TraceError(f"{p}:{n}: queue is empty")
        jobs.append(job)
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise TraceError(f"{p}: job_id values repeat")
    return _finish(jobs, time_scale, limit)


def _time_limit(text: str) -> float | None:
    """A `time_limit_s` cell: empty for none, else seconds > 0."""
    if not text.strip():
        return None
    limit = float(text)
    if not limit > 0:
        raise ValueError(f"time_limit_s {text!r} must be > 0")
    return limit


def detect_format(path: str | Path) -> str:
    """`philly`, `alibaba` or `generic`, from the CSV header."""
    p = Path(path)
    with p.open(newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), [])
    if all(c in header for c in PHILLY_HEADER):
        return "philly"
    if all(c in header for c in ALIBABA_HEADER):
        return "alibaba"
    if all(c in header for c in GENERIC_REQUIRED):
        return "generic"
    raise TraceError(f"{p}: not a Philly, Alibaba or generic trace (header: {', '.join(header)})")


def load_trace(
    path: str | Path, *, fmt: str = "auto", time_scale: float = 1.0, limit: int | None = None
) -> list[TraceJob]:
    """Load a trace in format `fmt` (`auto` reads the header)."""
    kind = detect_format(path) if fmt == "auto" else fmt
    loaders = {"philly": load_philly, "alibaba": load_alibaba, "generic": load_generic}
    if kind not in loaders:
        raise TraceError(f"unknown trace format {kind!r}; known: {', '.join(sorted(loaders))}")
    return loaders[kind](path, time_scale=time_scale, limit=limit)
