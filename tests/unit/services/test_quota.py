from __future__ import annotations

from svc_helpers import T0, admitted, env

from gangline.events.allocations import AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import JobFailed, JobPending, JobQueued, JobRequeued
from gangline.events.types import AllocationId, JobId, QueueName
from services.common.topics import TopicNames
from services.quota.handlers import QuotaState, decide
from services.quota.settings import QuotaSettings

TOPICS = TopicNames()


def feed(state: QuotaState, envelope: Envelope) -> list[Envelope]:
    outputs = decide(envelope, state, now=T0)
    for _, out in outputs:
        state.fold(out)  # read back from the log: no change
    return [e for _, e in outputs]


def released(job: str, reason: str = "completed") -> Envelope:
    return env(AllocationReleased(job_id=JobId(job), allocation_id=AllocationId(f"{job}.1"), reason=reason))  # type: ignore[arg-type]


def test_queue_limits_from_the_environment() -> None:
    settings = QuotaSettings.from_env({"GANGLINE_QUEUE_LIMITS": "default=*, team-a=16"})
    assert settings.queue_limits == {"default": None, "team-a": 16}


def test_jobs_within_the_limit_are_queued_the_rest_wait_with_a_quota_reason() -> None:
    state = QuotaState(topics=TOPICS, limits={"team": 8})
    [q1] = feed(state, admitted("a", queue="team", gpus_per_worker=6))
    assert isinstance(q1.data, JobQueued)
    [p] = feed(state, admitted("b", queue="team", gpus_per_worker=4, priority=1))
    [p2] = feed(state, admitted("c", queue="team", gpus_per_worker=2))
    assert isinstance(p.data, JobPending) and p.data.reasons[0].code == "quota"
    assert "holds 6 of its 8" in p.data.reasons[0].message
    assert isinstance(p2.data, JobQueued)  # 6 + 2 fits
    assert state.usage[QueueName("team")] == 8
    # A final release lets the waiting job through; the higher priority first.
    feed(state, released("c"))
    assert state.usage[QueueName("team")] == 6
    out = feed(state, released("a"))
    assert [(e.type, e.subject) for e in out] == [("gangline.job.queued.v1", "b")]
    assert state.usage[QueueName("team")] == 4


def test_a_requeued_job_stays_charged_and_is_queued_again() -> None:
    state = QuotaState(topics=TOPICS, limits={"default": 4})
    feed(state, admitted("a", gpus_per_worker=4))
    assert feed(state, released("a", reason="preempted")) == []
    [again] = feed(state, env(JobRequeued(job_id=JobId("a"), reason="preempted", attempt=2)))
    assert isinstance(again.data, JobQueued)
    assert state.usage[QueueName("default")] == 4
    assert len(state.jobs[JobId("a")].queued) == 2


def test_restore_gives_the_same_usage_and_does_not_queue_twice() -> None:
    state = QuotaState(topics=TOPICS, limits={"default": None})
    admit = admitted("a", gpus_per_worker=2)
    [queued] = feed(state, admit)
    restarted = QuotaState(topics=TOPICS, limits={"default": None})
    restarted.restore(queued)  # order between topics does not matter
    restarted.restore(admit)
    assert restarted.usage == state.usage == {"default": 2}
    assert feed(restarted, admit) == []


def test_a_job_larger_than_its_queue_limit_fails_at_once_instead_of_waiting_forever() -> None:
    state = QuotaState(topics=TOPICS, limits={"small": 4})
    [out] = feed(state, admitted("huge", queue="small", workers=2, gpus_per_worker=4))
    assert isinstance(out.data, JobFailed)
    assert out.data.code == "exceeds_queue_limit" and "at most 4" in out.data.reason
    assert state.waiting.get(QueueName("small"), {}) == {}
    assert state.usage.get(QueueName("small"), 0) == 0


def test_finished_jobs_are_dropped_and_nothing_read_about_them_again_changes_the_state() -> None:
    state = QuotaState(topics=TOPICS, limits={"default": 4})
    history: list[Envelope] = []
    for k in range(100):
        admit = admitted(f"j{k}", gpus_per_worker=4)
        [queued] = feed(state, admit)
        done = released(f"j{k}") if k % 2 else env(JobFailed(job_id=JobId(f"j{k}"), code="x", reason="died"))
        assert feed(state, done) == []
        history += [admit, queued, done]
    assert state.jobs == {} and len(state.retired) == 100
    assert state.usage == {"default": 0}
    # Everything delivered again, in any order: no output, no charge, no record.
    for envelope in [*reversed(history), *history]:
        assert feed(state, envelope) == []
    assert state.jobs == {} and state.usage == {"default": 0} and state.waiting[QueueName("default")] == {}


def test_a_waiting_job_still_gets_through_when_a_finished_job_is_dropped() -> None:
    state = QuotaState(topics=TOPICS, limits={"default": 4})
    feed(state, admitted("a", gpus_per_worker=4))
    [wait] = feed(state, admitted("b", gpus_per_worker=2))
    assert isinstance(wait.data, JobPending)
    [through] = feed(state, released("a"))
    assert isinstance(through.data, JobQueued) and through.data.job_id == "b"
    assert set(state.jobs) == {"b"} and state.retired == {"a"}
    assert state.usage == {"default": 2}


def test_a_restore_in_topic_order_retires_finished_jobs_like_the_live_service() -> None:
    live = QuotaState(topics=TOPICS, limits={"default": None})
    events: list[Envelope] = []
    for job in ("a", "b"):
        admit = admitted(job, gpus_per_worker=2)
        events += [admit, *feed(live, admit)]
    feed(live, released("a"))
    restored = QuotaState(topics=TOPICS, limits={"default": None})
    for envelope in [*events, released("a")]:  # jobs.events, then allocations.log
        restored.restore(envelope)
    assert restored.usage == live.usage == {"default": 2}
    assert set(restored.jobs) == set(live.jobs) == {"b"} and restored.retired == live.retired == {"a"}
