"""The broker's ACLs, written by the project from the topic catalogue and the access file.

The access file (deploy/kafka/access.yaml) names each principal and what it may do, in catalogue
topic names: the topics it reads, the topics it writes, its consumer groups and whether it runs
transactional producers. :func:`acl_bindings` turns that into Kafka ACL bindings under a deployment's
topic and group prefixes, adding what the catalogue implies: whoever reads a topic may write its
dead-letter twin (readers dead-letter what they cannot use). Everything not granted is refused: the
broker runs the StandardAuthorizer with ``allow.everyone.if.no.acl.found=false``, and only its super
user (the project's admin tooling) needs no ACL.

    python -m gangline.bus.acl apply --bootstrap 127.0.0.1:9092 --catalogue schemas/topics.yaml \\
        --access deploy/kafka/access.yaml [--topic-prefix P] [--group-prefix gangline]
    python -m gangline.bus.acl show ...   (print the bindings instead)
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import yaml
from aiokafka.errors import KafkaError
from aiokafka.protocol.admin import CreateAclsRequest, CreateAclsRequest_v1, DescribeAclsRequest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gangline.bus.admin import CatalogueError, TopicSpec, load_catalogue, started_admin
from gangline.bus.security import KafkaSecurity
from gangline.events.topics import SNAPSHOTS_SUFFIX


class ResourceType(IntEnum):
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    READ = 3
    WRITE = 4
    CREATE = 5
    DESCRIBE = 8


_ALLOW = 3


@dataclass(frozen=True, order=True, slots=True)
class AclBinding:
    """One ALLOW rule: ``principal`` may do ``operation`` on the resource (from any host)."""

    principal: str
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: Operation

    def __str__(self) -> str:
        pattern = "*" if self.pattern_type is PatternType.PREFIXED else ""
        return (
            f"{self.principal} {self.operation.name} {self.resource_type.name}:{self.resource_name}{pattern}"
        )


class Grant(BaseModel):
    """What one principal may do, in catalogue names (``*`` patterns match catalogue topics)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    """Consumer groups under the group prefix: ``name`` is the group ``<prefix>.name`` and every group
    ``<prefix>.name.*`` (its leader lock); a name ending in ``.`` is only that prefix."""
    transactional: bool = False
    """May use the transactional ids of its groups (``<prefix>.<group>.*``), and no others."""
    tenant: str | None = None
    """For producers: the tenant of the API's token file whose queues this principal may submit to."""
    node: str | None = None
    """For agents: the one node this principal reports on (None: a fleet-wide agent principal)."""
    events: tuple[str, ...] = ()
    """Event types it may write on the topics readers check (:mod:`gangline.bus.trust`)."""
    queues: tuple[str, ...] | None = None
    """For producers without a tenant: the queues its job requests may name (None: any)."""
    dead_letters: bool = True
    """May write the dead-letter twin of each topic it reads (False: a read-only principal)."""
    streams: bool = False
    """A stream-processing app (faust, Kafka Streams) whose application id is its first group
    ``<prefix>.<group>``: it may create, read and write its own topics ``<prefix>.<group>-*`` (table
    changelogs, repartition topics) and use the transactional ids ``<prefix>.<group>-*``."""


class AccessFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    super_user: str = Field(min_length=1)
    principals: dict[str, Grant]


def load_access(path: str | Path) -> AccessFile:
    path = Path(path)
    try:
        return AccessFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise CatalogueError(f"{path}: {exc}") from exc


def _expand(patterns: Iterable[str], specs: Sequence[TopicSpec], *, who: str) -> list[TopicSpec]:
    """The catalogue topics ``patterns`` name; a pattern naming none is an error (a typo, a rename).

    A pattern never matches a dead-letter twin or a service's snapshot topic: those are named exactly."""
    twins = {s.dead_letter for s in specs if s.dead_letter}
    twins |= {s.name for s in specs if s.name.endswith(SNAPSHOTS_SUFFIX)}
    found: dict[str, TopicSpec] = {}
    for pattern in patterns:
        hits = [
            s
            for s in specs
            if fnmatch.fnmatchcase(s.name, pattern) and (s.name == pattern or s.name not in twins)
        ]
        if not hits:
            raise CatalogueError(f"access for {who}: {pattern!r} names no topic of the catalogue")
        found.update({s.name: s for s in hits})
    return list(found.values())


def acl_bindings(
    access: AccessFile, specs: Sequence[TopicSpec], *, topic_prefix: str = "", group_prefix: str = "gangline"
) -> list[AclBinding]:
    """Every ACL binding of ``access`` over the catalogue ``specs``, under the two prefixes (sorted)."""
    by_name = {s.name: s for s in specs}
    out: set[AclBinding] = set()
    for name, grant in access.principals.items():
        principal = f"User:{name}"

        def topic(spec_name: str, operation: Operation, principal: str = principal) -> None:
            out.add(
                AclBinding(
                    principal, ResourceType.TOPIC, topic_prefix + spec_name, PatternType.LITERAL, operation
                )
            )

        for spec in _expand(grant.read, specs, who=name):
            topic(spec.name, Operation.READ)
            if grant.dead_letters and spec.dead_letter and spec.dead_letter in by_name:
                topic(spec.dead_letter, Operation.WRITE)
        for spec in _expand(grant.write, specs, who=name):
            topic(spec.name, Operation.WRITE)
        for group in grant.groups:
            full = f"{group_prefix}.{group}"
            kinds = (
                [(full, PatternType.PREFIXED)]
                if group.endswith(".")
                else [
                    (full, PatternType.LITERAL),
                    (full + ".", PatternType.PREFIXED),
                ]
            )
            for resource, pattern in kinds:
                out.add(AclBinding(principal, ResourceType.GROUP, resource, pattern, Operation.READ))
            if grant.streams and group is grant.groups[0]:
                own = f"{full.rstrip('.')}-"
                for operation in (Operation.CREATE, Operation.READ, Operation.WRITE, Operation.DESCRIBE):
                    out.add(AclBinding(principal, ResourceType.TOPIC, own, PatternType.PREFIXED, operation))
                for operation in (Operation.WRITE, Operation.DESCRIBE):
                    out.add(
                        AclBinding(
                            principal, ResourceType.TRANSACTIONAL_ID, own, PatternType.PREFIXED, operation
                        )
                    )
            if grant.transactional:
                resource = full if group.endswith(".") else full + "."
                for operation in (Operation.WRITE, Operation.DESCRIBE):
                    out.add(
                        AclBinding(
                            principal,
                            ResourceType.TRANSACTIONAL_ID,
                            resource,
                            PatternType.PREFIXED,
                            operation,
                        )
                    )
    return sorted(out)


class _CreateAcls(CreateAclsRequest):  # type: ignore[misc]
    """CreateAcls with many creations in one request (aiokafka's builder takes one)."""

    def __init__(self, bindings: Sequence[AclBinding]) -> None:
        self._bindings = list(bindings)

    def build(self, request_struct_class: type[Any]) -> Any:
        if request_struct_class.API_VERSION < 1:
            raise KafkaError("the broker does not support CreateAcls v1 (prefixed ACLs)")
        return CreateAclsRequest_v1(
            [
                (b.resource_type, b.resource_name, b.pattern_type, b.principal, "*", b.operation, _ALLOW)
                for b in self._bindings
            ]
        )


async def apply_acls(
    bootstrap: str,
    bindings: Sequence[AclBinding],
    *,
    security: KafkaSecurity | None = None,
    timeout_s: float = 30,
) -> None:
    """Create ``bindings`` on the broker (idempotent: an existing binding is kept as it is)."""
    if not bindings:
        return
    admin = await started_admin(bootstrap, int(timeout_s * 1000), security)
    try:
        response = await admin._send_to_controller(_CreateAcls(bindings))
        failures = [
            f"{b}: error {code} {message or ''}".rstrip()
            for b, (code, message) in zip(bindings, response.creation_responses, strict=True)
            if code != 0
        ]
        if failures:
            raise KafkaError("could not create ACLs: " + "; ".join(failures))
        # The controller acknowledges before the broker's authorizer has the new ACLs: wait for it, so
        # that a client started right after us is judged by them.
        deadline = time.monotonic() + timeout_s
        while missing := set(bindings) - await _described(admin):
            if time.monotonic() > deadline:
                raise KafkaError(f"{len(missing)} ACLs not in effect after {timeout_s}s, e.g. {min(missing)}")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


async def _described(admin: Any) -> set[AclBinding]:
    """Every ALLOW binding the broker's authorizer holds now."""
    any_ = 1
    response = await admin._send_request(DescribeAclsRequest(any_, None, any_, None, None, any_, any_))
    if response.error_code != 0:
        raise KafkaError(f"DescribeAcls: error {response.error_code} {response.error_message or ''}".rstrip())
    return {
        AclBinding(principal, ResourceType(kind), name, PatternType(pattern), Operation(operation))
        for kind, name, pattern, acls in response.resources
        for principal, _host, operation, permission in acls
        if permission == _ALLOW
        and kind in set(ResourceType)
        and operation in set(Operation)
        and pattern in set(PatternType)
    }


async def apply_access(
    bootstrap: str,
    access: AccessFile,
    specs: Sequence[TopicSpec],
    *,
    topic_prefix: str = "",
    group_prefix: str = "gangline",
    security: KafkaSecurity | None = None,
) -> list[AclBinding]:
    """Write the ACLs of ``access`` for one deployment (its topic and group prefixes); returns them."""
    bindings = acl_bindings(access, specs, topic_prefix=topic_prefix, group_prefix=group_prefix)
    await apply_acls(bootstrap, bindings, security=security)
    return bindings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gangline.bus.acl", description="Write the broker's ACLs."
    )
    parser.add_argument("command", choices=("apply", "show"))
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--catalogue", required=True, type=Path)
    parser.add_argument("--access", required=True, type=Path)
    parser.add_argument("--topic-prefix", default="")
    parser.add_argument("--group-prefix", default="gangline")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        access = load_access(args.access)
        specs = load_catalogue(args.catalogue)
        bindings = acl_bindings(access, specs, topic_prefix=args.topic_prefix, group_prefix=args.group_prefix)
        if args.command == "show":
            print("\n".join(str(b) for b in bindings))
            return 0
        asyncio.run(apply_acls(args.bootstrap, bindings))
    except (CatalogueError, KafkaError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"acls: {len(bindings)} bindings for {len(access.principals)} principals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
