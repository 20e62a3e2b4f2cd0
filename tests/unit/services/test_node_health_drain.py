"""node_health sends a drained node's work away once the drain's grace has passed; a cordon asks nothing."""

from __future__ import annotations

from datetime import timedelta

from svc_helpers import T0, admitted, env
from test_node_health import beat, grant, new_state

from gangline.events.allocations import AllocationReleased
from gangline.events.jobs import JobPreempting
from gangline.events.nodes import NodeCordoned, NodeUncordoned
from gangline.events.types import AllocationId, JobId, NodeId


def asked(out: list[tuple[str, object]]) -> list[JobPreempting]:
    return [e.data for _, e in out if isinstance(e.data, JobPreempting)]  # type: ignore[attr-defined]


def test_the_work_of_a_drained_node_is_asked_to_checkpoint_after_the_grace_once() -> None:
    state = new_state()
    state.silence = timedelta(days=1)  # only a-0 beats here; the others are not to be declared silent
    state.restore(admitted("g", workers=2, checkpoint_grace_s=45))
    state.restore(admitted("elsewhere"))
    state.restore(env(grant("g", "a-0", "a-1")))
    state.restore(env(grant("elsewhere", "a-2")))
    drain = NodeCordoned(node=NodeId("a-1"), mode="drain", drain_grace_s=30, reason="firmware")
    assert decide_at(state, env(drain, at=10), 10) == []  # running work may still run 30 s
    assert asked(decide_at(state, beat("a-0", 1, 39), 39)) == []
    out = decide_at(state, beat("a-0", 2, 40), 40)
    [ask] = asked(out)
    assert (ask.job_id, ask.allocation_id, ask.preemptor_job_id) == ("g", "g.1", None)
    assert ask.deadline == T0 + timedelta(seconds=40 + 45)  # the job's own checkpoint grace
    assert "a-1" in ask.reason and "firmware" in ask.reason
    assert [topic for topic, _ in out] == [state.topics.events]
    assert asked(decide_at(state, beat("a-0", 3, 41), 41)) == []  # asked once
    # Preemption releases it and placement puts it elsewhere; nothing more is asked for it.
    released = AllocationReleased(job_id=JobId("g"), allocation_id=AllocationId("g.1"), reason="preempted")
    assert asked(decide_at(state, env(released, at=50), 50)) == []


def test_a_plain_cordon_and_an_uncordoned_drain_ask_nothing() -> None:
    state = new_state()
    state.silence = timedelta(days=1)
    state.restore(admitted("g"))
    state.restore(env(grant("g", "a-0")))
    decide_at(state, env(NodeCordoned(node=NodeId("a-0")), at=1), 1)
    assert asked(decide_at(state, beat("a-1", 1, 3600), 3600)) == []
    decide_at(state, env(NodeCordoned(node=NodeId("a-0"), mode="drain", drain_grace_s=60), at=3601), 3601)
    decide_at(state, env(NodeUncordoned(node=NodeId("a-0")), at=3602), 3602)
    assert asked(decide_at(state, beat("a-1", 2, 9000), 9000)) == []


def decide_at(state, envelope, at: float):  # type: ignore[no-untyped-def]
    from services.node_health.handlers import decide

    return decide(envelope, state, now=T0 + timedelta(seconds=at))
