"""The topic catalogue and the access file as Strimzi resources, for a Kafka cluster on Kubernetes.

What ``deploy/local/kafka.sh`` makes of schemas/topics.yaml and deploy/kafka/access.yaml on a laptop
(topics through :func:`gangline.bus.admin.ensure_topics`, ACLs through :func:`gangline.bus.acl.acl_bindings`),
said to the Strimzi operator instead: a ``Kafka`` in KRaft mode with two ``KafkaNodePool`` s (three
controllers, three brokers: a controller quorum that a broker's load cannot starve, and brokers that can
be scaled or rolled without touching the quorum), one ``KafkaTopic`` per catalogue topic (replicated as
:func:`gangline.bus.admin.replication_for` says for the brokers), and one ``KafkaUser`` per principal,
authenticated with SCRAM-SHA-512 (its password from the ``gangline-kafka`` Secret, key: the principal)
and holding exactly the ACL bindings :func:`gangline.bus.acl.acl_bindings` computes. The same two files
in, the same grants out: the broker on a laptop and the one on Kubernetes refuse the same things.

A principal whose name is not a Kubernetes object name (``node_health``) gets a KafkaUser named with
``-`` for ``_`` (the KafkaUser's name is its SCRAM user name): that workload authenticates as
``node-health`` and signs its records as ``node_health`` (GANGLINE_WRITER_PRINCIPAL), the access
file's name, which readers check.

    python -m gangline.bus.strimzi --out deploy/k8s/kafka.yaml          (write it)
    python -m gangline.bus.strimzi --out deploy/k8s/kafka.yaml --check  (exit 1 when it is out of date)
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gangline.bus.acl import (
    AccessFile,
    AclBinding,
    Operation,
    PatternType,
    ResourceType,
    acl_bindings,
    load_access,
)
from gangline.bus.admin import TopicSpec, load_catalogue, replication_for

CLUSTER = "gangline"
"""The Kafka resource's name: clients bootstrap from ``gangline-kafka-bootstrap:9092``."""
PASSWORDS = "gangline-kafka"
"""The Secret holding each principal's SCRAM password under the principal's name."""
BROKERS = 3
CONTROLLERS = 3
LISTENER_PORT = 9092

_RESOURCE = {
    ResourceType.TOPIC: "topic",
    ResourceType.GROUP: "group",
    ResourceType.CLUSTER: "cluster",
    ResourceType.TRANSACTIONAL_ID: "transactionalId",
}
_PATTERN = {PatternType.LITERAL: "literal", PatternType.PREFIXED: "prefix"}
_OPERATION = {
    Operation.READ: "Read",
    Operation.WRITE: "Write",
    Operation.CREATE: "Create",
    Operation.DESCRIBE: "Describe",
}
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def k8s_name(principal: str) -> str:
    """The KafkaUser name (and so the SCRAM user name) of an access-file principal."""
    name = principal.replace("_", "-")
    if len(name) > 253 or not _NAME.fullmatch(name):
        raise ValueError(f"principal {principal!r} cannot be named as a Kubernetes object ({name!r})")
    return name


def kafka_version(pom: Path) -> str:
    """The Kafka version the project pins (deploy/kafka/pom.xml), which the cluster runs too."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    version = ET.parse(pom).getroot().findtext("m:properties/m:kafka.version", namespaces=ns)
    if not version:
        raise ValueError(f"{pom}: no kafka.version property")
    return version


def _labels() -> dict[str, str]:
    return {"strimzi.io/cluster": CLUSTER, "app.kubernetes.io/part-of": "gangline"}


def kafka_cluster(
    version: str, *, brokers: int = BROKERS, controllers: int = CONTROLLERS
) -> list[dict[str, Any]]:
    """The Kafka (KRaft, SCRAM on the one listener, simple authorization) and its two node pools."""
    factor, min_insync = replication_for(brokers)
    kafka = {
        "apiVersion": "kafka.strimzi.io/v1",
        "kind": "Kafka",
        "metadata": {"name": CLUSTER, "labels": {"app.kubernetes.io/part-of": "gangline"}},
        "spec": {
            "kafka": {
                "version": version,
                "listeners": [
                    {
                        "name": "scram",
                        "port": LISTENER_PORT,
                        "type": "internal",
                        "tls": False,
                        "authentication": {"type": "scram-sha-512"},
                    }
                ],
                # Nothing is allowed that a KafkaUser's ACLs do not allow; the admin is the project's tooling.
                "authorization": {"type": "simple", "superUsers": ["admin"]},
                "config": {
                    "auto.create.topics.enable": False,
                    "default.replication.factor": factor,
                    "min.insync.replicas": min_insync,
                    "offsets.topic.replication.factor": factor,
                    "transaction.state.log.replication.factor": factor,
                    "transaction.state.log.min.isr": min_insync,
                    # The decision services' leader lock holds a 1.5 s session (fast failover); Kafka's
                    # default floor is 6 s (as deploy/kafka/server.properties.template).
                    "group.min.session.timeout.ms": 1000,
                },
            },
            "entityOperator": {"topicOperator": {}, "userOperator": {}},
        },
    }

    def pool(name: str, replicas: int, role: str, size: str) -> dict[str, Any]:
        return {
            "apiVersion": "kafka.strimzi.io/v1",
            "kind": "KafkaNodePool",
            "metadata": {"name": name, "labels": _labels()},
            "spec": {
                "replicas": replicas,
                "roles": [role],
                "storage": {
                    "type": "jbod",
                    "volumes": [
                        {
                            "id": 0,
                            "type": "persistent-claim",
                            "size": size,
                            "deleteClaim": False,
                            "kraftMetadata": "shared",
                        }
                    ],
                },
                "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
            },
        }

    return [
        kafka,
        pool("controllers", controllers, "controller", "20Gi"),
        pool("brokers", brokers, "broker", "200Gi"),
    ]


def kafka_topics(specs: Sequence[TopicSpec], *, brokers: int = BROKERS) -> list[dict[str, Any]]:
    """One KafkaTopic per catalogue topic: its partitions, retention, cleanup; replicated for ``brokers``."""
    factor, min_insync = replication_for(brokers)
    return [
        {
            "apiVersion": "kafka.strimzi.io/v1",
            "kind": "KafkaTopic",
            "metadata": {"name": k8s_name(spec.name), "labels": _labels()},
            "spec": {
                "topicName": spec.name,
                "partitions": spec.partitions,
                "replicas": factor,
                "config": spec.broker_configs() | {"min.insync.replicas": str(min_insync)},
            },
        }
        for spec in specs
    ]


def kafka_users(access: AccessFile, specs: Sequence[TopicSpec]) -> list[dict[str, Any]]:
    """One KafkaUser per principal (the super user included, with no ACLs: it needs none)."""
    bindings: dict[str, list[AclBinding]] = {}
    for binding in acl_bindings(access, specs):
        bindings.setdefault(binding.principal.removeprefix("User:"), []).append(binding)
    users = []
    for principal in [access.super_user, *access.principals]:
        spec: dict[str, Any] = {
            "authentication": {
                "type": "scram-sha-512",
                "password": {"valueFrom": {"secretKeyRef": {"name": PASSWORDS, "key": principal}}},
            }
        }
        if principal != access.super_user:
            spec["authorization"] = {"type": "simple", "acls": _acls(bindings.get(principal, []))}
        users.append(
            {
                "apiVersion": "kafka.strimzi.io/v1",
                "kind": "KafkaUser",
                "metadata": {
                    "name": k8s_name(principal),
                    "labels": _labels(),
                    "annotations": {"gangline.io/principal": principal},
                },
                "spec": spec,
            }
        )
    return users


def _acls(bindings: Sequence[AclBinding]) -> list[dict[str, Any]]:
    """Strimzi ACL rules, one per resource with all its operations (in the bindings' sorted order)."""
    by_resource: dict[tuple[ResourceType, str, PatternType], list[str]] = {}
    for b in bindings:
        by_resource.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
            _OPERATION[b.operation]
        )
    rules = []
    for (kind, name, pattern), operations in sorted(by_resource.items()):
        resource: dict[str, Any] = {"type": _RESOURCE[kind]}
        if kind is not ResourceType.CLUSTER:
            resource |= {"name": name, "patternType": _PATTERN[pattern]}
        rules.append(
            {"type": "allow", "resource": resource, "operations": sorted(set(operations)), "host": "*"}
        )
    return rules


def access_config(access: Path) -> dict[str, Any]:
    """The access file itself, as the ConfigMap the readers check writers against (GANGLINE_TRUST_ACCESS)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gangline-access", "labels": {"app.kubernetes.io/part-of": "gangline"}},
        "data": {"access.yaml": access.read_text(encoding="utf-8")},
    }


def render(catalogue: Path, access: Path, pom: Path) -> str:
    """The whole generated manifest, as committed in deploy/k8s/kafka.yaml."""
    specs = load_catalogue(catalogue)
    docs = [
        *kafka_cluster(kafka_version(pom)),
        *kafka_topics(specs),
        *kafka_users(load_access(access), specs),
        access_config(access),
    ]
    head = (
        "# Generated by `python -m gangline.bus.strimzi --out deploy/k8s/kafka.yaml` from\n"
        "# schemas/topics.yaml, deploy/kafka/access.yaml and deploy/kafka/pom.xml; do not edit by\n"
        "# hand (tests/unit/bus/test_strimzi.py fails when it is out of date). Strimzi 1.0\n"
        "# (kafka.strimzi.io/v1), KRaft.\n"
    )
    return head + yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=110)


def main(argv: Sequence[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[3]
    parser = argparse.ArgumentParser(
        prog="python -m gangline.bus.strimzi", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--catalogue", type=Path, default=root / "schemas" / "topics.yaml")
    parser.add_argument("--access", type=Path, default=root / "deploy" / "kafka" / "access.yaml")
    parser.add_argument("--pom", type=Path, default=root / "deploy" / "kafka" / "pom.xml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)
    text = render(args.catalogue, args.access, args.pom)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(
                f"{args.out} is out of date: run python -m gangline.bus.strimzi --out {args.out}",
                file=sys.stderr,
            )
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
