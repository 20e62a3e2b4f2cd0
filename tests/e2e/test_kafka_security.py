"""The control plane on the real, secured broker: who may not connect, what the broker refuses each
principal (ACLs written from schemas/topics.yaml and deploy/kafka/access.yaml), and what the readers
dead-letter because its writer may not have said it (gangline.bus.trust), changing nothing."""

from __future__ import annotations

import contextlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    KafkaConnectionError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from e2e.harness import (
    ROOT,
    LogReader,
    Proc,
    Tasks,
    end_offsets,
    fake_cluster,
    private_topics,
    request_bytes,
    send_raw,
    service_env,
    start_pipeline,
)
from gangline.bus import DLQ_CODE, DLQ_REASON, DLQ_SOURCE_SERVICE, header
from gangline.bus.acl import apply_access, load_access
from gangline.bus.admin import load_catalogue
from gangline.bus.security import KafkaSecurity
from gangline.bus.trust import UNTRUSTED_WRITER, WriterSigner, derive_key
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.jobs import JobAdmitted, JobCompleted, JobFailed, JobRejected
from gangline.events.nodes import NodeFailed
from services.common.topics import TopicNames

ACCESS = ROOT / "deploy" / "kafka" / "access.yaml"
CATALOGUE = ROOT / "schemas" / "topics.yaml"
TOKENS = ROOT / "deploy" / "docker" / "api-tokens.dev.yaml"
QUEUES = ROOT / "deploy" / "docker" / "queues.yaml"
CREDENTIALS = yaml.safe_load((ROOT / "deploy" / "kafka" / "credentials.dev.yaml").read_text(encoding="utf-8"))

ONE_NODE = ClusterSpec(
    name="security",
    groups=(
        NodeGroup(name="n", count=1, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="l"),
    ),
)


def principal(name: str) -> KafkaSecurity:
    return KafkaSecurity(username=name, password=CREDENTIALS[name])


def event_bytes(kind: str, subject: str, data: dict[str, Any]) -> bytes:
    """A well-formed CloudEvents envelope of ``gangline.<kind>.v1``, as any client could write it."""
    return json.dumps(
        {
            "specversion": "1.0",
            "id": str(uuid.uuid4()),
            "source": "test/forger",
            "type": f"gangline.{kind}.v1",
            "time": datetime.now(UTC).isoformat(),
            "subject": subject,
            "datacontenttype": "application/json",
            "data": data,
        }
    ).encode()


@contextlib.asynccontextmanager
async def secured_topics(bootstrap: str, name: str) -> AsyncIterator[TopicNames]:
    """Private topics with the project's ACLs written for them (as the test session's super user)."""
    async with private_topics(bootstrap, name) as topics:
        group_prefix = f"g-{topics.prefix.rstrip('.')}"
        await apply_access(
            bootstrap,
            load_access(ACCESS),
            load_catalogue(CATALOGUE),
            topic_prefix=topics.prefix,
            group_prefix=group_prefix,
        )
        yield topics


async def _write(bootstrap: str, security: KafkaSecurity, topic: str, value: bytes = b"{}") -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, request_timeout_ms=10_000, **security.client_options()
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, value=value, key=b"k")
    finally:
        await producer.stop()


async def test_a_client_without_valid_credentials_is_refused(kafka_bootstrap: str) -> None:
    anonymous = KafkaSecurity(security_protocol="PLAINTEXT")
    wrong_password = KafkaSecurity(username="producer", password="not-the-password")
    for security in (anonymous, wrong_password):
        with pytest.raises(KafkaConnectionError):
            await _write(kafka_bootstrap, security, "jobs.requests")


async def test_a_producer_may_write_only_job_requests(kafka_bootstrap: str) -> None:
    async with secured_topics(kafka_bootstrap, "acl-producer") as topics:
        for name in ("producer", "team-a"):
            await _write(kafka_bootstrap, principal(name), topics.requests)  # allowed: the test can fail
            for topic in (topics.allocations, topics.health, topics.events, topics.inventory):
                with pytest.raises(TopicAuthorizationFailedError):
                    await _write(kafka_bootstrap, principal(name), topic)


async def test_an_agent_may_not_write_the_allocations_log(kafka_bootstrap: str) -> None:
    async with secured_topics(kafka_bootstrap, "acl-agent") as topics:
        await _write(kafka_bootstrap, principal("agent"), topics.heartbeats)
        for topic in (topics.allocations, topics.requests, topics.queue_status):
            with pytest.raises(TopicAuthorizationFailedError):
                await _write(kafka_bootstrap, principal("agent"), topic)


async def test_only_the_api_may_write_the_operators_cordons(kafka_bootstrap: str) -> None:
    async with secured_topics(kafka_bootstrap, "acl-operator") as topics:
        await _write(kafka_bootstrap, principal("api"), topics.operator)  # allowed: the test can fail
        for name in ("agent", "agent-n-0", "producer", "team-a", "placement", "node_health"):
            with pytest.raises(TopicAuthorizationFailedError):
                await _write(kafka_bootstrap, principal(name), topics.operator)


async def test_only_placement_may_open_placements_transactional_producer(kafka_bootstrap: str) -> None:
    async with secured_topics(kafka_bootstrap, "acl-txn") as topics:
        transactional_id = f"g-{topics.prefix.rstrip('.')}.placement.placement"

        async def open_as(name: str) -> None:
            producer = AIOKafkaProducer(
                bootstrap_servers=kafka_bootstrap,
                transactional_id=transactional_id,
                request_timeout_ms=10_000,
                **principal(name).client_options(),
            )
            try:
                await producer.start()
            finally:
                await producer.stop()

        for name in ("producer", "agent", "admission", "quota"):
            with pytest.raises(TransactionalIdAuthorizationFailed):
                await open_as(name)
        await open_as("placement")


@pytest.fixture
def trust_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[bytes]:
    """Readers check writers (this process's services), with a fresh master key; yields the key."""
    master = secrets.token_hex(32).encode()
    key_file = tmp_path / "trust.key"
    key_file.write_bytes(master)
    monkeypatch.setenv("GANGLINE_TRUST_ACCESS", str(ACCESS))
    monkeypatch.setenv("GANGLINE_TRUST_KEY_FILE", str(key_file))
    monkeypatch.setenv("GANGLINE_TRUST_TOKENS_FILE", str(TOKENS))
    yield master


async def test_forged_records_are_refused_or_dead_lettered_and_change_nothing(
    kafka_bootstrap: str, trust_on: bytes
) -> None:
    def signer(name: str) -> WriterSigner:
        return WriterSigner(name, derive_key(trust_on, name))

    async with secured_topics(kafka_bootstrap, "forgery") as topics:
        env = service_env(kafka_bootstrap, topics, queues_file=str(QUEUES))
        cluster = fake_cluster(kafka_bootstrap, topics, ONE_NODE)
        tasks = Tasks()
        dlqs = [topics.requests + ".dlq", topics.health + ".dlq", topics.inventory + ".dlq"]
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env)
            job = {"queue": "team-a", "workers": 1, "gpus_per_worker": 8, "duration_hint_s": 3600}
            await send_raw(
                kafka_bootstrap,
                topics.requests,
                [("victim", request_bytes("victim", **job))],
                security=principal("team-a"),
                signer=signer("team-a"),
            )
            async with LogReader(
                kafka_bootstrap, [topics.events, topics.allocations, topics.health, *dlqs]
            ) as log:

                def grant() -> AllocationGranted | None:
                    found = [g for g in log.of(topics.allocations, AllocationGranted) if g.job_id == "victim"]
                    return found[0] if found else None

                await log.until(lambda: grant() is not None, timeout_s=90)
                granted = grant()
                assert granted is not None
                node = granted.placements[0].node

                # The broker refuses: a producer releasing the allocation, an agent granting a job never
                # admitted, a tenant failing a node.
                released = event_bytes(
                    "allocation.released",
                    "victim",
                    {"job_id": "victim", "allocation_id": granted.allocation_id, "reason": "preempted"},
                )
                with pytest.raises(TopicAuthorizationFailedError):
                    await send_raw(
                        kafka_bootstrap,
                        topics.allocations,
                        [("victim", released)],
                        security=principal("producer"),
                        signer=signer("producer"),
                    )
                ghost = event_bytes(
                    "allocation.granted",
                    "ghost",
                    {**granted.model_dump(mode="json"), "job_id": "ghost", "allocation_id": "ghost-a1"},
                )
                with pytest.raises(TopicAuthorizationFailedError):
                    await send_raw(
                        kafka_bootstrap,
                        topics.allocations,
                        [("ghost", ghost)],
                        security=principal("agent"),
                        signer=signer("agent"),
                    )
                failed = event_bytes(
                    "node.failed", node, {"node": node, "code": "operator", "reason": "forged by a tenant"}
                )
                with pytest.raises(TopicAuthorizationFailedError):
                    await send_raw(
                        kafka_bootstrap,
                        topics.health,
                        [(node, failed)],
                        security=principal("team-b"),
                        signer=signer("team-b"),
                    )

                # The broker lets these through; the readers dead-letter them: an agent failing its node
                # (only node_health decides that), the same agent's record unsigned, another tenant
                # cancelling the job, a tenant submitting to another tenant's queue.
                await send_raw(
                    kafka_bootstrap,
                    topics.health,
                    [(node, failed)],
                    security=principal("agent-n-0"),
                    signer=signer("agent-n-0"),
                )
                await send_raw(
                    kafka_bootstrap, topics.health, [(node, failed)], security=principal("agent-n-0")
                )
                cancel = event_bytes(
                    "job.cancel_requested", "victim", {"job_id": "victim", "reason": "forged"}
                )
                stolen = {**job, "queue": "team-a"}
                await send_raw(
                    kafka_bootstrap,
                    topics.requests,
                    [("victim", cancel), ("intruder", request_bytes("intruder", **stolen))],
                    security=principal("team-b"),
                    signer=signer("team-b"),
                )
                # A record signed for another principal than the key's holder fails the signature too.
                forged_signature = WriterSigner("team-a", derive_key(b"not-the-master-key", "team-a"))
                await send_raw(
                    kafka_bootstrap,
                    topics.requests,
                    [("mimic", request_bytes("mimic", **job))],
                    security=principal("team-b"),
                    signer=forged_signature,
                )

                def reasons(topic: str, service: str) -> list[str]:
                    return [
                        (header(h, DLQ_REASON) or b"").decode()
                        for h in log.headers[topic]
                        if header(h, DLQ_CODE) == UNTRUSTED_WRITER.encode()
                        and header(h, DLQ_SOURCE_SERVICE) == service.encode()
                    ]

                def all_dead_lettered() -> bool:
                    # Each reader dead-letters what it may not believe: the ones that would act on it here.
                    health = [
                        reasons(topics.health + ".dlq", s) for s in ("node_health", "placement", "quota")
                    ]
                    admission = reasons(topics.requests + ".dlq", "admission")
                    placement = reasons(topics.requests + ".dlq", "placement")
                    return (
                        all(any("agent-n-0 may not write node.failed" in r for r in rs) for rs in health)
                        and all(any("no writer signature" in r for r in rs) for rs in health)
                        and any("team-b may not write job.cancel_requested" in r for r in placement)
                        and any("team-b may not submit to queue 'team-a'" in r for r in admission)
                        and any("signature of writer 'team-a' does not match" in r for r in admission)
                    )

                await log.until(all_dead_lettered, timeout_s=90)
                # A valid request sent after the forgeries is answered: every reader is past them.
                await send_raw(
                    kafka_bootstrap,
                    topics.requests,
                    [("after", request_bytes("after", **{**job, "queue": "team-b", "gpus_per_worker": 1}))],
                    security=principal("team-b"),
                    signer=signer("team-b"),
                )
                await log.until(
                    lambda: any(a.job_id == "after" for a in log.of(topics.events, JobAdmitted)), timeout_s=90
                )
                await log.poll()
                # The forged node.failed is in nodes.health (the broker let the agent write there), and
                # nothing followed from it or from the forged cancel: the victim still holds its GPUs.
                assert len(log.of(topics.health, NodeFailed)) == 2
                assert not [r for r in log.of(topics.allocations, AllocationReleased) if r.job_id == "victim"]
                assert not [f for f in log.of(topics.events, JobFailed) if f.job_id == "victim"]
                admitted = {e.job_id for e in log.of(topics.events, JobAdmitted)}
                assert not admitted & {"intruder", "mimic"}, log.summary()
                # The producer hears why, but the rejection names no job: a forger must not answer for one.
                refusals = [r for r in log.of(topics.events, JobRejected) if r.code == UNTRUSTED_WRITER]
                assert len(refusals) >= 2 and all(r.job_id is None for r in refusals), log.summary()
                tasks.check()
        finally:
            await tasks.stop()


DECIDERS = ("admission", "quota", "placement", "preemption", "node_health")


async def test_the_pipeline_runs_with_each_service_as_its_own_principal(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trust_on: bytes
) -> None:
    """The ACLs of access.yaml are enough for every service to do its work, and nothing more is granted:
    each decision service a subprocess under its own principal, the nodes as the `agent` principal, and
    readers checking writers (as make up runs them): each signs as itself and none is refused."""
    async with secured_topics(kafka_bootstrap, "principals") as topics:
        env = service_env(kafka_bootstrap, topics, queues_file=str(QUEUES))
        procs = {
            name: Proc(
                f"services.{name}",
                {**env, "GANGLINE_KAFKA_USERNAME": name, "GANGLINE_KAFKA_PASSWORD": CREDENTIALS[name]},
                tmp_path / f"{name}.log",
            )
            for name in DECIDERS
        }
        tasks = Tasks()
        with monkeypatch.context() as agent:
            # This process's own clients (the fake nodes, the log reader) are the nodes' principal.
            agent.setenv("GANGLINE_KAFKA_USERNAME", "agent")
            agent.setenv("GANGLINE_KAFKA_PASSWORD", CREDENTIALS["agent"])
            cluster = fake_cluster(kafka_bootstrap, topics, ONE_NODE)
            try:
                tasks.start("fake-nodes", cluster.run())
                await cluster.ready.wait()
                for proc in procs.values():
                    proc.start()
                job = {"queue": "team-a", "workers": 1, "gpus_per_worker": 4, "duration_hint_s": 1}
                await send_raw(
                    kafka_bootstrap,
                    topics.requests,
                    [("ok", request_bytes("ok", **job))],
                    security=principal("team-a"),
                    signer=WriterSigner("team-a", derive_key(trust_on, "team-a")),
                )
                async with LogReader(kafka_bootstrap, [topics.events, topics.allocations]) as log:

                    def done() -> bool:
                        tasks.check()
                        for name, proc in procs.items():
                            assert proc.alive(), f"{name} exited; see {proc.log_path}"
                        released = log.of(topics.allocations, AllocationReleased)
                        return any(r.job_id == "ok" for r in released) and any(
                            c.job_id == "ok" for c in log.of(topics.events, JobCompleted)
                        )

                    await log.until(done, timeout_s=120)
                for name, proc in procs.items():
                    assert proc.alive(), f"{name} exited; see {proc.log_path}"
                    assert "AuthorizationFailed" not in proc.log_path.read_text(), (
                        f"{name}: see {proc.log_path}"
                    )
            finally:
                await tasks.stop()
                for proc in procs.values():
                    proc.terminate()
        # Every writer signed as itself and may say what it said: nothing was dead-lettered.
        checked = (topics.requests, topics.events, topics.heartbeats, topics.inventory, topics.health)
        assert {t: await end_offsets(kafka_bootstrap, f"{t}.dlq") for t in checked} == dict.fromkeys(
            checked, 0
        )
