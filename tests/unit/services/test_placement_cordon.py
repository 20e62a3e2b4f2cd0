"""Placement honours operators' cordons: no new grant on a cordoned or draining node; back after uncordon."""

from __future__ import annotations

from svc_helpers import admitted, env
from test_placement import feed, grants, new_state

from gangline.events.allocations import AllocationGranted
from gangline.events.jobs import JobPending
from gangline.events.nodes import NodeCordoned, NodeUncordoned
from gangline.events.types import NodeId


def test_no_new_grant_lands_on_a_cordoned_node_and_running_work_stays() -> None:
    state = new_state(("a", 2, 8))
    [first] = grants(feed(state, admitted("j1", gpus_per_worker=8)))
    busy = first.placements[0].node
    other = NodeId("a-1" if busy == "a-0" else "a-0")
    assert feed(state, env(NodeCordoned(node=other, reason="bios update"))) == []  # nothing is released
    out = feed(state, admitted("j2", gpus_per_worker=8))
    assert grants(out) == []
    [pending] = [e.data for e in out if isinstance(e.data, JobPending)]
    assert any(r.code == "health" for r in pending.reasons), pending.reasons
    # A drain keeps new work off as well.
    feed(state, env(NodeCordoned(node=other, mode="drain", drain_grace_s=60)))
    assert grants(feed(state, admitted("j3", gpus_per_worker=1))) == []
    assert state.jobs[first.job_id].live() == first  # the running job is left alone by placement
    after = feed(state, env(NodeUncordoned(node=other)))
    placed = [g for g in grants(after) if isinstance(g, AllocationGranted)]
    assert {g.job_id for g in placed} == {"j2"} and placed[0].placements[0].node == other
