"""Quota's decisions on the core's quota tree: per-GPU-type quotas, cohorts that lend and borrow, the
fair order of waiting jobs, preemption plans (reclaim, priority), requeues, idempotence."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from svc_helpers import T0, env

from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope
from gangline.events.jobs import (
    JobAdmitted,
    JobCompleted,
    JobFailed,
    JobPending,
    JobQueued,
    JobRequeued,
    JobSpec,
    PendingReason,
)
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.queues import QueuesFile, queues_of
from services.common.topics import TopicNames
from services.quota.handlers import QuotaState, decide
from services.quota.settings import QuotaSettings

TOPICS = TopicNames()
H100 = "H100-SXM5-80GB"
A100 = "A100-SXM4-80GB"


def quota(doc: dict[str, Any], *, half_life_s: float = 0.0, starvation_s: float | None = None) -> QuotaState:
    return QuotaState(
        topics=TOPICS,
        queues=queues_of(QueuesFile.model_validate(doc)),
        half_life_s=half_life_s,
        starvation_s=starvation_s,
    )


def feed(state: QuotaState, envelope: Envelope) -> list[Envelope]:
    outputs = decide(envelope, state, now=T0)
    for _, out in outputs:
        assert state.fold(out) is None  # read back from the log: no change
    return [e for _, e in outputs]


def admit(job: str, *, at: float = 0.0, **spec: Any) -> Envelope:
    fields: dict[str, Any] = {"queue": "team-a", "workers": 1, "gpus_per_worker": 1, **spec}
    return env(JobAdmitted(job_id=JobId(job), spec=JobSpec.model_validate(fields)), at=at)


def grant(job: str, *, attempt: int = 1, at: float = 0.0) -> Envelope:
    event = AllocationGranted(
        job_id=JobId(job),
        allocation_id=AllocationId(f"{job}.{attempt}"),
        queue="team-a",
        placements=(Placement(rank=0, node=NodeId("n0"), gpus=("g0",)),),
    )
    return env(event, at=at)


def release(job: str, reason: str = "completed", *, attempt: int = 1, at: float = 0.0) -> Envelope:
    event = AllocationReleased(
        job_id=JobId(job),
        allocation_id=AllocationId(f"{job}.{attempt}"),
        reason=reason,  # type: ignore[arg-type]
    )
    return env(event, at=at)


def requeue(job: str, attempt: int = 2, *, at: float = 0.0) -> Envelope:
    return env(JobRequeued(job_id=JobId(job), reason="preempted", attempt=attempt), at=at)


def run(state: QuotaState, job: str, *, at: float = 0.0, **spec: Any) -> Envelope:
    """Admit a job that must be queued at once, and grant it: it is running."""
    [queued] = feed(state, admit(job, at=at, **spec))
    assert isinstance(queued.data, JobQueued), queued.data
    assert feed(state, grant(job, at=at)) == []
    return queued


def queued_ids(outputs: list[Envelope]) -> list[str]:
    return [e.data.job_id for e in outputs if isinstance(e.data, JobQueued)]


def reason_of(out: Envelope) -> PendingReason:
    assert isinstance(out.data, JobPending), out.data
    return out.data.reasons[0]


def usage(state: QuotaState, queue: str, model: str = H100) -> int:
    from gangline.core.queues import QueueName, Resource

    return state.ledger.usage(QueueName(queue), Resource(model))


ONE_TEAM = {
    "queues": [
        {"name": "team-a", "quotas": {H100: {"nominal": 16}, A100: {"nominal": 8}}},
        {"name": "default", "unlimited": True},
    ]
}
LAB = {
    "cohorts": [{"name": "lab"}],
    "queues": [
        {"name": "team-a", "cohort": "lab", "quotas": {H100: {"nominal": 8}}},
        {"name": "team-b", "cohort": "lab", "quotas": {H100: {"nominal": 8}}},
    ],
}


def test_quota_settings_read_the_queues_file_and_the_half_life_from_the_environment() -> None:
    settings = QuotaSettings.from_env(
        {"GANGLINE_QUEUES_FILE": "/etc/gangline/queues.yaml", "GANGLINE_FAIR_SHARE_HALF_LIFE_S": "0"}
    )
    assert str(settings.queues_file) == "/etc/gangline/queues.yaml"
    assert settings.fair_share_half_life_s == 0
    assert QuotaSettings().fair_share_half_life_s == 3600


def test_a_job_naming_a_full_gpu_type_waits_while_another_type_of_its_queue_goes() -> None:
    state = quota(ONE_TEAM)
    big = run(state, "big", gpu_type=H100, gpus_per_worker=8, workers=2)
    assert isinstance(big.data, JobQueued) and big.data.gpu_type == H100

    [held] = feed(state, admit("h100", gpu_type=H100, gpus_per_worker=8))
    [a100] = feed(state, admit("a100", gpu_type=A100, gpus_per_worker=4))

    reason = reason_of(held)
    assert (reason.code, reason.constraint) == ("quota", "quota")
    assert reason.message == f"team-a uses 16 of its 16 {H100}; no cohort to borrow from; needs 8"
    assert reason.details["needed"] == 8 and reason.details["used"] == 16 and reason.details["nominal"] == 16
    assert str(reason.details["fair_share"]).startswith("team-a fair share ")
    assert reason.unblock is not None and "8 more" in reason.unblock
    assert isinstance(a100.data, JobQueued) and a100.data.gpu_type == A100
    assert (usage(state, "team-a"), usage(state, "team-a", A100)) == (16, 4)

    [through] = feed(state, release("big"))
    assert queued_ids([through]) == ["h100"] and usage(state, "team-a") == 8


def test_a_job_naming_no_type_gets_the_first_model_with_room_and_the_queued_event_says_which() -> None:
    state = quota(ONE_TEAM)
    [first] = feed(state, admit("first", gpus_per_worker=8, workers=2))
    [second] = feed(state, admit("second", gpus_per_worker=8))
    [third] = feed(state, admit("third", gpus_per_worker=8))

    assert isinstance(first.data, JobQueued) and first.data.gpu_type == H100
    assert isinstance(second.data, JobQueued) and second.data.gpu_type == A100
    message = reason_of(third).message
    assert f"on {H100}: team-a uses 16 of its 16 {H100}" in message
    assert f"on {A100}: team-a uses 8 of its 8 {A100}" in message
    # A release uncharges exactly what was charged: the A100 job frees A100, the H100 stays full.
    [through] = feed(state, release("second"))
    assert isinstance(through.data, JobQueued) and through.data.gpu_type == A100
    assert (usage(state, "team-a"), usage(state, "team-a", A100)) == (16, 8)


def test_borrowing_within_a_cohort_stops_at_the_borrowing_limit() -> None:
    doc = {
        "cohorts": [{"name": "lab"}],
        "queues": [
            {"name": "team-a", "cohort": "lab", "quotas": {H100: {"nominal": 8, "borrowing_limit": 4}}},
            {"name": "team-b", "cohort": "lab", "quotas": {H100: {"nominal": 8}}},
        ],
    }
    state = quota(doc)
    run(state, "a1", gpus_per_worker=8)
    run(state, "a2", gpus_per_worker=4)  # borrows 4 of team-b's idle quota
    [held] = feed(state, admit("a3", gpus_per_worker=1))
    assert (
        reason_of(held).message
        == f"team-a uses 12 of its 8 {H100}; borrows 4 of its borrowing limit of 4; needs 1"
    )
    [never] = feed(state, admit("huge", gpus_per_worker=8, workers=2))
    assert isinstance(never.data, JobFailed) and never.data.code == "exceeds_queue_quota"
    assert "can never hold this job" in never.data.reason
    assert "huge" in state.retired and usage(state, "team-a") == 12


def test_a_lender_keeps_what_its_lending_limit_does_not_lend() -> None:
    doc = {
        "cohorts": [{"name": "lab"}],
        "queues": [
            {"name": "team-a", "cohort": "lab", "quotas": {H100: {"nominal": 8}}},
            {"name": "team-b", "cohort": "lab", "quotas": {H100: {"nominal": 8, "lending_limit": 2}}},
        ],
    }
    state = quota(doc)
    run(state, "a1", gpus_per_worker=8)
    run(state, "a2", gpus_per_worker=2)
    [held] = feed(state, admit("a3", gpus_per_worker=1))
    assert reason_of(held).message == f"team-a uses 10 of its 8 {H100}; cohort has 0 to lend; needs 1"
    [b] = feed(state, admit("b1", queue="team-b", gpus_per_worker=6))  # what team-b kept is its own
    assert isinstance(b.data, JobQueued)


def _fair_scenario(doc: dict[str, Any], *, half_life_s: float) -> list[str]:
    """team-a held the whole cohort for an hour; then a job of each queue waits for all of it."""
    state = quota(doc, half_life_s=half_life_s)
    run(state, "a0", gpus_per_worker=8, workers=2, at=0)
    assert reason_of(feed(state, admit("a1", gpus_per_worker=8, workers=2, at=10))[0])
    assert reason_of(feed(state, admit("b1", queue="team-b", gpus_per_worker=8, workers=2, at=20))[0])
    return queued_ids(feed(state, release("a0", at=3600)))


def test_a_release_lets_the_queue_with_the_lower_dominant_share_through_first() -> None:
    state = quota(LAB)
    run(state, "a0", gpus_per_worker=4, at=0)
    run(state, "a1", gpus_per_worker=4, at=1)
    run(state, "a2", gpus_per_worker=4, at=2)  # team-a borrows 4
    run(state, "b0", queue="team-b", gpus_per_worker=4, at=3)
    feed(state, admit("a-wait", gpus_per_worker=4, at=10))  # admitted first
    feed(state, admit("b-wait", queue="team-b", gpus_per_worker=4, at=20))
    # team-a would hold 8 of 16 after the release, team-b 4: team-b's job goes though admitted later.
    assert queued_ids(feed(state, release("a0", at=30))) == ["b-wait"]

    weighted = {**LAB, "queues": [{**LAB["queues"][0], "weight": 3}, LAB["queues"][1]]}  # type: ignore[dict-item]
    state = quota(weighted)
    for k, (job, queue) in enumerate(
        [("a0", "team-a"), ("a1", "team-a"), ("a2", "team-a"), ("b0", "team-b")]
    ):
        run(state, job, queue=queue, gpus_per_worker=4, at=k)
    feed(state, admit("b-wait", queue="team-b", gpus_per_worker=4, at=10))  # admitted first
    feed(state, admit("a-wait", gpus_per_worker=4, at=20))
    # Weight 3: team-a's 8 of 16 count as a share of 1/6, below team-b's 1/4.
    assert queued_ids(feed(state, release("a0", at=30))) == ["a-wait"]


DAY = 86_400.0


def _starving_scenario(starvation_s: float | None) -> list[str]:
    """team-a holds 12 of the cohort's 16, team-b 4; team-a's job waits from 10 s, team-b's from 1.5
    days; at 2 days a release makes room for one of them."""
    state = quota(LAB, starvation_s=starvation_s)
    for k, job in enumerate(["a0", "a1", "a2"]):
        run(state, job, gpus_per_worker=4, at=k)
    run(state, "b0", queue="team-b", gpus_per_worker=4, at=3)
    assert reason_of(feed(state, admit("a-old", gpus_per_worker=4, at=10))[0])
    assert reason_of(feed(state, admit("b-new", queue="team-b", gpus_per_worker=4, at=1.5 * DAY))[0])
    return queued_ids(feed(state, release("a0", at=2 * DAY)))


def test_a_job_held_longer_than_the_starvation_bound_goes_through_before_fair_order() -> None:
    assert _starving_scenario(None) == ["b-new"]  # fair share: team-b's share is the lower
    assert _starving_scenario(3 * DAY) == ["b-new"]  # a-old has waited 2 days, under the bound
    assert _starving_scenario(DAY) == ["a-old"]  # over a one-day bound: the old job goes first


def test_quota_takes_the_starvation_bound_from_the_profile_placement_runs(tmp_path: Path) -> None:
    from gangline.core.defaults import DEFAULT_PROFILE_YAML, default_profile
    from services.quota.wiring import new_state

    queues = queues_of(QueuesFile.model_validate(LAB))
    state = new_state(QuotaSettings(), queues)
    assert state.starvation_s == default_profile().settings.starvation_s
    assert state.charges.starvation_s == state.starvation_s is not None

    text = re.sub(r"starvation_s: [0-9.e+]+", "starvation_s: 60", DEFAULT_PROFILE_YAML)
    assert text != DEFAULT_PROFILE_YAML
    (tmp_path / "profile.yaml").write_text(text)
    state = new_state(QuotaSettings(profile_path=str(tmp_path / "profile.yaml")), queues)
    assert state.starvation_s == state.charges.starvation_s == 60


def _line_scenario(line_order: str) -> list[str]:
    """team-a's 16 H100s run one job; a long job waits from 10 s, a short one from 20 s; the run ends."""
    state = quota(ONE_TEAM)
    state.line_order = line_order
    run(state, "runs", gpus_per_worker=16)
    assert reason_of(feed(state, admit("long", gpus_per_worker=16, duration_hint_s=72_000, at=10))[0])
    assert reason_of(feed(state, admit("short", gpus_per_worker=16, duration_hint_s=3_600, at=20))[0])
    return queued_ids(feed(state, release("runs", at=100)))


def test_the_quota_service_orders_a_queues_line_by_the_profiles_line_order() -> None:
    assert _line_scenario("submit") == ["long"]
    assert _line_scenario("shortest-run") == ["short"]  # the core's line order (gangline.core.fairshare)


def _reserve_scenario(gate_reserve: bool) -> list[Envelope]:
    """The lab's 16 GPUs run two 8-GPU jobs (ending at 2 and 3 days by their hints); a 16-GPU job has
    waited past the one-day bound; an 8-GPU job of 1.5 days waits too; the first run ends at 2 days."""
    state = quota(LAB, starvation_s=DAY)
    state.gate_reserve = gate_reserve
    state.charges = state._new_charges()
    run(state, "r1", gpus_per_worker=8, duration_hint_s=int(2 * DAY))
    run(state, "r2", queue="team-b", gpus_per_worker=8, duration_hint_s=int(3 * DAY))
    assert reason_of(feed(state, admit("big", workers=2, gpus_per_worker=8, at=10))[0])
    feed(state, admit("small", gpus_per_worker=8, duration_hint_s=int(1.5 * DAY), at=1.5 * DAY))
    return feed(state, release("r1", at=2 * DAY))


def test_the_quota_service_reserves_quota_for_a_starving_job_when_the_profile_says_so() -> None:
    assert queued_ids(_reserve_scenario(False)) == ["small"]
    held = _reserve_scenario(True)
    assert queued_ids(held) == []
    reasons = {e.data.job_id: reason_of(e) for e in held if isinstance(e.data, JobPending)}
    assert "reserved for job big" in reasons[JobId("small")].message


def test_a_queue_that_used_a_lot_recently_goes_after_one_that_did_not() -> None:
    assert _fair_scenario(LAB, half_life_s=0) == ["a1"]  # plain DRF: both at 0, the earlier admitted
    assert _fair_scenario(LAB, half_life_s=3600) == ["b1"]  # team-a's last hour counts against it


def test_a_job_owed_its_nominal_quota_says_reclaim_is_due_and_goes_once_a_borrower_is_released() -> None:
    state = quota(LAB)
    run(state, "b-keep", queue="team-b", gpus_per_worker=8, at=0)  # within team-b's nominal, not preemptible
    run(state, "b-old", queue="team-b", gpus_per_worker=4, preemptible=True, at=1)
    run(state, "b-new", queue="team-b", gpus_per_worker=4, preemptible=True, at=2)

    [held] = feed(state, admit("a1", gpus_per_worker=4, at=10))

    reason = reason_of(held)
    # Quota says it is owed (within team-a's nominal 8): who gives it back is the preemption service's call.
    assert (reason.code, reason.constraint) == ("quota", "reclaim")
    assert reason.details["within_nominal"] is True and reason.details["gpu_type"] == H100
    assert "victims" not in reason.details and "reclaims it" in reason.message
    # The preemption service releases a borrower and requeues it: team-a's job goes, the victim waits.
    [through] = feed(state, release("b-new", "preempted", at=20))
    assert queued_ids([through]) == ["a1"]
    [again] = feed(state, requeue("b-new", at=21))
    assert reason_of(again).code == "quota" and usage(state, "team-b") == 12
    # team-b is over its nominal: the victim is not owed anything back.
    assert reason_of(again).constraint == "quota" and reason_of(again).details["within_nominal"] is False


def test_a_job_over_its_nominal_quota_waits_for_quota_and_names_no_victims() -> None:
    doc = {"queues": [{"name": "team-a", "quotas": {H100: {"nominal": 8}}}]}
    state = quota(doc)
    run(state, "fixed", gpus_per_worker=4, priority=0, at=0)
    run(state, "low", gpus_per_worker=4, priority=1, preemptible=True, at=2)
    [big] = feed(state, admit("big", gpus_per_worker=4, priority=10, at=10))
    reason = reason_of(big)
    assert (reason.constraint, reason.details["within_nominal"]) == ("quota", False)
    assert "victims" not in reason.details and "preemption service" in (reason.unblock or "")


def test_a_preempted_job_is_uncharged_waits_and_is_queued_again_when_room_returns() -> None:
    doc = {"queues": [{"name": "team-a", "quotas": {H100: {"nominal": 4}}}]}
    state = quota(doc)
    run(state, "j1", gpus_per_worker=4, at=0)
    feed(state, admit("j2", gpus_per_worker=4, at=1))
    [j2] = feed(state, release("j1", "preempted", at=2))  # uncharged: the waiting job takes the room
    assert queued_ids([j2]) == ["j2"] and usage(state, "team-a") == 4
    [wait] = feed(state, requeue("j1", at=3))
    assert reason_of(wait).code == "quota"
    assert state.jobs[JobId("j1")].admitted_at == T0  # keeps its original admitted time
    assert feed(state, grant("j2", at=4)) == []
    [back] = feed(state, env(JobCompleted(job_id=JobId("j2"), allocation_id=AllocationId("j2.1")), at=5))
    assert isinstance(back.data, JobQueued) and back.data.job_id == "j1"
    assert usage(state, "team-a") == 4 and len(state.jobs[JobId("j1")].queued) == 2


def test_a_requeue_read_before_its_release_waits_for_the_release_and_then_competes_in_fair_order() -> None:
    doc = {"queues": [{"name": "team-a", "quotas": {H100: {"nominal": 4}}}]}
    state = quota(doc)
    run(state, "j1", gpus_per_worker=4, at=0)
    feed(state, admit("j2", gpus_per_worker=4, priority=5, at=1))
    assert feed(state, requeue("j1", at=2)) == []  # its GPUs are not released yet: still charged
    assert usage(state, "team-a") == 4
    # On the release both wait; the higher priority goes, the requeued job is told why it waits.
    outputs = feed(state, release("j1", "preempted", at=3))
    assert queued_ids(outputs) == ["j2"]
    assert [e.data.job_id for e in outputs if isinstance(e.data, JobPending)] == ["j1"]


def test_pending_reasons_are_sent_only_when_what_blocks_the_job_changes() -> None:
    doc = {"queues": [{"name": "team-a", "quotas": {H100: {"nominal": 8}}}]}
    state = quota(doc)
    run(state, "a", gpus_per_worker=4, at=0)
    run(state, "b", gpus_per_worker=2, preemptible=True, at=1)
    run(state, "c", gpus_per_worker=1, at=2)
    run(state, "d", gpus_per_worker=1, at=3)
    admit_big = admit("big", gpus_per_worker=4, priority=5, at=4)
    [first] = feed(state, admit_big)
    assert reason_of(first).message == f"team-a uses 8 of its 8 {H100}; no cohort to borrow from; needs 4"
    assert feed(state, admit_big) == []  # delivered again: same reason, not repeated
    assert feed(state, release("d", at=5)) == []  # 7 of 8 used: only a figure changed
    assert feed(state, release("c", at=6)) == []  # 6 of 8: still over its nominal, only figures changed
    [through] = feed(state, release("b", "preempted", at=7))
    assert queued_ids([through]) == ["big"] and JobId("big") not in state.last_pending


def test_an_unlimited_queue_is_left_to_placement_and_an_unknown_queue_fails() -> None:
    state = quota(ONE_TEAM)
    for k in range(5):
        # Nothing to decide (placement takes these once admitted); nothing kept but the retired id.
        assert feed(state, admit(f"free{k}", queue="default", gpus_per_worker=8, workers=8)) == []
        assert feed(state, grant(f"free{k}", at=1)) == []
        assert feed(state, release(f"free{k}", "completed", at=2)) == []
    assert not state.jobs and {f"free{k}" for k in range(5)} <= state.retired
    [nowhere] = feed(state, admit("lost", queue="nowhere"))
    assert isinstance(nowhere.data, JobFailed) and nowhere.data.code == "unknown_queue"
    assert usage(state, "team-a") == 0


def _scenario() -> list[Envelope]:
    return [
        admit("a1", gpus_per_worker=8, at=0),
        admit("b1", queue="team-b", gpus_per_worker=8, preemptible=True, at=1),
        admit("b2", queue="team-b", gpus_per_worker=4, preemptible=True, at=2),
        grant("a1", at=3),
        grant("b1", at=3),
        admit("a2", gpus_per_worker=4, at=4),
        admit("b3", queue="team-b", gpus_per_worker=4, at=5),
        release("a1", at=6),
        release("b1", "preempted", at=7),
        requeue("b1", at=8),
        env(JobFailed(job_id=JobId("b2"), code="worker_exit", reason="died"), at=9),
        release("b2", "failed", at=10),
    ]


def _summary(state: QuotaState) -> dict[str, Any]:
    return {
        "usage": {q: state.ledger.usage_vector(q) for q in state.queues.tree.queue_names()},
        "charges": {j: job.charge for j, job in state.jobs.items()},
        "waiting": {t: sorted(js) for t, js in state.waiting.items()},
        "retired": sorted(state.retired),
        "last_pending": dict(state.last_pending),
    }


def test_every_event_delivered_twice_gives_the_same_outputs_and_state() -> None:
    once, twice = quota(LAB, half_life_s=600), quota(LAB, half_life_s=600)
    out_once: list[Envelope] = []
    out_twice: list[Envelope] = []
    for envelope in _scenario():
        out_once += feed(once, envelope)
        out_twice += feed(twice, envelope)
        assert feed(twice, envelope) == []
    assert [(e.id, e.type) for e in out_once] == [(e.id, e.type) for e in out_twice]
    assert _summary(once) == _summary(twice)
    assert once.charges.usage == twice.charges.usage


def test_a_restore_in_topic_order_gives_the_live_state() -> None:
    live = quota(LAB)
    log: list[Envelope] = []
    for envelope in _scenario():
        log += [envelope, *feed(live, envelope)]
    events = [e for e in log if not e.type.startswith("gangline.allocation.")]
    allocations = [e for e in log if e.type.startswith("gangline.allocation.")]
    for order in ([*events, *allocations], [*allocations, *events], log):
        restored = quota(LAB)
        for envelope in order:
            restored.restore(envelope)
        assert _summary(restored) == _summary(live)


def test_a_restore_keeps_what_quota_last_told_from_its_own_pending_reasons() -> None:
    live = quota(LAB)
    log: list[Envelope] = []
    steps = [
        admit("b1", queue="team-b", gpus_per_worker=8, preemptible=True, at=0),
        admit("b2", queue="team-b", gpus_per_worker=8, preemptible=True, at=1),
        grant("b1", at=2),
        grant("b2", at=3),
        admit("a1", gpus_per_worker=4, at=4),
    ]
    for envelope in steps:
        log += [envelope, *feed(live, envelope)]
    assert reason_of(log[-1]).constraint == "reclaim"
    restored = quota(LAB)
    for envelope in log:
        restored.restore(envelope)
    assert restored.last_pending == live.last_pending
    # The same admission read again tells nothing new.
    assert feed(restored, steps[-1]) == []


def test_finished_jobs_are_dropped_and_nothing_read_about_them_again_changes_the_state() -> None:
    doc = {"queues": [{"name": "default", "quotas": {H100: {"nominal": 4}}}]}
    state = quota(doc)
    history: list[Envelope] = []
    for k in range(50):
        admitted = admit(f"j{k}", queue="default", gpus_per_worker=4, at=k)
        [queued] = feed(state, admitted)
        done = (
            release(f"j{k}", at=k)
            if k % 2
            else env(JobFailed(job_id=JobId(f"j{k}"), code="x", reason="died"), at=k)
        )
        assert feed(state, done) == []
        history += [admitted, queued, done]
    assert state.jobs == {} and len(state.retired) == 50 and usage(state, "default") == 0
    for envelope in [*reversed(history), *history]:
        assert feed(state, envelope) == []
    assert state.jobs == {} and state.waiting == {} and usage(state, "default") == 0


def test_records_about_retired_jobs_are_skipped_before_decoding() -> None:
    from dataclasses import dataclass

    from gangline.events.codec import encode
    from services.common.select import unless_keyed_by

    @dataclass(frozen=True)
    class Record:
        topic: str
        partition: int
        offset: int
        timestamp: int
        key: bytes | None
        value: bytes | None
        headers: tuple[tuple[str, bytes], ...] = ()

    state = quota(ONE_TEAM)
    feed(state, admit("open", queue="default"))  # an unlimited queue's job: retired on admission
    decoded: list[bytes | None] = []

    def count(record: Any) -> bool:
        decoded.append(record.key)
        return True

    select = unless_keyed_by(state.retired, count)
    about = {job: encode(grant(job, at=1)) for job in ("open", "a1")}
    assert not select(Record("jobs.events", 0, 0, 0, b"open", about["open"]))
    assert select(Record("jobs.events", 0, 1, 0, b"a1", about["a1"]))
    assert select(Record("jobs.events", 0, 2, 0, None, b"not json"))
    assert decoded == [b"a1", None]


def test_being_owed_nominal_quota_is_news_but_a_figure_is_not() -> None:
    from gangline.events.jobs import PendingReason
    from services.quota.handlers import pending_key

    def reason(used: int, constraint: str) -> PendingReason:
        return PendingReason(
            code="quota", constraint=constraint, message=f"team-a uses {used} of its 8 H100; needs 4"
        )

    assert pending_key(reason(4, "quota")) == pending_key(reason(6, "quota"))  # only a figure changed
    assert pending_key(reason(4, "quota")) != pending_key(reason(4, "reclaim"))


def test_the_decayed_usage_does_not_depend_on_the_order_releases_are_read_in() -> None:
    """Two releases of two queues, read in time order or the later first (another partition, or the
    restore reading topic by topic): the same decayed usage, so the same fair-share figures."""

    def history_after(order: list[Envelope]) -> dict[str, dict[str, float]]:
        state = quota(LAB, half_life_s=600)
        run(state, "a0", gpus_per_worker=4, at=0)
        run(state, "b0", queue="team-b", gpus_per_worker=4, at=0)
        for envelope in order:
            state.fold(envelope)
        decayed = state.charges.usage.history(T0.timestamp() + 600).decayed
        return {str(q): {str(r): v for r, v in vec.items()} for q, vec in decayed.items()}

    early, later = release("a0", at=100), release("b0", at=500)
    in_order, reversed_order = history_after([early, later]), history_after([later, early])
    assert in_order.keys() == reversed_order.keys() == {"team-a", "team-b"}
    assert in_order == reversed_order  # exactly: the sums do not depend on the order of their terms
