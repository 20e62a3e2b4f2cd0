"""What-if: the recorded history re-run under another profile, compared per queue (pure).

The workload comes from the log itself: each `job.requested` arrives when it was recorded, and
runs as long as its recorded allocation did (granted → released), or its `duration_hint_s` when
it never ran. The cluster is the registered nodes. Both the recorded policy and the other one run
in the simulator on the same workload and the same queues, so the comparison is like for like.

Queues come from a queues file (`gangline.queues_file`, the one the services read): its limited
queues with their quotas and cohorts, and its unlimited queues (and any queue the log names that
the file does not) with no limit. Without a file every queue is unlimited. Each profile runs as
`gangline simulate` runs it (`gangline.sim.gated`): the quota gate, charging a job when it lets it
through, then placement's cycle, as the services decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gangline.core.defaults import default_profile
from gangline.core.framework.profile import Profile
from gangline.core.model import Node
from gangline.events.jobs import JobRequested
from gangline.fold.adapter import core_job
from gangline.queues_file import QueuesFile, queues_of
from gangline.replay.decide import GRANTED, REGISTERED, RELEASED, REQUESTED, node_from_registration
from gangline.replay.log import LogRecord
from gangline.sim.gated import GatedPolicy
from gangline.sim.metrics import summarize
from gangline.sim.simulator import SimOptions, Simulator
from gangline.sim.trace import TraceJob


def _time(r: LogRecord) -> float:
    t = r.envelope.get("time")
    if not isinstance(t, str):
        raise ValueError(f"record {r.where} has no time")
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()


def workload_from_log(records: Sequence[LogRecord]) -> tuple[list[Node], list[TraceJob]]:
    """The registered nodes and the requested jobs with their recorded run times."""
    nodes: dict[str, Node] = {}
    requested: dict[str, tuple[float, JobRequested]] = {}
    granted: dict[str, float] = {}
    ran: dict[str, float] = {}
    for r in records:
        data = r.envelope.get("data")
        if not isinstance(data, dict):
            continue
        if r.type == REGISTERED:
            n = node_from_registration(data)
            nodes[n.id] = n
        elif r.type == REQUESTED and data.get("job_id") not in requested:
            try:
                requested[data["job_id"]] = (_time(r), JobRequested.model_validate(data))
            except ValueError:
                continue  # a request admission rejected (workers 0, no queue, ...): it never ran
        elif r.type == GRANTED:
            granted[data["job_id"]] = _time(r)
        elif r.type == RELEASED and data["job_id"] in granted:
            ran[data["job_id"]] = ran.get(data["job_id"], 0.0) + _time(r) - granted.pop(data["job_id"])
    if not requested:
        return list(nodes.values()), []
    t0 = min(t for t, _ in requested.values())
    jobs: list[TraceJob] = []
    for jid, (t, request) in sorted(requested.items(), key=lambda kv: (kv[1][0], kv[0])):
        job = core_job(request.job_id, request)
        duration = ran.get(jid) or (float(job.duration_hint_s) if job.duration_hint_s is not None else 1.0)
        jobs.append(
            TraceJob(
                id=job.id,
                submit_s=t - t0,
                duration_s=max(1.0, duration),
                queue=job.queue,
                workers=job.workers,
                gpus_per_worker=job.gpus_per_worker,
                gpu_milli=job.gpu_milli,
                gpu_type=job.gpu_type,
                priority=job.priority,
                preemptible=job.preemptible,
                time_limit_s=job.time_limit_s,
                min_workers=job.min_workers,
            )
        )
    return list(nodes.values()), jobs


def what_if(
    records: Sequence[LogRecord],
    other: Profile,
    recorded: Profile | None = None,
    *,
    queues: QueuesFile | None = None,
) -> tuple[dict[str, object], dict[str, object]]:
    """Report entries (see `gangline.sim.metrics.summarize`) of the recorded policy and of `other`,
    both under the queues of `queues` (a queues file's document; None: every queue unlimited)."""
    nodes, jobs = workload_from_log(records)
    if not nodes or not jobs:
        raise ValueError("the log has no registered nodes or no requested jobs")
    gpus = float(sum(len(n.gpus) for n in nodes))
    gate = queues_of(queues) if queues is not None else None
    out: list[dict[str, object]] = []
    base = recorded or default_profile()
    for name, prof in ((f"recorded ({base.name})", base), (other.name, other)):
        policy = GatedPolicy(name, prof, nodes, gate)
        out.append(summarize(Simulator(jobs, policy, gpus, SimOptions()).run()))
    return out[0], out[1]
