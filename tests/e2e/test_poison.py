"""Inputs that each froze a service for good, sent to the running pipeline over the real broker: every
one is answered (a rejection naming the problem, a bounded dead letter), no service dies, and a valid
job sent after them is granted. And a reused event id is a rejection, never a replay of old decisions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

from aiokafka import AIOKafkaProducer

from e2e.harness import (
    LogReader,
    Tasks,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_pipeline,
)
from gangline.bus import (
    DLQ_CODE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_SOURCE_SERVICE,
    MAX_DEAD_LETTER_BYTES,
    header,
)
from gangline.bus.security import client_options
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted
from gangline.events.jobs import JobAdmitted, JobCompleted, JobRejected

ONE_NODE = ClusterSpec(
    name="poison",
    groups=(
        NodeGroup(name="n", count=1, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="l"),
    ),
)

OK: dict[str, Any] = {"queue": "default", "workers": 1, "gpus_per_worker": 8, "duration_hint_s": 1}
"""A job that fills the one node for a second."""


def _body(job_id: str, *, event_id: str | None = None, **data: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"queue": "default", "workers": 1, "gpus_per_worker": 1, **data}
    body: dict[str, Any] = json.loads(request_bytes(job_id, **fields))
    if event_id is not None:
        body["id"] = event_id
    return body


async def _send_large(bootstrap: str, topic: str, values: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_options(), max_request_size=2**21)
    await producer.start()
    try:
        for key, value in values:
            await producer.send_and_wait(topic, value=value, key=key.encode())
    finally:
        await producer.stop()


async def test_poison_requests_are_rejected_and_the_pipeline_keeps_granting(kafka_bootstrap: str) -> None:
    async with private_topics(kafka_bootstrap, "poison") as topics:
        env = service_env(kafka_bootstrap, topics)
        cluster = fake_cluster(kafka_bootstrap, topics, ONE_NODE)
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            newline = _body("job-x")
            newline["subject"] = newline["data"]["job_id"] = "job-x\n"
            big_subject = _body("big-subject")
            big_subject["subject"] = "s" * 900_000
            big_env = _body("big-env", env={f"V{i}": "x" * 32_000 for i in range(32)})
            many_env = _body("many-env", env={f"V{i}": "x" for i in range(1000)})
            deep = b"[" * 10_000 + b"]" * 10_000
            deep_cancel = (
                json.dumps({**_body("deep-cancel"), "type": "gangline.job.cancel_requested.v1", "data": "@"})
                .encode()
                .replace(b'"@"', b"[" * 10_000 + b"]" * 10_000)
            )
            garbage = bytes(range(256)) * 4090  # 1 MiB less the broker's framing
            await _send_large(
                kafka_bootstrap,
                topics.requests,
                [
                    ("job-x", json.dumps(newline).encode()),
                    ("big-subject", json.dumps(big_subject).encode()),
                    ("deep", deep),
                    ("deep-cancel", deep_cancel),
                    ("big-env", json.dumps(big_env).encode()),
                    ("many-env", json.dumps(many_env).encode()),
                    ("garbage", garbage),
                ],
            )
            # Deep JSON among the lifecycle events too (placement, quota and preemption read them).
            await _send_large(kafka_bootstrap, topics.events, [("deep", deep)])
            await send_raw(kafka_bootstrap, topics.requests, [("ok-after", request_bytes("ok-after", **OK))])
            events_dlq = topics.events + ".dlq"
            async with LogReader(
                kafka_bootstrap, [topics.events, topics.allocations, topics.requests + ".dlq", events_dlq]
            ) as log:

                def granted() -> bool:
                    return any(g.job_id == "ok-after" for g in log.of(topics.allocations, AllocationGranted))

                def rejections() -> list[JobRejected]:
                    return log.of(topics.events, JobRejected)

                def dead_lettered_event_by(service: bytes) -> bool:
                    return any(header(h, DLQ_SOURCE_SERVICE) == service for h in log.headers[events_dlq])

                await log.until(
                    lambda: granted() and len(rejections()) >= 7 and dead_lettered_event_by(b"placement"),
                    timeout_s=90,
                    check=tasks.check,
                )
                letters = log.raw[topics.requests + ".dlq"]
                letter_headers = log.headers[topics.requests + ".dlq"]
            tasks.check()  # no service died
            codes = {r.job_id: r.code for r in rejections()}
            assert codes["big-subject"] == "schema_violation"
            assert codes["big-env"] == "limit_exceeded"
            assert codes["many-env"] == "limit_exceeded"
            assert None in codes  # the newline id, the deep JSON and the garbage name no readable job
            assert "job-x\n" not in codes
            assert sorted(r.code for r in rejections() if r.job_id is None) == ["malformed_message"] * 3 + [
                "schema_violation"
            ]
            assert [a.job_id for a in log.of(topics.events, JobAdmitted)] == ["ok-after"]
            # Each bad record dead-lettered once by each reader that gave up on it: admission all seven,
            # placement (which reads the cancels) the deep cancel too.
            by = [
                (header(h, DLQ_SOURCE_SERVICE), header(h, DLQ_PARTITION), header(h, DLQ_OFFSET))
                for h in letter_headers
            ]
            assert len(set(by)) == len(by)
            assert sum(1 for service, *_ in by if service == b"admission") == 7
            for value, headers in zip(letters, letter_headers, strict=True):
                weight = len(value or b"") + sum(len(k) + len(v) for k, v in headers)
                assert weight <= MAX_DEAD_LETTER_BYTES
                assert header(headers, DLQ_CODE) is not None
        finally:
            await tasks.stop()


async def test_a_reused_event_id_is_rejected_not_replayed(kafka_bootstrap: str) -> None:
    async with private_topics(kafka_bootstrap, "reuse") as topics:
        env = service_env(kafka_bootstrap, topics)
        cluster = fake_cluster(kafka_bootstrap, topics, ONE_NODE)
        tasks = Tasks()
        reused = str(uuid.uuid4())
        x = json.dumps(_body("x", event_id=reused, **OK)).encode()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            await send_raw(kafka_bootstrap, topics.requests, [("x", x)])
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                def done(job: str) -> bool:
                    return any(c.job_id == job for c in log.of(topics.events, JobCompleted))

                def rejected(job: str) -> list[JobRejected]:
                    return [r for r in log.of(topics.events, JobRejected) if r.job_id == job]

                await log.until(lambda: done("x"), timeout_s=60, check=tasks.check)
                # The cluster is filled, then z comes with x's id (and x's own retry, which is a no-op).
                filler = json.dumps(_body("filler", **{**OK, "duration_hint_s": 3600})).encode()
                z = json.dumps(_body("z", event_id=reused, **OK)).encode()
                await send_raw(kafka_bootstrap, topics.requests, [("x", filler), ("x", x), ("x", z)])
                await log.until(lambda: bool(rejected("z")), timeout_s=60, check=tasks.check)
                # After a restart admission still knows the id (from x's admission in the log).
                first_run = tasks.tasks.pop("admission")
                first_run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await first_run
                start_pipeline(tasks, env, only=("admission",))
                z2 = json.dumps(_body("z2", event_id=reused, **OK)).encode()
                await send_raw(kafka_bootstrap, topics.requests, [("x", x), ("x", z2)])
                await log.until(lambda: bool(rejected("z2")), timeout_s=60, check=tasks.check)

                admitted = [a.job_id for a in log.of(topics.events, JobAdmitted)]
                grants = [g.job_id for g in log.of(topics.allocations, AllocationGranted)]
            assert [r.code for r in rejected("z") + rejected("z2")] == ["duplicate_event_id"] * 2
            assert sorted(admitted) == ["filler", "x"]  # x's admission was not published again
            assert grants.count("x") == 1 and "z" not in grants
        finally:
            await tasks.stop()
