"""One simulation campaign: a trace and a cluster, several policies side by side (pure + files).

`run_campaign` builds the cluster once per policy (each policy owns its snapshot), runs the
baselines and every given profile on the same jobs, and returns one `RunResult` each. The cluster
is a cluster spec (`gangline.cluster_spec`); the queues, when given, a queues file's document
(`gangline.queues_file`, the one the services read): its limited queues with their quotas and
cohorts, and every queue of the trace it does not limit with no limit, as what-if runs them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from gangline.cluster_spec import ClusterSpec
from gangline.core.charging import DEFAULT_HALF_LIFE_S
from gangline.core.defaults import placement_registry
from gangline.core.framework.profile import Profile, load_profile_file
from gangline.core.framework.registry import Registry
from gangline.core.model import JobId, Node, QueueName
from gangline.core.queues import QueueSpec, QuotaTree
from gangline.queues_file import QueuesFile, queues_of, quota_specs
from gangline.sim.gated import GatedPolicy
from gangline.sim.metrics import RunResult
from gangline.sim.policies import (
    BASELINES,
    DEFAULT_TIME_LIMIT_S,
    Policy,
    QueueSetup,
    charged_resources,
    make_policy,
    unlimited_tree,
)
from gangline.sim.simulator import Progress, SimOptions, Simulator
from gangline.sim.trace import TraceJob


def load_profiles(paths: Sequence[str | Path], registry: Registry | None = None) -> list[Profile]:
    """Profiles from YAML files; names must differ (they label the report's rows)."""
    reg = registry or placement_registry()
    out = [load_profile_file(p, reg) for p in paths]
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise ValueError(f"profile names repeat: {names}")
    return out


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """A policy to run: a baseline name, or a profile (whose name labels the run)."""

    name: str
    profile: Profile | None = None


def entitlement_weights(queues: Iterable[QueueSpec], jobs: Sequence[TraceJob]) -> dict[QueueName, float]:
    """Jain's entitlement weight per queue: its nominal GPUs (at least 1), or equal without quotas."""
    quota = {q.name: float(sum(r.nominal for r in q.quotas.values())) for q in queues}
    if not any(quota.values()):
        return {}
    return {q: max(1.0, quota.get(q, 0.0)) for q in {j.queue for j in jobs}}


def queue_setup(
    queues: QueuesFile, spec: ClusterSpec, nodes: Sequence[Node], jobs: Sequence[TraceJob]
) -> QueueSetup:
    """The core policy's queues: `queues`' quota tree, with each queue of `jobs` it does not limit
    free of any limit; fair shares against the cluster's capacity per resource."""
    specs, cohorts = quota_specs(queues)
    tree: QuotaTree = unlimited_tree(
        {j.queue for j in jobs},
        charged_resources([j.to_job() for j in jobs], nodes),
        specs=specs,
        cohorts=cohorts,
    )
    capacity = spec.resources()
    for res in tree.resources:
        capacity.setdefault(res, tree.total_nominal(res))
    return QueueSetup(tree, capacity)


class StderrProgress:
    """A one-line progress bar on stderr, redrawn at most every `every_s` wall seconds."""

    def __init__(self, label: str, stream: TextIO | None = None, every_s: float = 0.5) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._last = 0.0
        self._t0 = time.perf_counter()

    def __call__(self, done: int, total: int, virtual_s: float) -> None:
        now = time.perf_counter()
        if done < total and now - self._last < self.every_s:
            return
        self._last = now
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        self.stream.write(
            f"\r{self.label:<22} [{bar:<30}] {frac:6.1%} {done}/{total} jobs "
            f"day {virtual_s / 86400:6.1f} {now - self._t0:6.1f}s"
        )
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def run_campaign(
    jobs: Sequence[TraceJob],
    spec: ClusterSpec,
    runs: Sequence[PolicyRun],
    *,
    queues: QueuesFile | None = None,
    options: SimOptions | None = None,
    progress: bool = False,
    registry: Registry | None = None,
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
) -> list[RunResult]:
    """Run each policy over the same jobs on fresh copies of the cluster.

    `queues`: the queues file's document the profiles run under (None: no quotas, like a baseline).
    Profiles run as the services decide (`gangline.sim.gated`: the quota gate, charging at let-through,
    then placement), with fair share's usage half-life `half_life_s`.
    `default_time_limit_s`: `easy-backfill`'s time limit for jobs whose trace gives none.
    """
    opts = options or SimOptions()
    if not opts.entitlement:
        opts = replace(opts, entitlement=entitlement_weights(quota_specs(queues)[0] if queues else (), jobs))
    pod_workers = {JobId(j.id): j.pod_workers for j in jobs if j.pod_workers != 1}
    time_limits = {JobId(j.id): j.time_limit_s for j in jobs if j.time_limit_s is not None}
    results: list[RunResult] = []
    gate = queues_of(queues) if queues is not None else None
    for run in runs:
        nodes = spec.build_nodes()
        policy: Policy
        if run.profile is not None:
            # Gangline's profiles: the quota gate, then placement, as the services decide.
            policy = GatedPolicy(run.name, run.profile, nodes, gate, half_life_s=half_life_s)
        else:
            policy = make_policy(
                run.name,
                nodes,
                pod_workers=pod_workers,
                registry=registry or placement_registry(),
                time_limits=time_limits,
                default_time_limit_s=default_time_limit_s,
            )
        bar: Progress | None = StderrProgress(run.name) if progress else None
        results.append(Simulator(jobs, policy, float(spec.total_gpus), opts, bar).run())
    return results


def default_runs(profiles: Sequence[Profile], baselines: Sequence[str] = BASELINES) -> list[PolicyRun]:
    """Baselines first, then each profile."""
    return [PolicyRun(b) for b in baselines] + [PolicyRun(p.name, p) for p in profiles]
