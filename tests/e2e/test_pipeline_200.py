"""200 requests from a plain Kafka producer through admission, quota and placement to simulated nodes."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer

from e2e.harness import ROOT, LogReader, Tasks, audit_allocations, private_topics, service_env
from gangline.bus.security import client_options
from gangline.bus.trust import default_signer
from gangline.cluster_spec import load_cluster_spec
from gangline.events.allocations import AllocationGranted
from gangline.events.jobs import JobRejected
from services.admission.settings import AdmissionSettings
from services.admission.wiring import main as admission_main
from services.agent.fake import FakeCluster
from services.placement.settings import PlacementSettings
from services.placement.wiring import main as placement_main
from services.quota.settings import QuotaSettings
from services.quota.wiring import main as quota_main


def request(job_id: str, **data: Any) -> bytes:
    """A job.requested envelope as any producer would write it: plain JSON, no Gangline code."""
    return json.dumps(
        {
            "specversion": "1.0",
            "id": str(uuid.uuid4()),
            "source": "test/raw-producer",
            "type": "gangline.job.requested.v1",
            "time": datetime.now(UTC).isoformat(),
            "subject": job_id,
            "datacontenttype": "application/json",
            "data": {"job_id": job_id, **data},
        }
    ).encode()


def workload(rng: random.Random) -> tuple[list[tuple[str, bytes]], dict[str, str], list[bytes]]:
    """(key, bytes) in send order; invalid job id → expected rejection code; the malformed payloads."""
    messages: list[tuple[str, bytes]] = []
    invalid: dict[str, str] = {}
    malformed = [b"not json at all", b'{"specversion": "1.0", "id": ', b"\xff\xfe\x00garbage"]
    bad_specs: list[tuple[dict[str, Any], str]] = [
        ({"queue": "default", "workers": 1, "gpus_per_worker": 0}, "schema_violation"),
        ({"queue": "default", "workers": 1, "gpus_per_worker": -2}, "schema_violation"),
        ({"queue": "default", "workers": 0, "gpus_per_worker": 1}, "schema_violation"),
        (
            {"queue": "default", "workers": 40, "gpus_per_worker": 8, "gpu_type": "H100-SXM5-80GB"},
            "too_large",
        ),
        ({"queue": "default", "workers": 1, "gpus_per_worker": 16}, "too_large"),
        ({"queue": "no-such-queue", "workers": 1, "gpus_per_worker": 1}, "unknown_queue"),
        ({"queue": "default", "workers": 1, "gpus_per_worker": 1, "gpu_type": "TPU-v5"}, "unknown_gpu_type"),
    ]
    n_invalid = 0
    for i in range(200 - len(malformed)):
        job_id = f"job-{i:03d}"
        if i % 10 == 3:
            spec, code = bad_specs[n_invalid % len(bad_specs)]
            n_invalid += 1
            invalid[job_id] = code
        elif i % 10 == 7:
            # a gang: 2-4 workers of 2-8 GPUs, sometimes held inside one NVLink domain or leaf
            spec = {
                "queue": "default",
                "workers": rng.choice([2, 4]),
                "gpus_per_worker": rng.choice([2, 4]),
                "gpu_type": "H100-SXM5-80GB",
                "duration_hint_s": 2,
                "topology": {"level": "leaf", "mode": "required"},
            }
        else:
            spec = {
                "queue": "default",
                "workers": 1,
                "gpus_per_worker": rng.choice([1, 1, 2, 4]),
                "duration_hint_s": rng.choice([1, 2, 3]),
                "priority": rng.choice([0, 0, 10]),
            }
        messages.append((job_id, request(job_id, **spec)))
    for k, raw in enumerate(malformed):
        messages.insert(50 * k + 25, (f"broken-{k}", raw))
    return messages, invalid, malformed


async def test_200_requests_exactly_one_grant_each(kafka_bootstrap: str) -> None:
    messages, invalid, malformed = workload(random.Random(5))
    valid = {key for key, _ in messages if key.startswith("job-") and key not in invalid}
    async with private_topics(kafka_bootstrap, "p200") as topics:
        env = service_env(kafka_bootstrap, topics)
        cluster = FakeCluster(
            spec=load_cluster_spec(ROOT / "deploy" / "clusters" / "default.yaml"),
            bootstrap=kafka_bootstrap,
            topics=topics,
            group_id=f"g-{topics.prefix}fake",
            time_scale=0.1,
            heartbeat_s=1.0,
        )
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            tasks.start("admission", admission_main(AdmissionSettings.from_env(env)))
            tasks.start("quota", quota_main(QuotaSettings.from_env(env)))
            tasks.start("placement", placement_main(PlacementSettings.from_env(env)))
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, **client_options())
            await producer.start()
            try:
                signer = default_signer()  # the session's principal signs, as readers check writers
                for key, raw in messages:
                    headers = signer.headers(topics.requests, key.encode(), raw) if signer is not None else []
                    await producer.send(topics.requests, value=raw, key=key.encode(), headers=headers)
                await producer.flush()
            finally:
                await producer.stop()

            dlq = f"{topics.requests}.dlq"
            async with LogReader(kafka_bootstrap, [topics.events, topics.allocations, dlq]) as log:

                def granted() -> set[str]:
                    return {g.job_id for g in log.of(topics.allocations, AllocationGranted)}

                def rejected() -> set[str | None]:
                    return {r.job_id for r in log.of(topics.events, JobRejected)}

                def done() -> bool:
                    return (
                        valid <= granted()
                        and set(invalid) <= rejected()
                        and len(log.raw[dlq]) >= len(malformed)
                    )

                await log.until(done, timeout_s=120, check=tasks.check)
                # Let stragglers (a duplicate would come right behind) land before counting.
                for _ in range(10):
                    await log.poll()

            grants = log.of(topics.allocations, AllocationGranted)
            per_job: dict[str, int] = {}
            for g in grants:
                per_job[g.job_id] = per_job.get(g.job_id, 0) + 1
            assert set(per_job) == valid
            assert all(count == 1 for count in per_job.values()), {j: c for j, c in per_job.items() if c != 1}
            rejections = {r.job_id: r for r in log.of(topics.events, JobRejected)}
            for job_id, code in invalid.items():
                assert rejections[job_id].code == code, (job_id, rejections[job_id])
            assert not set(rejections) & valid
            # Each unreadable record is dead-lettered once (by admission, the owner of the topic).
            for raw in malformed:
                assert log.raw[dlq].count(raw) == 1
            schema_violations = sum(code == "schema_violation" for code in invalid.values())
            assert len(log.raw[dlq]) == len(malformed) + schema_violations
            assert audit_allocations(log.stamped[topics.allocations]) == []
            print(
                f"valid={len(valid)} grants={len(grants)} rejected={len(rejections)} "
                f"dlq={len(log.raw[dlq])} completed={cluster.stats.completed} "
                f"events={len(log.events[topics.events])}"
            )
            # No gang is ever partial: every grant places exactly the workers asked for.
            wanted = {key: json.loads(raw)["data"]["workers"] for key, raw in messages if key in valid}
            for g in grants:
                assert len(g.placements) == wanted[g.job_id], g
                assert sorted(p.rank for p in g.placements) == list(range(wanted[g.job_id]))
        finally:
            await tasks.stop()
