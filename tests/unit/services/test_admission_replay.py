"""Admission's decisions replayed from a recorded log: identical when untouched, across a restart that
restores the admitted ids; a tampered rejection, a dropped node registration and another queues file
are named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from replay_recorder import TOPICS, Log, ServiceRun, Wiring, outputs_of, tampered
from svc_helpers import cluster, env

from gangline.events.codec import encode
from gangline.events.jobs import JobCancelRequested, JobRequested
from gangline.events.types import JobId
from services.admission.handlers import SOURCE, AdmissionState, on_request, rejection_of_dead_letter
from services.admission.replay import replay_admission
from services.admission.settings import AdmissionSettings
from services.admission.wiring import new_state

H100 = "H100-SXM5-80GB"


def queues_file(path: Path, research_h100: int = 8) -> AdmissionSettings:
    """Settings naming a queues file at ``path``: ``default`` unlimited, ``research`` with a quota."""
    doc = {
        "queues": [
            {"name": "default", "unlimited": True},
            {"name": "research", "quotas": {H100: {"nominal": research_h100}}},
        ]
    }
    path.write_text(yaml.safe_dump(doc))
    return AdmissionSettings(queues_file=path)


@pytest.fixture
def settings(tmp_path: Path) -> AdmissionSettings:
    return queues_file(tmp_path / "queues.yaml")


def wiring(settings: AdmissionSettings) -> Wiring:
    def decider(state: AdmissionState, clock: Any) -> Any:
        return lambda envelope, meta: on_request(envelope, state, now=clock())

    def reject_unreadable(state: AdmissionState, clock: Any) -> Any:
        return lambda letter: rejection_of_dead_letter(letter, state, now=clock())

    return Wiring(
        live_topics=(TOPICS.requests, TOPICS.inventory),
        restore_topics=(TOPICS.inventory, TOPICS.events),
        new_state=lambda now: new_state(settings),
        restore=lambda state, envelope: state.restore(envelope),
        decide=decider,
        dead_letter_outputs=reject_unreadable,
    )


def request(log: Log, job: str, *, event_id: str | None = None, **spec: Any) -> None:
    fields: dict[str, Any] = {"queue": "default", "workers": 1, "gpus_per_worker": 1, **spec}
    log.produce(TOPICS.requests, env(JobRequested(job_id=JobId(job), **fields), event_id=event_id))


def recorded_log(settings: AdmissionSettings) -> Log:
    log = Log()
    for node in cluster(("a", 2, 8)).registrations():
        log.produce(TOPICS.inventory, env(node))
    run = ServiceRun(log, wiring(settings))
    request(log, "j1", event_id="req-j1", workers=2, gpus_per_worker=8)
    request(log, "j2", queue="nope")
    request(log, "j3", gpus_per_worker=16)
    request(log, "j1", workers=2, gpus_per_worker=8)  # a producer's retry: dropped
    request(log, "j1", gpus_per_worker=2)  # the same id, another spec: rejected
    log.produce(TOPICS.requests, env(JobCancelRequested(job_id=JobId("zz"))))
    unreadable = json.loads(
        encode(env(JobRequested(job_id=JobId("j9"), queue="default", workers=1, gpus_per_worker=1)))
    )
    del unreadable["data"]["workers"]
    log.append(TOPICS.requests, unreadable, "j9")  # no workers: dead-lettered, and rejected
    run.drain(max_per_partition=2)
    request(log, "j8", event_id="req-j1")  # j1's event id, another body: rejected (duplicate_event_id)
    run.drain()
    run.start()
    request(log, "j1", workers=2, gpus_per_worker=8)  # a retry after the restart: still dropped
    request(log, "j10", event_id="req-j1")  # still known after the restart (from j1's admission)
    request(log, "j4", workers=3, gpus_per_worker=8)  # 24 GPUs: too large unless node b comes first
    for node in cluster(("b", 1, 8)).registrations():
        log.produce(TOPICS.inventory, env(node))
    run.drain()
    request(log, "j5", workers=3, gpus_per_worker=8)  # fits now
    request(log, "j6", queue="research", workers=2, gpus_per_worker=8)  # over research's quota of 8
    request(log, "j7", queue="research", workers=1, gpus_per_worker=8)
    run.drain()
    return log


def test_an_untouched_log_replays_identical_across_a_restart(settings: AdmissionSettings) -> None:
    log = recorded_log(settings)
    outputs = outputs_of(log.records, SOURCE)
    assert {r.type for r in outputs} == {"gangline.job.admitted.v1", "gangline.job.rejected.v1"}
    reused = [
        r.envelope["data"]["job_id"]
        for r in outputs
        if r.envelope["data"].get("code") == "duplicate_event_id"
    ]
    assert reused == ["j8", "j10"]

    result = replay_admission(log.records, settings)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2
    assert result.compared == len(outputs) >= 8


def test_a_tampered_rejection_is_named(settings: AdmissionSettings) -> None:
    records = recorded_log(settings).records
    target = next(r for r in outputs_of(records, SOURCE) if r.envelope["data"].get("code") == "duplicate_job")

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["code"] = "too_large"

    first = replay_admission(tampered(records, target, forge), settings).first

    assert first is not None
    assert (first.where, first.job_id, first.field) == (target.where, "j1", "data.code")
    assert (first.recorded, first.replayed) == ('"too_large"', '"duplicate_job"')


def test_a_dropped_node_registration_is_named_as_the_admission_it_allowed(
    settings: AdmissionSettings,
) -> None:
    records = recorded_log(settings).records
    late_node = [r for r in records if r.topic == TOPICS.inventory][-1]
    [admitted_j5] = [r for r in outputs_of(records, SOURCE) if r.envelope["data"].get("job_id") == "j5"]

    result = replay_admission([r for r in records if r is not late_node], settings)

    assert (admitted_j5.where, "j5", "not decided by the replay") in [
        (d.where, d.job_id, d.replayed) for d in result.differences
    ]
    assert any(
        d.recorded == "not in the log" and d.field == "gangline.job.rejected.v1" for d in result.differences
    )


def test_the_rejection_of_an_unreadable_request_is_decided_again_from_its_dead_letter(
    settings: AdmissionSettings,
) -> None:
    records = recorded_log(settings).records
    [target] = [r for r in outputs_of(records, SOURCE) if r.envelope["data"].get("job_id") == "j9"]
    assert target.envelope.get("causationid") is None
    assert replay_admission(records, settings).unverified == 0

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["reason"] = "the request could not be read: it was rude"

    first = replay_admission(tampered(records, target, forge), settings).first

    assert first is not None
    assert (first.where, first.job_id, first.field) == (target.where, "j9", "data.reason")


def test_replaying_under_another_queues_file_names_the_decisions_it_changes(
    settings: AdmissionSettings, tmp_path: Path
) -> None:
    records = recorded_log(settings).records
    [over_quota] = [r for r in outputs_of(records, SOURCE) if r.envelope["data"].get("job_id") == "j6"]
    assert over_quota.envelope["data"]["code"] == "exceeds_queue_quota"
    assert "research uses 0 of its 8" in over_quota.envelope["data"]["reason"]

    wider = queues_file(tmp_path / "wider.yaml", research_h100=16)
    result = replay_admission(records, wider)

    assert [(d.where, d.job_id, d.replayed) for d in result.differences][:1] == [
        (over_quota.where, "j6", "not decided by the replay")
    ]
    assert [(d.job_id, d.field, d.recorded) for d in result.differences[1:]] == [
        ("j6", "gangline.job.admitted.v1", "not in the log")
    ]
