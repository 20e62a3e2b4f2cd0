"""Quota charges a job only to a GPU model whose nodes can hold its workers (the core's hardware rule):
the node inventory and health are folded, a job no model's nodes can hold waits uncharged saying why,
and a change of inventory lets waiting jobs through."""

from __future__ import annotations

import math
import random
from typing import Any

from svc_helpers import T0, env
from test_quota import admit, feed, grant, queued_ids, quota, reason_of, release, usage

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.base import Envelope
from gangline.events.jobs import JobFailed, JobPending, JobQueued
from gangline.events.nodes import (
    GpuHealthChanged,
    HealthCause,
    HealthState,
    NodeCordoned,
    NodeFailed,
    NodeRegistered,
    NodeUncordoned,
)
from gangline.events.types import GpuId, JobId
from services.quota.handlers import QuotaState, _pending_item, decide

H100 = "H100-SXM5-80GB"
GB200 = "GB200-186GB"
TEAMS = {
    "cohorts": [{"name": "everyone"}],
    "queues": [
        {"name": "team-a", "cohort": "everyone", "quotas": {H100: {"nominal": 8}, GB200: {"nominal": 8}}},
        {"name": "team-b", "cohort": "everyone", "quotas": {H100: {"nominal": 8}, GB200: {"nominal": 8}}},
    ],
}


REPORT = {"queues": [{"name": "team-a", "quotas": {H100: {"nominal": 8}, GB200: {"nominal": 8}}}]}
"""The report's queue: team-a's own H100 and GB200 quotas, nothing to borrow."""


def nodes(name: str, model: str, count: int, gpus: int, *, memory_mib: int = 81920) -> list[NodeRegistered]:
    group = NodeGroup(
        name=name, count=count, gpu_model=model, gpus_per_node=gpus, memory_mib=memory_mib, leaf="leaf-a"
    )
    return ClusterSpec(groups=(group,)).registrations()


def cluster(state: QuotaState, registrations: list[NodeRegistered], *, at: float = 0.0) -> list[Envelope]:
    out: list[Envelope] = []
    for node in registrations:
        out += feed(state, env(node, at=at))
    return out


def report_cluster(doc: dict[str, Any] = TEAMS) -> QuotaState:
    """The report's cluster: 2 H100 nodes of 8 GPUs, 2 GB200 nodes of 4."""
    state = quota(doc)
    assert cluster(state, nodes("h", H100, 2, 8) + nodes("gb", GB200, 2, 4, memory_mib=190000)) == []
    return state


def test_a_one_by_eight_job_waits_for_h100_rather_than_being_charged_to_four_gpu_gb200_nodes() -> None:
    state = report_cluster(REPORT)
    [first] = feed(state, admit("h100-user", gpus_per_worker=8))
    assert isinstance(first.data, JobQueued) and first.data.gpu_type == H100
    assert feed(state, grant("h100-user")) == []

    [held] = feed(state, admit("big", gpus_per_worker=8))

    reason = reason_of(held)
    assert (reason.code, reason.constraint) == ("quota", "quota")
    assert reason.details["gpu_type"] == H100
    assert f"on {H100}: team-a uses 8 of its 8 {H100}" in reason.message
    assert f"{GB200} cannot hold it: a worker needs 8 {GB200} GPUs on one node" in reason.message
    assert "offers 4" in reason.message
    assert usage(state, "team-a", GB200) == 0  # not charged to hardware it can never run on

    # A job whose workers GB200 can hold still goes there while H100 is in use.
    [small] = feed(state, admit("small", gpus_per_worker=4))
    assert isinstance(small.data, JobQueued) and small.data.gpu_type == GB200

    through = feed(state, release("h100-user"))
    assert queued_ids(through) == ["big"]
    [queued] = [e.data for e in through if isinstance(e.data, JobQueued)]
    assert queued.gpu_type == H100 and usage(state, "team-a") == 8


def test_a_job_naming_a_model_no_node_can_hold_waits_uncharged_until_a_node_that_can_registers() -> None:
    state = report_cluster()

    [held] = feed(state, admit("wide", gpu_type=GB200, gpus_per_worker=8))

    assert isinstance(held.data, JobPending)
    reason = reason_of(held)
    assert (reason.code, reason.constraint) == ("gang_size", "hardware")
    assert reason.details["gpu_type"] == GB200 and reason.details["largest_node"] == 4
    assert reason.details["gpus_per_worker"] == 8 and reason.details["queue"] == "team-a"
    assert "the largest GB200-186GB node offers 4" in reason.message
    assert reason.unblock is not None and "registers" in reason.unblock
    assert usage(state, "team-a", GB200) == 0
    # What is read again changes nothing: the same registrations, the same reason.
    assert cluster(state, nodes("gb", GB200, 2, 4, memory_mib=190000), at=1) == []

    [queued] = cluster(state, nodes("gb8", GB200, 1, 8, memory_mib=190000), at=2)

    assert isinstance(queued.data, JobQueued) and queued.data.gpu_type == GB200
    assert usage(state, "team-a", GB200) == 8


def test_a_job_no_model_can_hold_says_why_for_each_and_is_not_failed() -> None:
    state = quota(TEAMS)
    cluster(state, nodes("h", H100, 1, 8) + nodes("gb", GB200, 2, 4, memory_mib=190000))

    [held] = feed(state, admit("two-by-eight", gpus_per_worker=8, workers=2))

    assert not isinstance(held.data, JobFailed)  # within the cohort's quota; nodes may still register
    reason = reason_of(held)
    assert reason.constraint == "hardware" and reason.code == "gang_size"
    assert reason.message.startswith(f"on {H100}: the gang needs 2 workers of 8 GPUs at once")
    assert f"on {GB200}: a worker needs 8" in reason.message


def test_a_failed_node_or_gpu_holds_nothing_until_it_is_back() -> None:
    state = quota(TEAMS)
    [h0, h1] = nodes("h", H100, 2, 8)
    cluster(state, [h0, h1])
    assert feed(state, env(NodeFailed(node=h1.node, code="heartbeat_timeout", reason="gone"), at=1)) == []
    broken = GpuHealthChanged(
        node=h0.node,
        gpu=GpuId("gpu3"),
        previous="healthy",
        state="failed",
        cause=HealthCause(kind="xid", message="XID 79", xid=79),
    )
    assert feed(state, env(broken, at=2)) == []

    [held] = feed(state, admit("eight", gpu_type=H100, gpus_per_worker=8, at=3))
    reason = reason_of(held)
    assert reason.constraint == "hardware" and reason.details["largest_node"] == 7
    [seven] = feed(state, admit("seven", gpu_type=H100, gpus_per_worker=7, at=3))
    assert isinstance(seven.data, JobQueued)

    # The failed node registers again (after its failure): it holds the waiting job.
    [queued] = cluster(state, [NodeRegistered.model_validate(h1.model_dump())], at=4)
    assert queued_ids([queued]) == ["eight"]


def test_a_recovered_gpu_lets_the_waiting_job_through() -> None:
    state = quota(TEAMS)
    [h0] = nodes("h", H100, 1, 8)
    cluster(state, [h0])
    cause = HealthCause(kind="ecc", message="uncorrectable")
    failed = GpuHealthChanged(
        node=h0.node, gpu=GpuId("gpu0"), previous="healthy", state="degraded", cause=cause
    )
    feed(state, env(failed, at=1))
    [held] = feed(state, admit("eight", gpus_per_worker=8, at=2))
    assert reason_of(held).constraint == "hardware"

    back = GpuHealthChanged(
        node=h0.node,
        gpu=GpuId("gpu0"),
        previous="degraded",
        state="healthy",
        cause=HealthCause(kind="recovered", message="ok"),
    )
    assert queued_ids(feed(state, env(back, at=3))) == ["eight"]


def test_a_restore_keeps_the_hardware_reason_it_sent_and_does_not_send_it_again() -> None:
    log: list[Envelope] = [env(n) for n in nodes("h", H100, 2, 8) + nodes("gb", GB200, 2, 4)]
    wide = admit("wide", gpu_type=GB200, gpus_per_worker=8)
    log.append(wide)
    restored = quota(TEAMS)
    live = quota(TEAMS)
    for e in log[:-1]:
        decide(e, live, now=T0)
    [pending] = [e for _, e in decide(wide, live, now=T0)]
    for e in [*log, pending]:
        restored.restore(e)

    # Another GB200 node of 4 changes what nodes exist, not what the job is told.
    more = nodes("gc", GB200, 1, 4, memory_mib=190000)
    assert [e for _, e in decide(env(more[0]), restored, now=T0)] == []
    assert restored.last_pending == live.last_pending


def test_without_any_node_registered_quota_charges_as_before() -> None:
    state = quota(TEAMS)

    [queued] = feed(state, admit("early", gpus_per_worker=8))

    # Nothing known yet (admission admits nothing before a node registers): the first flavour with room.
    assert isinstance(queued.data, JobQueued) and queued.data.gpu_type == H100


def test_no_reclaim_is_due_on_a_model_whose_nodes_cannot_hold_the_waiting_job() -> None:
    doc = {
        "cohorts": [{"name": "everyone"}],
        "queues": [
            {
                "name": "team-a",
                "cohort": "everyone",
                "quotas": {H100: {"nominal": 8, "borrowing_limit": 0}, GB200: {"nominal": 8}},
            },
            {"name": "team-b", "cohort": "everyone", "quotas": {GB200: {"nominal": 8}}},
        ],
    }
    state = quota(doc)
    cluster(state, nodes("h", H100, 1, 8) + nodes("gb", GB200, 4, 4, memory_mib=190000))
    [own] = feed(state, admit("h100-user", gpu_type=H100, gpus_per_worker=8))  # not preemptible
    assert isinstance(own.data, JobQueued)
    feed(state, grant("h100-user"))
    for k in range(2):  # team-b borrows team-a's idle GB200 with preemptible 2x4 gangs
        job = f"b{k}"
        [q] = feed(state, admit(job, queue="team-b", workers=2, gpus_per_worker=4, preemptible=True))
        assert isinstance(q.data, JobQueued) and q.data.gpu_type == GB200
        feed(state, grant(job))

    [held] = feed(state, admit("big", gpus_per_worker=8))

    reason = reason_of(held)
    assert reason.constraint == "quota" and "victims" not in reason.details
    assert reason.details["gpu_type"] == H100
    # The same job in 4-GPU workers is one GB200 can hold: it is owed GB200 quota lent to team-b there.
    [split] = feed(state, admit("split", workers=2, gpus_per_worker=4))
    planned = reason_of(split)
    assert planned.constraint == "reclaim" and planned.details["gpu_type"] == GB200


def test_the_inventory_is_the_same_whatever_the_interleaving_of_the_node_topics() -> None:
    """Registrations and health reports are on two topics: any merge of the two (each in its own
    order) leaves the same offers, and reading everything again changes nothing."""
    [h0, h1] = nodes("h", H100, 2, 8)
    cause = HealthCause(kind="xid", message="XID 79", xid=79)

    def health(
        node: NodeRegistered, gpu: str, previous: HealthState, now: HealthState, at: float
    ) -> Envelope:
        event = GpuHealthChanged(node=node.node, gpu=GpuId(gpu), previous=previous, state=now, cause=cause)
        return env(event, at=at)

    inventory = [env(h0, at=0), env(h1, at=0), env(h1, at=5)]  # h1 registers again after its failure
    reports = [
        health(h0, "gpu1", "healthy", "failed", 1),
        env(NodeFailed(node=h1.node, code="agent_reported", reason="lost"), at=2),
        health(h1, "gpu2", "healthy", "failed", 3),  # before h1's re-registration: reset by it
        health(h0, "gpu1", "failed", "degraded", 6),
    ]
    outcomes = set()
    for seed in range(8):
        rng = random.Random(seed)
        a, b = list(inventory), list(reports)
        merged = []
        while a or b:
            source = a if b == [] or (a and rng.random() < 0.5) else b
            merged.append(source.pop(0))
        state = quota(TEAMS)
        for e in merged:
            state.inventory.fold(e)
        offers = state.inventory.offers
        assert not any(state.inventory.fold(e) for e in merged)  # read again: no news
        outcomes.add(tuple(sorted((n, len(o.gpus)) for n, o in offers.items())))
    assert outcomes == {((h0.node, 7), (h1.node, 8))}


def test_a_gang_that_must_stay_in_one_nvlink_domain_is_charged_to_the_model_whose_racks_hold_it() -> None:
    state = quota(REPORT)
    rack = NodeGroup(
        name="gb",
        count=4,
        gpu_model=GB200,
        gpus_per_node=4,
        memory_mib=190000,
        nodes_per_nvlink_domain=4,
        leaf="leaf-gb",
    )
    cluster(state, nodes("h", H100, 2, 4) + ClusterSpec(groups=(rack,)).registrations())
    topology = {"level": "nvlink", "mode": "required"}

    [tight] = feed(state, admit("tight", workers=2, gpus_per_worker=4, topology=topology))
    assert isinstance(tight.data, JobQueued) and tight.data.gpu_type == GB200  # only the rack holds both
    [loose] = feed(state, admit("loose", workers=2, gpus_per_worker=4))
    assert isinstance(loose.data, JobQueued) and loose.data.gpu_type == H100  # one worker per H100 node

    [held] = feed(state, admit("named", workers=2, gpus_per_worker=4, topology=topology, gpu_type=H100))
    reason = reason_of(held)
    assert (reason.code, reason.constraint) == ("topology", "hardware")
    assert reason.details["room"] == 1 and reason.details["level"] == "nvlink"
    assert "in one nvlink domain" in reason.message


def test_a_queued_job_not_placed_yet_moves_when_the_nodes_of_its_model_fail() -> None:
    state = report_cluster(REPORT)
    [first] = feed(state, admit("four", gpus_per_worker=4))
    assert isinstance(first.data, JobQueued) and first.data.gpu_type == H100
    [placed] = feed(state, admit("placed", gpus_per_worker=4))
    assert isinstance(placed.data, JobQueued) and placed.data.gpu_type == H100
    assert feed(state, grant("placed")) == []
    assert usage(state, "team-a", H100) == 8

    # Both H100 nodes fail: "four", charged to H100 and not placed, moves to GB200; "placed" runs on.
    h0, h1 = nodes("h", H100, 2, 8)
    assert feed(state, env(NodeFailed(node=h0.node, code="heartbeat_timeout", reason="gone"), at=1)) == []
    [moved] = feed(state, env(NodeFailed(node=h1.node, code="heartbeat_timeout", reason="gone"), at=2))

    assert isinstance(moved.data, JobQueued) and moved.data.job_id == "four"
    assert moved.data.gpu_type == GB200 and moved.data.replaces == first.id
    assert usage(state, "team-a", H100) == 4 and usage(state, "team-a", GB200) == 4
    # Still one attempt: its grant and release uncharge exactly the model it moved to.
    job = state.jobs[moved.data.job_id]
    assert job.attempts == 1 and not job.waiting
    assert feed(state, grant("four")) == []
    assert feed(state, release("four")) == []
    assert usage(state, "team-a", GB200) == 0 and usage(state, "team-a", H100) == 4


def test_a_stranded_job_stays_charged_until_another_model_has_room_then_moves() -> None:
    state = report_cluster(REPORT)
    [gb] = feed(state, admit("gb", gpu_type=GB200, workers=2, gpus_per_worker=4))
    assert isinstance(gb.data, JobQueued) and gb.data.gpu_type == GB200
    assert feed(state, grant("gb")) == []
    [four] = feed(state, admit("four", gpus_per_worker=4))
    assert isinstance(four.data, JobQueued) and four.data.gpu_type == H100

    h0, h1 = nodes("h", H100, 2, 8)
    feed(state, env(NodeFailed(node=h0.node, code="heartbeat_timeout", reason="gone"), at=1))
    # GB200's quota is in use: nowhere to move, so it stays charged to H100 and is kept in mind.
    assert feed(state, env(NodeFailed(node=h1.node, code="heartbeat_timeout", reason="gone"), at=2)) == []
    assert usage(state, "team-a", H100) == 4 and JobId("four") in state.stranded

    through = feed(state, release("gb", at=3))
    [moved] = [e.data for e in through if isinstance(e.data, JobQueued)]
    assert moved.job_id == "four" and moved.gpu_type == GB200 and moved.replaces == four.id
    assert usage(state, "team-a", H100) == 0 and usage(state, "team-a", GB200) == 4
    assert not state.stranded


def test_a_job_waiting_on_a_model_whose_nodes_fail_waits_on_another_and_is_told_so() -> None:
    state = report_cluster(REPORT)
    for job, model in (("h", H100), ("g", GB200)):
        [queued] = feed(state, admit(job, gpu_type=model, workers=2, gpus_per_worker=4))
        assert isinstance(queued.data, JobQueued)
        assert feed(state, grant(job)) == []
    [held] = feed(state, admit("waiter", gpus_per_worker=4))
    assert reason_of(held).details["gpu_type"] == H100  # what preemption would free quota on

    h0, h1 = nodes("h", H100, 2, 8)
    feed(state, env(NodeFailed(node=h0.node, code="heartbeat_timeout", reason="gone"), at=1))
    told = feed(state, env(NodeFailed(node=h1.node, code="heartbeat_timeout", reason="gone"), at=2))

    [pending] = [e for e in told if isinstance(e.data, JobPending) and e.data.job_id == "waiter"]
    reason = reason_of(pending)
    assert reason.details["gpu_type"] == GB200 and f"{H100} cannot hold it" in reason.message
    through = feed(state, release("g", at=3))
    assert queued_ids(through) == ["waiter"]
    [queued] = [e.data for e in through if isinstance(e.data, JobQueued)]
    assert queued.gpu_type == GB200


def test_a_jobs_gate_options_and_place_in_line_follow_every_change_of_the_nodes() -> None:
    """What the gate may let a job through on is kept per job and inventory version, its place in line
    per spec and admitted time: after every event each equals what is worked out afresh."""
    [h0, h1] = nodes("h", H100, 2, 8)
    [g0] = nodes("gb", GB200, 1, 4, memory_mib=190000)
    [g8] = nodes("gb8", GB200, 1, 8, memory_mib=190000)
    failed = GpuHealthChanged(
        node=h0.node,
        gpu=GpuId("gpu3"),
        previous="healthy",
        state="failed",
        cause=HealthCause(kind="xid", message="XID 79", xid=79),
    )
    changes: list[Envelope] = [
        env(h0, at=1),
        env(g0, at=1),
        env(failed, at=2),
        env(h1, at=3),
        env(NodeFailed(node=h1.node, code="heartbeat_timeout", reason="gone"), at=4),
        env(g8, at=5),
        env(NodeRegistered.model_validate(h1.model_dump()), at=6),
    ]
    for seed in range(6):
        rng = random.Random(seed)
        state = quota(TEAMS)
        events = list(changes)
        for k in range(8):
            spec: dict[str, Any] = {
                "gpus_per_worker": rng.choice([1, 4, 7, 8]),
                "workers": rng.choice([1, 2]),
            }
            if rng.random() < 0.3:
                spec["gpu_type"] = rng.choice([H100, GB200])
            events.insert(rng.randrange(len(events) + 1), admit(f"j{k}", at=float(k), **spec))
        for e in events:
            feed(state, e)
            for job in state.jobs.values():
                if job.spec is None:
                    continue
                assert state.gate_options(job) == (state.gate_flavours(job), state.held_options(job)[1])
                job.held = None  # held_options afresh, from the nodes now
                fresh = (state.gate_flavours(job), state.held_options(job)[1])
                assert state.gate_options(job) == fresh
                line = _pending_item(job)
                admitted = job.admitted_at.timestamp() if job.admitted_at is not None else math.inf
                assert (line.queue, line.priority, line.submit_time, line.tie, line.item) == (
                    job.spec.queue,
                    job.spec.priority,
                    admitted,
                    job.job_id,
                    job,
                )


def test_a_jobs_place_in_line_follows_its_spec_and_admitted_time() -> None:
    state = quota(TEAMS)
    feed(state, admit("j", at=1.0))
    job = state.jobs[JobId("j")]
    assert job.spec is not None and job.admitted_at is not None
    first = _pending_item(job)
    assert _pending_item(job) is first  # kept while nothing it is made of changes
    assert (first.queue, first.priority, first.submit_time) == ("team-a", 0, job.admitted_at.timestamp())

    job.record.spec = job.spec.model_copy(update={"priority": 5, "queue": "team-b"})
    moved = _pending_item(job)
    assert (moved.queue, moved.priority, moved.submit_time) == ("team-b", 5, first.submit_time)

    job.record.admitted_at = None
    assert _pending_item(job).submit_time == math.inf


def test_a_cordoned_node_holds_no_new_job_so_quota_charges_another_model_until_it_is_uncordoned() -> None:
    state = quota(REPORT)
    [h0] = nodes("h", H100, 1, 8)
    cluster(state, [h0, *nodes("gb", GB200, 2, 4, memory_mib=190000)])
    assert feed(state, env(NodeCordoned(node=h0.node, reason="bios update"), at=1)) == []

    [elsewhere] = feed(state, admit("gang", workers=2, gpus_per_worker=4, at=2))

    assert isinstance(elsewhere.data, JobQueued) and elsewhere.data.gpu_type == GB200
    assert usage(state, "team-a", H100) == 0
    [held] = feed(state, admit("eight", gpus_per_worker=8, at=2))  # only h0 could hold a worker of 8
    assert reason_of(held).constraint == "hardware" and reason_of(held).details["gpu_type"] == H100

    through = feed(state, env(NodeUncordoned(node=h0.node), at=3))  # back in service: h0 holds it

    assert queued_ids(through) == ["eight"]
    [queued] = [e.data for e in through if isinstance(e.data, JobQueued)]
    assert queued.gpu_type == H100


def test_a_job_queued_on_a_model_whose_nodes_are_then_drained_moves_to_one_that_can_hold_it() -> None:
    state = quota(REPORT)
    [h0] = nodes("h", H100, 1, 8)
    cluster(state, [h0, *nodes("gb", GB200, 2, 4, memory_mib=190000)])
    [first] = feed(state, admit("gang", workers=2, gpus_per_worker=4, at=1))
    assert isinstance(first.data, JobQueued) and first.data.gpu_type == H100  # not placed yet

    drained = NodeCordoned(node=h0.node, mode="drain", drain_grace_s=0, reason="psu")
    [moved] = feed(state, env(drained, at=2))

    assert isinstance(moved.data, JobQueued) and moved.data.job_id == "gang"
    assert (moved.data.gpu_type, moved.data.replaces) == (GB200, first.id)
    assert (usage(state, "team-a", H100), usage(state, "team-a", GB200)) == (0, 8)
    # The same cordon read again (a restore, then the live poll) is no news.
    assert feed(state, env(drained, at=2)) == []
