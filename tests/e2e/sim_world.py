"""One small world fed both to the services' simulator and to the live services (test_sim_matches_live).

Five 8-GPU H100 nodes; three queues in cohort ``lab`` (team-a 8, team-b 16, team-c 8 GPUs nominal,
borrowing allowed: 32 GPUs of quota, so one node is slack) and the unlimited queue ``default``; a slice
of a trace with gangs. What it goes
through, one input at a time:

1. c-1 (team-c, 1x8) and the gang b-1 (team-b, 2x8) are placed within their quotas.
2. The node of b-1's rank 1 goes silent: node_health declares it failed, b-1 is released and
   requeued, quota queues it again and placement places it on two healthy nodes.
3. b-2 (team-b, 1x8) borrows team-a's idle quota: every healthy GPU is taken.
4. a-1 (team-a, 1x8) is owed its nominal quota: the quota service reclaims it from team-b's borrowing
   (victim b-2), preemption has b-2 checkpoint, a-1 is placed; b-2 waits on quota.
5. c-2 (team-c, 1x8, priority 10) is over team-c's quota with nothing to borrow: a priority preemption
   within the queue stops c-1, and c-2 is placed; c-1 waits on quota.
6. u-1 (the unlimited queue ``default``, a 2x8 gang) skips quota and waits for placement: no healthy
   GPU is free, and nothing running has a lower priority.

Why the node fails while nothing waits on quota: node_health writes the release (allocations.log) and
the requeue (jobs.events) in one transaction, and the live quota service handles a batch partition by
partition in the order the consumer returned them. Had another job of the queue been waiting, whether
it or the requeued job got the freed quota would depend on that order (live, not only here).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.core.model import JobId, QueueName
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import JobPending
from gangline.sim.trace import TraceJob
from services.common.queues import Queues, QueuesFile, queues_of
from services.tools.simulate import NodeOptions, ServiceOptions, ServiceSimulation, request_of

QUEUES_YAML = """
cohorts:
  - name: lab
queues:
  - {name: default, unlimited: true}
  - {name: team-a, cohort: lab, quotas: {H100-SXM5-80GB: {nominal: 8}}}
  - {name: team-b, cohort: lab, quotas: {H100-SXM5-80GB: {nominal: 16}}}
  - {name: team-c, cohort: lab, quotas: {H100-SXM5-80GB: {nominal: 8}}}
"""

CLUSTER = ClusterSpec(
    name="world",
    groups=(
        NodeGroup(
            name="n", count=5, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="leaf-a"
        ),
    ),
)

DAY = 86_400.0


def _job(job_id: str, submit_s: float, queue: str, workers: int, **more: Any) -> TraceJob:
    return TraceJob(
        id=JobId(job_id),
        submit_s=submit_s,
        duration_s=DAY,
        queue=QueueName(queue),
        workers=workers,
        gpus_per_worker=8,
        **more,
    )


TRACE_SLICE: tuple[TraceJob, ...] = (
    _job("c-1", 5, "team-c", 1, preemptible=True),
    _job("b-1", 10, "team-b", 2, preemptible=True),
    _job("b-2", 20, "team-b", 1, preemptible=True),
    _job("a-1", 25, "team-a", 1),
    _job("c-2", 35, "team-c", 1, priority=10),
    _job("u-1", 40, "default", 2),
)
FAIL_AT = 12.0
"""When the node holding rank 1 of the gang b-1 goes silent."""
HEARTBEAT_S = 1.0
SILENCE_S = 4.0
"""node_health's silence limit, in both runs."""
END = 50.0


def queues() -> Queues:
    return queues_of(QueuesFile.model_validate(yaml.safe_load(QUEUES_YAML)))


def new_simulation() -> ServiceSimulation:
    """The services' simulator set up as the live run is (fake-nodes rerun a resumed job whole)."""
    return ServiceSimulation(
        nodes=CLUSTER.registrations(),
        queues=queues(),
        cluster_name=CLUSTER.name,
        options=ServiceOptions(silence_s=SILENCE_S),
        node_options=NodeOptions(heartbeat_s=HEARTBEAT_S, resume_from_checkpoint=False),
        heartbeats="always",
    )


def simulate_world(sim: ServiceSimulation | None = None) -> ServiceSimulation:
    """The world through the simulator, to its end."""
    sim = sim or new_simulation()
    sim.register_nodes(0.0)
    for job in TRACE_SLICE:
        sim.request(job.submit_s, request_of(job))
    sim.run(until=FAIL_AT - 0.5)
    sim.fail_node(FAIL_AT, failing_node(sim.envelopes()))
    sim.run(until=END)
    return sim


def failing_node(envelopes: Iterable[Envelope]) -> str:
    """The node of rank 1 of b-1's first grant."""
    for e in envelopes:
        if isinstance(e.data, AllocationGranted) and e.data.job_id == "b-1":
            return e.data.placements[1].node
    raise LookupError("b-1 was never granted")


Grant = tuple[str, str, tuple[tuple[int, str, tuple[str, ...]], ...]]


@dataclass(frozen=True)
class Outcome:
    """What must be the same in the simulated and the live run."""

    grants: tuple[Grant, ...]
    """(job, allocation, ((rank, node, GPUs), ...)), sorted."""
    releases: tuple[tuple[str, str], ...]
    """(allocation, reason), sorted."""
    pending: dict[str, tuple[tuple[str, tuple[str, ...]], ...]]
    """Per job: the pending reasons' (source, codes) in the order sent, each change once."""


def outcome(envelopes: Iterable[Envelope]) -> Outcome:
    grants: list[Grant] = []
    releases: list[tuple[str, str]] = []
    pending: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for e in envelopes:
        data = e.data
        if isinstance(data, AllocationGranted):
            grants.append(
                (
                    data.job_id,
                    data.allocation_id,
                    tuple(
                        (p.rank, p.node, tuple(p.gpus)) for p in sorted(data.placements, key=lambda p: p.rank)
                    ),
                )
            )
        elif isinstance(data, AllocationReleased):
            releases.append((data.allocation_id, data.reason))
        elif isinstance(data, JobPending):
            seen = pending.setdefault(data.job_id, [])
            item = (e.source, tuple(r.code for r in data.reasons))
            if not seen or seen[-1] != item:
                seen.append(item)
    return Outcome(
        tuple(sorted(grants)),
        tuple(sorted(releases)),
        {job: tuple(items) for job, items in sorted(pending.items())},
    )
