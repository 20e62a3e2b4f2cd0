"""The Strimzi resources of deploy/k8s/kafka.yaml: generated from the catalogue and the access file, up to
date, and granting on Kubernetes exactly what the local broker's ACLs grant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gangline.bus.acl import acl_bindings, load_access
from gangline.bus.admin import load_catalogue, replication_for
from gangline.bus.strimzi import k8s_name, kafka_users, main, render

ROOT = Path(__file__).resolve().parents[3]
CATALOGUE = ROOT / "schemas" / "topics.yaml"
ACCESS = ROOT / "deploy" / "kafka" / "access.yaml"
POM = ROOT / "deploy" / "kafka" / "pom.xml"
COMMITTED = ROOT / "deploy" / "k8s" / "kafka.yaml"


def committed() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(COMMITTED.read_text()) if d]


def test_the_committed_manifest_is_what_the_generator_makes() -> None:
    assert COMMITTED.read_text() == render(CATALOGUE, ACCESS, POM), (
        "deploy/k8s/kafka.yaml is out of date: python -m gangline.bus.strimzi --out deploy/k8s/kafka.yaml"
    )
    assert main(["--out", str(COMMITTED), "--check"]) == 0


def test_check_fails_on_a_stale_copy(tmp_path: Path) -> None:
    stale = tmp_path / "kafka.yaml"
    stale.write_text(COMMITTED.read_text().replace("partitions: 3", "partitions: 4", 1))
    assert main(["--out", str(stale), "--check"]) == 1
    assert main(["--out", str(stale)]) == 0
    assert stale.read_text() == COMMITTED.read_text()


def test_every_catalogue_topic_is_a_topic_with_three_replicas_and_two_in_sync() -> None:
    topics = {d["spec"]["topicName"]: d["spec"] for d in committed() if d["kind"] == "KafkaTopic"}
    specs = load_catalogue(CATALOGUE)
    assert set(topics) == {s.name for s in specs}
    assert replication_for(3) == (3, 2)
    for spec in specs:
        topic = topics[spec.name]
        assert (topic["partitions"], topic["replicas"]) == (spec.partitions, 3)
        assert topic["config"] == spec.broker_configs() | {"min.insync.replicas": "2"}
    [kafka] = [d for d in committed() if d["kind"] == "Kafka"]
    config = kafka["spec"]["kafka"]["config"]
    assert (config["transaction.state.log.replication.factor"], config["transaction.state.log.min.isr"]) == (
        3,
        2,
    )
    pools = {d["metadata"]["name"]: d["spec"] for d in committed() if d["kind"] == "KafkaNodePool"}
    assert {name: (p["replicas"], p["roles"]) for name, p in pools.items()} == {
        "controllers": (3, ["controller"]),
        "brokers": (3, ["broker"]),
    }


_OPERATIONS = {"Read": "READ", "Write": "WRITE", "Create": "CREATE", "Describe": "DESCRIBE"}
_TYPES = {"topic": "TOPIC", "group": "GROUP", "transactionalId": "TRANSACTIONAL_ID"}
_PATTERNS = {"literal": "LITERAL", "prefix": "PREFIXED"}


def test_each_kafka_user_holds_exactly_the_acls_of_the_access_file() -> None:
    access = load_access(ACCESS)
    specs = load_catalogue(CATALOGUE)
    expected = {
        (b.principal, b.resource_type.name, b.resource_name, b.pattern_type.name, b.operation.name)
        for b in acl_bindings(access, specs)
    }
    users = [d for d in committed() if d["kind"] == "KafkaUser"]
    found = set()
    for user in users:
        principal = user["metadata"]["annotations"]["gangline.io/principal"]
        assert user["metadata"]["name"] == k8s_name(principal)
        password = user["spec"]["authentication"]["password"]["valueFrom"]["secretKeyRef"]
        assert password == {"name": "gangline-kafka", "key": principal}
        for acl in user["spec"].get("authorization", {}).get("acls", []):
            resource = acl["resource"]
            for operation in acl["operations"]:
                found.add(
                    (
                        f"User:{principal}",
                        _TYPES[resource["type"]],
                        resource["name"],
                        _PATTERNS[resource["patternType"]],
                        _OPERATIONS[operation],
                    )
                )
    assert found == expected
    names = {u["metadata"]["annotations"]["gangline.io/principal"] for u in users}
    assert names == {access.super_user, *access.principals}
    [kafka] = [d for d in committed() if d["kind"] == "Kafka"]
    assert kafka["spec"]["kafka"]["authorization"]["superUsers"] == [access.super_user]


def test_the_access_file_travels_verbatim_for_the_readers() -> None:
    [config] = [d for d in committed() if d["kind"] == "ConfigMap"]
    assert config["metadata"]["name"] == "gangline-access"
    assert config["data"]["access.yaml"] == ACCESS.read_text()


def test_a_principal_that_cannot_be_a_kubernetes_name_is_refused(tmp_path: Path) -> None:
    assert k8s_name("node_health") == "node-health"
    bad = tmp_path / "access.yaml"
    bad.write_text("super_user: admin\nprincipals:\n  Bad.Name:\n    write: [jobs.requests]\n")
    with pytest.raises(ValueError, match=r"Bad\.Name"):
        kafka_users(load_access(bad), load_catalogue(CATALOGUE))
