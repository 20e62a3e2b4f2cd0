from __future__ import annotations

import json
from collections.abc import Mapping

from svc_helpers import T0, cluster, env

from gangline.bus import DLQ_CODE, DLQ_REASON, DLQ_TOPIC, DeadLetter, RecordMeta
from gangline.events.allocations import AllocationGranted, Placement
from gangline.events.base import Envelope
from gangline.events.codec import encode
from gangline.events.jobs import JobAdmitted, JobCancelRequested, JobRejected, JobRequested, JobSpec
from gangline.events.types import AllocationId, JobId, QueueName
from services.admission.handlers import (
    AdmissionState,
    grant_bytes_bound,
    on_request,
    rejection_of_dead_letter,
)
from services.common.queues import Queues, QueuesFile, load_queues, queues_of
from services.common.shell import Replayed
from services.common.topics import TopicNames

TOPICS = TopicNames(prefix="t.")
H100 = "H100-SXM5-80GB"  # the model of svc_helpers.cluster's nodes
META = RecordMeta(topic="t.jobs.requests", partition=0, offset=0, key=None, timestamp_ms=0, headers=())
LATER = RecordMeta(topic="t.jobs.requests", partition=0, offset=9, key=None, timestamp_ms=0, headers=())
QUEUES = {"queues": [{"name": "default", "unlimited": True}, {"name": "research"}]}


def queues(doc: Mapping[str, object]) -> Queues:
    return queues_of(QueuesFile.model_validate(doc))


def state_with_cluster(doc: Mapping[str, object] = QUEUES) -> AdmissionState:
    """20 H100s: two nodes of 8 and one of 4."""
    state = AdmissionState(topics=TOPICS, queues=queues(doc))
    for node in cluster(("a", 2, 8), ("b", 1, 4)).registrations():
        state.restore(env(node))
    return state


def ask(state: AdmissionState, job_id: str, **spec: object) -> list[JobAdmitted | JobRejected]:
    fields: dict[str, object] = {"queue": "default", "workers": 1, "gpus_per_worker": 1, **spec}
    outputs = on_request(env(JobRequested(job_id=JobId(job_id), **fields)), state, now=T0)  # type: ignore[arg-type]
    assert all(topic == TOPICS.events for topic, _ in outputs)
    return [envelope.data for _, envelope in outputs]  # type: ignore[misc]


def test_a_request_that_fits_is_admitted_with_its_spec() -> None:
    [out] = ask(state_with_cluster(), "j1", workers=2, gpus_per_worker=8)
    assert isinstance(out, JobAdmitted) and out.spec.total_gpus == 16


def test_policy_rejections_name_the_problem() -> None:
    state = state_with_cluster()
    cases = {
        "q": ({"queue": "nope"}, "unknown_queue", "queue 'nope' does not exist"),
        "t": ({"gpu_type": "TPU"}, "unknown_gpu_type", "GPU type 'TPU' does not exist"),
        "w": ({"gpus_per_worker": 9}, "too_large", "largest node has 8"),
        "g": ({"workers": 3, "gpus_per_worker": 8}, "too_large", "has 20 GPUs"),
        "m": ({"gpu_memory_mib": 200_000}, "too_large", "81920 MiB"),
    }
    for job_id, (spec, code, words) in cases.items():
        [out] = ask(state, job_id, **spec)
        assert isinstance(out, JobRejected), job_id
        assert (out.job_id, out.code) == (job_id, code)
        assert words in out.reason, out.reason


def test_no_nodes_registered_rejects_with_a_reason() -> None:
    [out] = ask(AdmissionState(topics=TOPICS, queues=load_queues(None)), "j")
    assert isinstance(out, JobRejected) and out.code == "no_capacity"


def test_a_retry_is_dropped_and_a_different_spec_under_the_same_id_rejected() -> None:
    state = state_with_cluster()
    assert isinstance(ask(state, "j1")[0], JobAdmitted)
    assert ask(state, "j1") == []
    [out] = ask(state, "j1", gpus_per_worker=2)
    assert isinstance(out, JobRejected) and out.code == "duplicate_job"


def test_admitted_jobs_are_known_after_a_restore() -> None:
    state = state_with_cluster()
    [admitted] = ask(state, "j1")
    restarted = state_with_cluster()
    restarted.restore(env(admitted))
    assert ask(restarted, "j1") == []


def test_cancelling_an_unknown_job_is_rejected() -> None:
    state = state_with_cluster()
    outputs = on_request(env(JobCancelRequested(job_id=JobId("ghost"))), state, now=T0)
    [(_, envelope)] = outputs
    assert isinstance(envelope.data, JobRejected) and envelope.data.code == "unknown_job"


def test_an_undecodable_request_gets_a_rejection_naming_its_job_when_readable() -> None:
    state = state_with_cluster()
    headers = [
        (DLQ_TOPIC, TOPICS.requests.encode()),
        (DLQ_CODE, b"schema_violation"),
        (DLQ_REASON, b"data.gpus_per_worker: must be >= 0"),
    ]
    raw = b'{"type": "gangline.job.requested.v1", "data": {"job_id": "bad-1", "gpus_per_worker": -1}}'
    [(topic, envelope)] = rejection_of_dead_letter(
        DeadLetter(topic=TOPICS.requests + ".dlq", key=b"bad-1", value=raw, headers=headers), state, now=T0
    )
    assert topic == TOPICS.events
    assert isinstance(envelope.data, JobRejected)
    assert envelope.data.job_id == "bad-1" and envelope.data.code == "schema_violation"
    assert "gpus_per_worker" in envelope.data.reason
    [(_, garbage)] = rejection_of_dead_letter(
        DeadLetter(topic="x", key=None, value=b"\xff", headers=headers), state, now=T0
    )
    assert isinstance(garbage.data, JobRejected) and garbage.data.job_id is None


def test_the_dedup_state_keeps_a_fixed_size_digest_per_job_not_its_spec() -> None:
    state = state_with_cluster()
    long_spec = {
        "command": ("python", "train.py", *(f"--flag-{k}" for k in range(50))),
        "env": {"A": "x" * 500},
    }
    assert isinstance(ask(state, "big", **long_spec)[0], JobAdmitted)
    assert isinstance(ask(state, "small")[0], JobAdmitted)
    assert {len(digest) for digest in state.admitted.values()} == {16}
    # The digest still tells a retry (dropped) from a different spec (rejected), after a restore too.
    restarted = state_with_cluster()
    for job_id, spec in (("big", long_spec), ("small", {})):
        fields: dict[str, object] = {"queue": "default", "workers": 1, "gpus_per_worker": 1, **spec}
        restarted.restore(env(JobAdmitted(job_id=JobId(job_id), spec=JobSpec.model_validate(fields))))
    assert ask(restarted, "big", **long_spec) == []
    [out] = ask(restarted, "big", **{**long_spec, "env": {"A": "y" * 500}})
    assert isinstance(out, JobRejected) and out.code == "duplicate_job"
    assert ask(restarted, "small") == []


def request(job_id: str, event_id: str, **spec: object) -> Envelope:
    fields: dict[str, object] = {"queue": "default", "workers": 1, "gpus_per_worker": 1, **spec}
    return env(JobRequested(job_id=JobId(job_id), **fields), event_id=event_id)  # type: ignore[arg-type]


def test_a_reused_event_id_with_another_body_is_rejected_not_replayed() -> None:
    state = state_with_cluster()
    decide = Replayed(lambda envelope, meta: on_request(envelope, state, now=T0))
    [(_, first)] = decide(request("x", "E"), META)
    assert isinstance(first.data, JobAdmitted)
    # The same record read again (its batch aborted and retried) gets the same outputs again...
    assert decide(request("x", "E"), META) == [(TOPICS.events, first)]
    # ... the same request in another record (a producer's retry) is an idempotent no-op ...
    assert decide(request("x", "E"), LATER) == []
    # ... and another job under the same id is a rejection, never x's admission again.
    [(_, rejected)] = decide(request("z", "E", workers=2), LATER)
    assert isinstance(rejected.data, JobRejected)
    assert (rejected.data.job_id, rejected.data.code) == ("z", "duplicate_event_id")
    assert rejected.id != first.id and "'E'" in rejected.data.reason
    # A cancel reusing it is another body too.
    [(_, cancel)] = on_request(env(JobCancelRequested(job_id=JobId("x")), event_id="E"), state, now=T0)
    assert isinstance(cancel.data, JobRejected) and cancel.data.code == "duplicate_event_id"
    assert "z" not in state.admitted


def test_a_reused_event_id_is_recognised_after_a_restore() -> None:
    state = state_with_cluster()
    [(_, admitted)] = on_request(request("x", "E"), state, now=T0)
    restarted = state_with_cluster()
    restarted.restore(admitted.model_copy(update={"causationid": "E"}))  # as the processor stamps it
    assert on_request(request("x", "E"), restarted, now=T0) == []
    [(_, out)] = on_request(request("z", "E"), restarted, now=T0)
    assert isinstance(out.data, JobRejected) and out.data.code == "duplicate_event_id"


def test_a_broken_request_with_a_trailing_newline_in_its_id_is_rejected_without_it() -> None:
    state = state_with_cluster()
    headers = [(DLQ_TOPIC, TOPICS.requests.encode()), (DLQ_CODE, b"schema_violation")]
    for value in (
        json.dumps({"subject": "job-x\n", "data": {"job_id": "job-x\n"}}).encode(),
        b"[" * 10_000 + b"]" * 10_000,  # json.loads would raise RecursionError
        b'{"data": {"job_id": ' + b"[" * 10_000 + b"]" * 10_000 + b"}}",
    ):
        letter = DeadLetter(topic=TOPICS.requests + ".dlq", key=None, value=value, headers=headers)
        [(_, envelope)] = rejection_of_dead_letter(letter, state, now=T0)
        assert isinstance(envelope.data, JobRejected) and envelope.data.job_id is None


def test_a_gang_whose_grant_would_not_fit_in_a_kafka_record_is_rejected() -> None:
    state = AdmissionState(topics=TOPICS, queues=queues(QUEUES))
    for node in cluster(("wide", 2000, 8)).registrations():  # 16,000 GPUs
        state.restore(env(node))
    [wide] = ask(state, "wide", workers=12_000, gpus_per_worker=1)
    assert isinstance(wide, JobRejected) and wide.code == "limit_exceeded"
    assert "fewer workers" in wide.reason
    # The same GPUs as fewer, larger workers fit.
    [fits] = ask(state, "fits", workers=1_500, gpus_per_worker=8)
    assert isinstance(fits, JobAdmitted)


def test_the_grant_size_bound_is_never_below_the_real_grant() -> None:
    nodes = list(cluster(("rack", 40, 8)).registrations())
    longest = (max(len(n.node) for n in nodes), max(len(g.id) for n in nodes for g in n.gpus))
    for workers, gpus in ((1, 1), (37, 8), (320, 1), (100, 2)):
        spec = JobSpec(queue="default", workers=workers, gpus_per_worker=gpus)
        placements = tuple(
            Placement(
                rank=r,
                node=nodes[r * gpus // 8].node,
                gpus=tuple(g.id for g in nodes[r * gpus // 8].gpus[(r * gpus) % 8 :][:gpus]),
            )
            for r in range(workers)
        )
        granted = AllocationGranted(
            job_id=JobId("j" * 128),
            allocation_id=AllocationId("a" * 160),
            queue=QueueName("q" * 63),
            gpu_type=H100,
            placements=placements,
        )
        envelope = env(granted, event_id="e" * 512).model_copy(
            update={"causationid": "c" * 512, "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        )
        assert grant_bytes_bound(spec, *longest) >= len(encode(envelope)), (workers, gpus)
