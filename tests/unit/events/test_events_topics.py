"""The topic catalogue: the fixed public names, a dead-letter twin for each, and routing by event type."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gangline.events import jobs, nodes, queues, schemagen, topics
from gangline.events.registry import Registry, default_registry

TOPICS_YAML = Path(__file__).resolve().parents[3] / "schemas" / "topics.yaml"


def test_public_topic_names_are_the_design_names() -> None:
    assert topics.PUBLIC_TOPICS == (
        "jobs.requests",
        "jobs.events",
        "allocations.log",
        "nodes.inventory",
        "nodes.heartbeats",
        "nodes.health",
        "nodes.operator",
        "queues.status",
    )
    assert topics.topic_for(nodes.NodeCordoned) == topics.topic_for(nodes.NodeUncordoned) == "nodes.operator"
    assert topics.dead_letter_topic("jobs.requests") == "jobs.requests.dlq"


def test_every_public_topic_has_a_dead_letter_twin_with_the_same_key() -> None:
    for name in topics.PUBLIC_TOPICS:
        public, dlq = topics.topic_spec(name), topics.topic_spec(topics.dead_letter_topic(name))
        assert public.dead_letter == dlq.name
        assert dlq.key == public.key and dlq.event_types == () and dlq.dead_letter is None


def test_job_topics_are_co_partitioned() -> None:
    job_topics = [spec for spec in topics.CATALOGUE if spec.key == "job_id" and spec.dead_letter is not None]
    assert {spec.partitions for spec in job_topics} == {topics.JOB_PARTITIONS}
    assert topics.topic_spec(topics.ALLOCATIONS_LOG).key == "job_id"


def test_events_route_to_their_topic_by_type() -> None:
    assert topics.topic_for(jobs.JobRequested) == topics.JOBS_REQUESTS
    assert topics.topic_for(jobs.JobPending) == topics.JOBS_EVENTS
    assert (
        topics.topic_for(nodes.NodeHeartbeatV1)
        == topics.topic_for(nodes.NodeHeartbeat)
        == topics.NODES_HEARTBEATS
    )
    assert (
        topics.topic_for(nodes.NodeFailed(node="n0", code="operator", reason="drained"))
        == topics.NODES_HEALTH
    )
    assert topics.topic_for(queues.QueueStatus) == topics.QUEUES_STATUS
    with pytest.raises(KeyError):
        topics.topic_spec("jobs.unknown")


def test_queue_status_is_a_table_keyed_by_queue() -> None:
    spec = topics.topic_spec(topics.QUEUES_STATUS)
    assert (spec.key, spec.cleanup_policy, spec.retention_ms, spec.partitions) == (
        "queue",
        "compact",
        None,
        1,
    )


def test_catalogue_is_consistent_with_the_default_registry() -> None:
    assert schemagen.check_catalogue(default_registry()) == []


def test_catalogue_naming_an_unregistered_type_is_caught() -> None:
    kept = [cls for cls in default_registry().event_classes() if cls is not jobs.JobStarted]
    partial = Registry(kept, nodes.UPCASTERS)
    assert schemagen.check_catalogue(partial) == [
        "topic jobs.events names gangline.job.started.v1, which is not a registered event type"
    ]
    with pytest.raises(ValueError, match="topic catalogue does not match the registry"):
        schemagen.generate(partial)


def test_topics_yaml_is_the_catalogue() -> None:
    loaded = yaml.safe_load(TOPICS_YAML.read_text())["topics"]
    assert [t["name"] for t in loaded] == [spec.name for spec in topics.CATALOGUE]
    for entry, spec in zip(loaded, topics.CATALOGUE, strict=True):
        assert entry["key"] == spec.key
        assert entry["partitions"] == spec.partitions
        assert entry["cleanup_policy"] == spec.cleanup_policy
        assert entry["retention_ms"] == spec.retention_ms
        assert entry["event_types"] == spec.wire_types()
        assert entry.get("dead_letter") == spec.dead_letter
