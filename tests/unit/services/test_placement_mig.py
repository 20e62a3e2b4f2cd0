"""Placement with MIG nodes registered from NVML (stand-in) inventories: real model names, carved
instances named by NVML's ids in the grants, and a node the core cannot model refused without
stopping anyone else."""

from __future__ import annotations

from svc_helpers import T0, admitted, cluster, env, standin_registration

from gangline.core.defaults import default_profile
from gangline.events.allocations import AllocationGranted
from gangline.events.base import Envelope
from gangline.events.nodes import NodeRejected
from services.common.topics import TopicNames
from services.placement.handlers import (
    UNSUPPORTED_HARDWARE,
    PlacementState,
    decide,
    fold_event,
    refused_registration,
)

TOPICS = TopicNames()


def new_state() -> PlacementState:
    state = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    for node in cluster(("h", 2, 8)).registrations():
        state.restore(env(node))
    state.needs_cycle = False
    return state


def feed(state: PlacementState, envelope: Envelope) -> list[tuple[str, Envelope]]:
    outputs = decide(envelope, state, now=T0)
    for _, out in outputs:
        state.fold(out)  # our own outputs come back from the log
    return outputs


def grants(outputs: list[tuple[str, Envelope]]) -> list[AllocationGranted]:
    return [e.data for _, e in outputs if isinstance(e.data, AllocationGranted)]


def test_a_1g_job_is_granted_the_carved_instance_by_its_nvml_ids() -> None:
    state = new_state()
    mig_node = standin_registration("dgx-a100-mig", "mig-0")
    assert {g.model for g in mig_node.gpus} == {"A100-SXM4-80GB"}  # as NVML names it, not the table
    assert feed(state, env(mig_node)) == []
    [grant] = grants(feed(state, admitted("m1", workers=2, mig_profile="1g.10gb", gpus_per_worker=0)))
    instances = {
        (g.id, m.instance_id): m
        for g in mig_node.gpus
        for m in g.mig_instances
        if m.placement_start is not None
    }
    for p in grant.placements:
        assert p.node == "mig-0" and p.mig is not None
        carved = instances[(p.mig.gpu, p.mig.instance_id)]
        # the GPU-instance id the node registered for the instance at that start, not the start itself
        assert (carved.profile, carved.placement_start, carved.compute_instance_id) == (
            p.mig.profile,
            p.mig.start,
            p.mig.compute_instance_id,
        )
    assert len({(p.mig.gpu, p.mig.instance_id) for p in grant.placements if p.mig}) == 2


def test_only_carved_profiles_are_handed_out() -> None:
    state = new_state()
    feed(state, env(standin_registration("dgx-a100-mig", "mig-0")))
    # gpu1 holds the only 3g.40gb (GPU instance 2, at slice 4); a second one waits
    [first] = grants(feed(state, admitted("big-1", mig_profile="3g.40gb", gpus_per_worker=0)))
    assert first.placements[0].mig is not None
    assert (first.placements[0].mig.gpu, first.placements[0].mig.instance_id) == ("gpu1", 2)
    assert first.placements[0].mig.start == 4
    assert grants(feed(state, admitted("big-2", mig_profile="3g.40gb", gpus_per_worker=0))) == []


def test_a_node_of_an_unknown_mig_model_is_rejected_and_the_others_keep_scheduling() -> None:
    state = new_state()
    a30 = env(standin_registration("pcie-a30-mig", "a30-0"))
    outputs = feed(state, a30)
    [(topic, rejection)] = outputs
    assert topic == TOPICS.health and isinstance(rejection.data, NodeRejected)
    assert rejection.data.node == "a30-0" and rejection.data.registration_id == a30.id
    assert rejection.data.code == UNSUPPORTED_HARDWARE
    assert "gpu0" in rejection.data.reason and "'A30'" in rejection.data.reason
    # the processor dead-letters the registration with the same reason
    assert refused_registration(a30, [(topic, rejection)]) == (UNSUPPORTED_HARDWARE, rejection.data.reason)
    assert refused_registration(a30, []) is None

    # whole GPUs on the other nodes, and the MIG node's slices, are granted as before
    [whole] = grants(feed(state, admitted("w", workers=2, gpus_per_worker=8)))
    assert {p.node for p in whole.placements} == {"h-0", "h-1"}
    feed(state, env(standin_registration("dgx-a100-mig", "mig-0")))
    [sliced] = grants(feed(state, admitted("s", mig_profile="1g.10gb", gpus_per_worker=0)))
    assert sliced.placements[0].node == "mig-0"
    # the A30's whole GPU (gpu1) takes nothing either: the node is out
    assert grants(feed(state, admitted("a30-whole", gpu_type="A30"))) == []


def test_a_rejection_is_sent_once_per_registration() -> None:
    state = new_state()
    a30 = env(standin_registration("pcie-a30-mig", "a30-0"))
    [(_, rejection)] = fold_event(a30, state, now=T0)
    assert fold_event(a30, state, now=T0) == []  # the same registration read again (a retry, a re-read)

    # a restart: the registration and our rejection are restored from the log, then read again live
    restarted = new_state()
    restarted.restore(a30)
    restarted.restore(rejection)
    assert fold_event(a30, restarted, now=T0) == []
    assert "a30-0" in restarted.refused and "a30-0" not in restarted.nodes


def test_a_node_that_re_registers_hardware_the_core_cannot_model_is_taken_out() -> None:
    state = new_state()
    h0 = next(n for n in state.nodes.values() if n.node == "h-0")
    odd = h0.model_copy(
        update={
            "gpus": tuple(g.model_copy(update={"model": "A30", "mig_enabled": True}) for g in h0.gpus),
        }
    )
    [(_, rejection)] = feed(state, env(odd, at=5))
    assert isinstance(rejection.data, NodeRejected) and rejection.data.node == "h-0"
    [grant] = grants(feed(state, admitted("g", gpus_per_worker=8)))
    assert {p.node for p in grant.placements} == {"h-1"}
    assert grants(feed(state, admitted("g2", gpus_per_worker=8))) == []  # h-0 is out, h-1 is full
    # repaired, it registers again and takes the waiting job
    [again] = grants(feed(state, env(h0, at=10)))
    assert again.job_id == "g2" and {p.node for p in again.placements} == {"h-0"}
    assert "h-0" not in state.refused
