"""The snapshot's per-queue sums of what running jobs hold (``Snapshot.queue_held``), kept as jobs start and
end, against a fresh walk over the running jobs: through cycles, releases and rolled-back transactions."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_core_properties import _fields, clusters, job_lists

from gangline.core.actions.queueing import held_request, open_context
from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import apply_plan, run_cycle
from gangline.core.model import Job, JobId, Node, QueueName
from gangline.core.queues import Resource
from gangline.core.snapshot import Snapshot

PROFILE = default_profile()
QUEUES = [QueueName("a"), QueueName("b"), QueueName("c")]


def walked(snap: Snapshot) -> dict[QueueName, dict[Resource, int]]:
    held: dict[QueueName, dict[Resource, int]] = {}
    for r in snap.running.values():
        vec = held.setdefault(r.job.queue, {})
        for resource, n in held_request(snap, r).items():
            vec[resource] = vec.get(resource, 0) + n
    return held


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=clusters(),
    waves=st.lists(job_lists("w"), min_size=1, max_size=4),
    queues=st.lists(st.sampled_from(QUEUES), min_size=12, max_size=12),
    releases=st.lists(st.integers(0, 50), max_size=8),
)
def test_queue_held_is_what_the_running_jobs_hold(
    nodes: list[Node], waves: list[list[Job]], queues: list[QueueName], releases: list[int]
) -> None:
    snap = Snapshot.build(nodes)
    for c, wave in enumerate(waves):
        wave = [
            Job(**{**_fields(j), "id": JobId(f"c{c}-{j.id}"), "queue": queues[k % len(queues)]})
            for k, j in enumerate(wave)
        ]
        before = walked(snap)
        with snap.transaction():
            for r in list(snap.running.values())[:2]:
                snap.release(r.job.id)  # a what-if release, undone with the transaction
            assert snap.queue_held == walked(snap)
        assert snap.queue_held == before
        plan = run_cycle(snap, wave, PROFILE, cycle=c)  # places in a transaction of its own, undone
        assert snap.queue_held == before == walked(snap)
        assert apply_plan(snap, plan) == []
        assert snap.queue_held == walked(snap)
        running = sorted(snap.running)
        for r in releases[: len(running)]:
            if running:
                snap.release(running.pop(r % len(running)))
        assert snap.queue_held == walked(snap)
        assert snap.check_invariants() == []
        # A cycle's ledger charges each queue what its running jobs hold, and nothing for idle queues.
        ctx = open_context(snap, wave, now=0.0)
        for queue in {j.queue for j in wave} | set(walked(snap)):
            assert ctx.ledger.usage_vector(queue) == walked(snap).get(queue, {}), queue
