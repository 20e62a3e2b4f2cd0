"""Admission and the queue configuration file: which queues exist, and quotas a job can never fit."""

from __future__ import annotations

from pathlib import Path

import yaml
from svc_helpers import T0, cluster, env
from test_admission import H100, TOPICS, ask, state_with_cluster

from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.jobs import JobAdmitted, JobRejected, JobRequested
from gangline.events.types import JobId
from services.admission.handlers import MAX_REASON, on_request
from services.admission.settings import AdmissionSettings
from services.admission.wiring import new_state

LAB = {
    "cohorts": [{"name": "lab"}],
    "queues": [
        {"name": "default", "unlimited": True},
        {"name": "research", "cohort": "lab", "quotas": {H100: {"nominal": 8}}},
        {"name": "vision", "cohort": "lab", "quotas": {H100: {"nominal": 4, "borrowing_limit": 2}}},
        {"name": "solo", "quotas": {H100: {"nominal": 4}}},
    ],
}


def rejection(out: list[JobAdmitted | JobRejected]) -> JobRejected:
    [only] = out
    assert isinstance(only, JobRejected), only
    return only


def test_without_a_file_there_is_one_unlimited_default_queue() -> None:
    state = new_state(AdmissionSettings(topic_prefix=TOPICS.prefix))
    for node in cluster(("a", 2, 8), ("b", 1, 4)).registrations():
        state.restore(env(node))
    assert state.queues.names() == ["default"]
    [whole_cluster] = ask(state, "big", workers=2, gpus_per_worker=8)  # no quota holds it back
    assert isinstance(whole_cluster, JobAdmitted)
    out = rejection(ask(state, "elsewhere", queue="research"))
    assert out.code == "unknown_queue"
    assert out.reason == "queue 'research' does not exist; the queues are: default"


def test_the_queues_of_the_file_are_known_and_the_rest_rejected_naming_them(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(yaml.safe_dump(LAB))
    state = new_state(
        AdmissionSettings.from_env(
            {"GANGLINE_QUEUES_FILE": str(path), "GANGLINE_TOPIC_PREFIX": TOPICS.prefix}
        )
    )
    for node in cluster(("a", 2, 8)).registrations():
        state.restore(env(node))
    for queue in ("default", "research", "vision", "solo"):
        assert isinstance(ask(state, f"in-{queue}", queue=queue)[0], JobAdmitted), queue
    out = rejection(ask(state, "lost", queue="nope"))
    assert out.code == "unknown_queue"
    assert out.reason == "queue 'nope' does not exist; the queues are: default, research, solo, vision"


def test_a_file_is_authoritative_default_exists_only_if_it_lists_it() -> None:
    state = state_with_cluster({"queues": [{"name": "research", "quotas": {H100: {"nominal": 8}}}]})
    out = rejection(ask(state, "j", queue="default"))
    assert out.code == "unknown_queue" and out.reason.endswith("the queues are: research")


def test_a_job_over_what_its_queue_could_ever_hold_is_rejected_naming_queue_and_quota() -> None:
    state = state_with_cluster(LAB)
    # research: nominal 8, and vision lends its idle 4: 12 at most, while the cluster has 20 H100s.
    assert isinstance(ask(state, "twelve", queue="research", workers=3, gpus_per_worker=4)[0], JobAdmitted)
    out = rejection(ask(state, "sixteen", queue="research", workers=2, gpus_per_worker=8))
    assert (out.job_id, out.code) == ("sixteen", "exceeds_queue_quota")
    assert out.reason.startswith("queue research can never hold this job"), out.reason
    assert f"research uses 0 of its 8 {H100}" in out.reason and "needs 16" in out.reason, out.reason


def test_the_borrowing_limit_and_a_queue_without_a_cohort_bound_what_a_job_may_ask() -> None:
    state = state_with_cluster(LAB)
    assert isinstance(ask(state, "six", queue="vision", workers=3, gpus_per_worker=2)[0], JobAdmitted)
    over_limit = rejection(ask(state, "seven", queue="vision", workers=7, gpus_per_worker=1))
    assert over_limit.code == "exceeds_queue_quota"
    assert "vision uses 0 of its 4" in over_limit.reason and "borrowing limit of 2" in over_limit.reason
    alone = rejection(ask(state, "five", queue="solo", workers=5, gpus_per_worker=1))
    assert alone.code == "exceeds_queue_quota"
    assert "solo uses 0 of its 4" in alone.reason and "no cohort to borrow from" in alone.reason


def test_a_queue_without_quota_for_the_asked_gpu_type_can_never_run_it() -> None:
    state = state_with_cluster(LAB)
    l40s = NodeGroup(name="l", count=1, gpu_model="L40S-48GB", gpus_per_node=4, memory_mib=49152, leaf="x")
    for node in ClusterSpec(name="more", groups=(l40s,)).registrations():
        state.restore(env(node))
    out = rejection(ask(state, "typed", queue="research", gpu_type="L40S-48GB"))
    assert out.code == "exceeds_queue_quota"
    assert "research uses 0 of its 0 L40S-48GB" in out.reason, out.reason
    # Naming no type, the job is tried on the models research has quota for: H100, which fits.
    assert isinstance(ask(state, "untyped", queue="research")[0], JobAdmitted)
    assert isinstance(ask(state, "open", queue="default", gpu_type="L40S-48GB")[0], JobAdmitted)


def test_the_cluster_checks_come_first_and_unlimited_queues_are_not_quota_checked() -> None:
    state = state_with_cluster(LAB)
    too_big = rejection(ask(state, "huge", queue="research", workers=3, gpus_per_worker=8))
    assert too_big.code == "too_large"  # 24 GPUs: more than the cluster, whatever the quota
    [whole_cluster] = ask(state, "all", queue="default", workers=2, gpus_per_worker=8)
    assert isinstance(whole_cluster, JobAdmitted)


def test_a_rejection_listing_very_many_queues_is_cut_to_a_sentence() -> None:
    many = {"queues": [{"name": f"queue-{k:04d}-{'x' * 40}", "unlimited": True} for k in range(200)]}
    state = state_with_cluster(many)
    request = JobRequested(job_id=JobId("j"), queue="nope", workers=1, gpus_per_worker=1)
    [(_, envelope)] = on_request(env(request), state, now=T0)
    assert isinstance(envelope.data, JobRejected) and envelope.data.code == "unknown_queue"
    assert len(envelope.data.reason) == MAX_REASON
