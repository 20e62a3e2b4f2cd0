"""The run facts of a placement cycle (when each running job started), worked out only for the jobs the
cycle asks about, agree with the fold: each running job's grant time, as the snapshot stood when the cycle
began."""

from __future__ import annotations

from datetime import timedelta

from svc_helpers import T0, admitted, cluster, env

from gangline.core.actions.queueing import RunFacts
from gangline.core.model import JobId as CoreJobId
from services.placement.handlers import PlacementState, decide


def test_each_running_job_started_when_it_was_granted() -> None:
    state = PlacementState(gated=False)
    for registration in cluster(("n", 2, 8)).registrations():
        state.fold(env(registration))
    for k in range(6):
        for _, output in decide(admitted(f"j{k}"), state, now=T0 + timedelta(seconds=k)):
            state.fold(output)
    snap = state.snapshot()
    assert len(snap.running) == 6
    facts = state.queue_context(snap, [], now=T0 + timedelta(seconds=60)).run_facts
    expected = {}
    for job_id in snap.running:
        record = state.jobs[job_id]  # type: ignore[index]
        live = record.live()
        assert live is not None
        expected[job_id] = RunFacts(started_at=record.granted_at[live.allocation_id].timestamp())
    assert expected[CoreJobId("j3")].started_at == (T0 + timedelta(seconds=3)).timestamp()
    assert {job_id: facts.get(job_id) for job_id in snap.running} == expected
    assert dict(facts) == expected and len(facts) == 6
    assert facts.get(CoreJobId("nobody")) is None
    # A what-if release inside the cycle's transaction: the job still started when it did.
    with snap.transaction():
        snap.release(CoreJobId("j2"))
        assert facts.get(CoreJobId("j2")) == expected[CoreJobId("j2")]
    # Asked again next cycle: the same facts, from the kept ones.
    again = state.queue_context(snap, [], now=T0 + timedelta(seconds=61)).run_facts
    assert dict(again) == expected
