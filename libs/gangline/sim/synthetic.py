"""A synthetic generic-CSV trace whose sizes and durations are not Philly's (a held-out workload).

Philly is mostly one-GPU jobs (about 80%) with a heavy-tailed run time; a rule tuned on it may only
help that mix. This trace turns both around, seeded and reproducible:

* **sizes**: gang-heavy. 1x1 25%, 1x2 15%, 1x4 15%, 1x8 20%, 2x8 15%, 4x8 10% (workers x GPUs).
* **run times**: log-normal, median ``median_s`` (1 h), sigma 1.0, cut to [60 s, 3 days]; the same
  for every size (Philly's big jobs run longer).
* **arrivals**: Poisson, with a day/night swing (the rate times 1 + 0.5 sin(2 pi t / 1 day)), at a
  mean offered load of ``load`` of the cluster's GPUs.
* **queues**: four teams with 40/30/20/10% of the jobs; team ``a`` asks for the big gangs twice as
  often as the others (a heavy user, like Philly's biggest VCs).

``python -m gangline.sim.synthetic --out FILE`` writes it (``--jobs``, ``--gpus``, ``--load``,
``--seed``); ``gangline simulate --trace FILE --format generic`` reads it. Pure but for the writing.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

SHAPES: tuple[tuple[int, int, float], ...] = (
    (1, 1, 0.25),
    (1, 2, 0.15),
    (1, 4, 0.15),
    (1, 8, 0.20),
    (2, 8, 0.15),
    (4, 8, 0.10),
)
"""(workers, GPUs per worker, share of jobs)."""

TEAMS: tuple[tuple[str, float], ...] = (("a", 0.4), ("b", 0.3), ("c", 0.2), ("d", 0.1))
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class SyntheticJob:
    job_id: str
    submit_time_s: float
    duration_s: float
    queue: str
    workers: int
    gpus_per_worker: int


def _shape(rng: random.Random, heavy: bool) -> tuple[int, int]:
    weights = [w * (2.0 if heavy and workers > 1 else 1.0) for workers, _, w in SHAPES]
    workers, per, _ = rng.choices(SHAPES, weights=weights)[0]
    return workers, per


def synthetic_jobs(
    rng: random.Random, *, jobs: int, gpus: int, load: float = 0.9, median_s: float = 3600.0
) -> list[SyntheticJob]:
    """``jobs`` jobs offering ``load`` of ``gpus`` GPUs on average (see the module docstring)."""
    mean_gpus = sum(w * g * s for w, g, s in SHAPES)
    mean_run = median_s * math.exp(0.5)  # log-normal, sigma 1
    rate = load * gpus / (mean_gpus * mean_run)  # arrivals per second
    out: list[SyntheticJob] = []
    t = 0.0
    names = [n for n, _ in TEAMS]
    shares = [s for _, s in TEAMS]
    while len(out) < jobs:
        # Thinning: candidates at 1.5x the rate, kept with the day/night swing's probability.
        t += rng.expovariate(1.5 * rate)
        if rng.random() > (1.0 + 0.5 * math.sin(2 * math.pi * t / DAY_S)) / 1.5:
            continue
        team = rng.choices(names, weights=shares)[0]
        workers, per = _shape(rng, heavy=team == "a")
        run = min(3 * DAY_S, max(60.0, rng.lognormvariate(math.log(median_s), 1.0)))
        out.append(SyntheticJob(f"syn-{len(out):05d}", round(t), round(run), team, workers, per))
    return out


def write_csv(path: Path, rows: list[SyntheticJob]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["job_id", "submit_time_s", "duration_s", "queue", "workers", "gpus_per_worker"])
        for j in rows:
            w.writerow(
                [j.job_id, int(j.submit_time_s), int(j.duration_s), j.queue, j.workers, j.gpus_per_worker]
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gangline.sim.synthetic", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--gpus", type=int, default=128, help="the cluster's GPUs the load is offered to")
    p.add_argument("--load", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=15)
    args = p.parse_args(argv)
    write_csv(
        args.out, synthetic_jobs(random.Random(args.seed), jobs=args.jobs, gpus=args.gpus, load=args.load)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
