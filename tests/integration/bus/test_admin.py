"""ensure_topics against the real broker: the catalogue's settings land, and a second call changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from gangline.bus.admin import TopicSpec, delete_topics, ensure_topics, wait_until_ready
from gangline.bus.security import client_options

pytestmark = pytest.mark.kafka


@pytest.fixture
async def admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, **client_options())
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def _partitions(admin: AIOKafkaAdminClient, name: str) -> int:
    (topic,) = await admin.describe_topics([name])
    assert topic["error_code"] == 0, topic
    return len(topic["partitions"])


async def _configs(admin: AIOKafkaAdminClient, name: str) -> dict[str, str]:
    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    (resource,) = response.to_object()["resources"]
    return {e["config_names"]: e["config_value"] for e in resource["config_entries"]}


def _unique(prefix: str) -> str:
    return f"t-admin-{prefix}-{uuid.uuid4().hex[:8]}"


async def test_creates_topics_with_the_catalogue_settings_and_a_second_call_is_a_no_op(
    kafka_bootstrap: str, admin: AIOKafkaAdminClient
) -> None:
    log = TopicSpec(
        name=_unique("log"),
        key="job_id",
        partitions=3,
        cleanup_policy="delete",
        retention_ms=3_600_000,
    )
    table = TopicSpec(name=_unique("table"), key="node", partitions=2, cleanup_policy="compact")
    try:
        created = await ensure_topics(kafka_bootstrap, [log, table])
        assert sorted(created) == sorted([log.name, table.name])

        assert await _partitions(admin, log.name) == 3
        assert await _partitions(admin, table.name) == 2
        log_configs = await _configs(admin, log.name)
        assert log_configs["cleanup.policy"] == "delete"
        assert log_configs["retention.ms"] == "3600000"
        assert (await _configs(admin, table.name))["cleanup.policy"] == "compact"

        # Same specs again, and a spec that disagrees with what exists: nothing is created or changed.
        resized = log.model_copy(update={"partitions": 6})
        assert await ensure_topics(kafka_bootstrap, [resized, table]) == []
        assert await _partitions(admin, log.name) == 3
    finally:
        await delete_topics(kafka_bootstrap, [log.name, table.name])


async def test_concurrent_callers_create_each_topic_once(
    kafka_bootstrap: str, admin: AIOKafkaAdminClient
) -> None:
    specs = [TopicSpec(name=_unique(f"race{i}"), key="job_id", partitions=1) for i in range(3)]
    try:
        results = await asyncio.gather(*(ensure_topics(kafka_bootstrap, specs) for _ in range(4)))
        created = [name for result in results for name in result]
        # Racing creators may all see the topics as missing; the broker still creates each once.
        assert sorted(created) == sorted(s.name for s in specs)
        existing = set(await admin.list_topics())
        assert {s.name for s in specs} <= existing
    finally:
        await delete_topics(kafka_bootstrap, [s.name for s in specs])


async def test_deleted_topics_disappear_and_deleting_a_missing_topic_is_fine(
    kafka_bootstrap: str, admin: AIOKafkaAdminClient
) -> None:
    spec = TopicSpec(name=_unique("gone"), key="job_id", partitions=1)
    await ensure_topics(kafka_bootstrap, [spec])
    assert spec.name in await admin.list_topics()

    await delete_topics(kafka_bootstrap, [spec.name])
    await delete_topics(kafka_bootstrap, [spec.name])  # already gone: not an error
    assert spec.name not in await admin.list_topics()


async def test_topic_factory_creates_a_topic_and_its_dead_letter_twin(
    topic_factory: Callable[..., Awaitable[TopicSpec]], admin: AIOKafkaAdminClient
) -> None:
    spec = await topic_factory(partitions=2)
    assert spec.name.startswith("t-test_topic_factory")
    assert spec.dead_letter == f"{spec.name}.dlq"
    assert await _partitions(admin, spec.name) == 2
    assert await _partitions(admin, spec.dead_letter) == 1


async def test_the_catalogue_topics_exist(kafka_bootstrap: str, admin: AIOKafkaAdminClient) -> None:
    await wait_until_ready(kafka_bootstrap, timeout_s=10)
    existing = set(await admin.list_topics())
    public = {
        "jobs.requests",
        "jobs.events",
        "allocations.log",
        "nodes.inventory",
        "nodes.heartbeats",
        "nodes.health",
    }
    assert public <= existing
    assert {f"{name}.dlq" for name in public} <= existing
