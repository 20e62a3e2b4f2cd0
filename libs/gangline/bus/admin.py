"""Topic administration: the catalogue in schemas/topics.yaml made real on a broker.

`ensure_topics` is idempotent: a topic that already exists is left exactly as it is (a differing
partition count is logged, never "fixed", since changing it would re-key the log). Unless told, it sizes
a topic's replication from the cluster it talks to (:func:`replication_for`): one copy on one broker,
three copies of which two must hold a write (`min.insync.replicas=2`) on three brokers or more.

    python -m gangline.bus.admin create-topics --bootstrap 127.0.0.1:9092 --catalogue schemas/topics.yaml
    python -m gangline.bus.admin wait --bootstrap 127.0.0.1:9092 --timeout-s 60 [--brokers 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gangline.bus.security import KafkaSecurity, client_options

log = logging.getLogger(__name__)

CleanupPolicy = Literal["delete", "compact"]

# Kafka protocol error codes that mean "already as wanted" for create and delete.
_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC_OR_PARTITION = 3


class TopicSpec(BaseModel):
    """One topic of the catalogue: its name, message key, size, retention and the events it carries."""

    # Extra catalogue fields (a description, an owner) are the catalogue's business, not the broker's.
    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")
    key: str
    partitions: int = Field(ge=1)
    cleanup_policy: CleanupPolicy = "delete"
    retention_ms: int | None = Field(default=None, ge=-1)
    event_types: tuple[str, ...] = ()
    dead_letter: str | None = None
    segment_ms: int | None = Field(default=None, ge=1)

    def broker_configs(self) -> dict[str, str]:
        """The topic-level configs this spec sets on the broker."""
        configs: dict[str, str] = {"cleanup.policy": self.cleanup_policy}
        if self.retention_ms is not None:
            configs["retention.ms"] = str(self.retention_ms)
        if self.segment_ms is not None:
            configs["segment.ms"] = str(self.segment_ms)
        return configs


def replication_for(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for topics on a cluster of ``brokers`` brokers.

    Three copies at most (a fourth buys little and costs a write's worth of traffic); with three, an
    acknowledged write (acks=all) is on two of them, so one broker may die without losing it and
    without stopping writes. With two brokers one copy may be missing (min.insync.replicas=1).
    """
    factor = max(1, min(3, brokers))
    return factor, (2 if factor >= 3 else 1)


class TopicCatalogue(BaseModel):
    """The whole catalogue file: names are unique and every dead-letter topic is in it too."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    topics: tuple[TopicSpec, ...]

    @model_validator(mode="after")
    def _names_are_unique_and_dead_letters_exist(self) -> TopicCatalogue:
        names = [t.name for t in self.topics]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"topics listed twice: {', '.join(duplicates)}")
        missing = sorted({t.dead_letter for t in self.topics if t.dead_letter and t.dead_letter not in names})
        if missing:
            raise ValueError(f"dead-letter topics not in the catalogue: {', '.join(missing)}")
        return self


class CatalogueError(ValueError):
    """The catalogue file cannot be read as a topic catalogue."""


def load_catalogue(path: str | Path) -> list[TopicSpec]:
    """Read and validate a topic catalogue (schemas/topics.yaml)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return list(TopicCatalogue.model_validate(raw).topics)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise CatalogueError(f"{path}: {exc}") from exc


def _topic_errors(response: Any) -> list[tuple[str, int, str | None]]:
    """(topic, error code, message) for each topic of a CreateTopics/DeleteTopics response."""
    obj = response.to_object()
    key = "topic_errors" if "topic_errors" in obj else "topic_error_codes"
    return [(e["topic"], e["error_code"], e.get("error_message")) for e in obj[key]]


async def _await_metadata(
    admin: AIOKafkaAdminClient, names: Sequence[str], *, present: bool, timeout_s: float
) -> None:
    """Wait until the broker's metadata shows `names` with leaders (or, if not `present`, not at all).

    The controller acknowledges a create or delete before the broker's metadata cache has it; callers
    should be able to use (or recreate) a topic as soon as we return.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        topics = await admin.describe_topics(list(names))
        if present:
            pending = [
                t["topic"]
                for t in topics
                if t["error_code"] != 0
                or not t["partitions"]
                or any(p["leader"] < 0 for p in t["partitions"])
            ]
        else:
            pending = [t["topic"] for t in topics if t["error_code"] != _UNKNOWN_TOPIC_OR_PARTITION]
        if not pending:
            return
        if time.monotonic() >= deadline:
            state = "ready" if present else "gone"
            raise KafkaError(f"topics not {state} after {timeout_s}s: {', '.join(sorted(pending))}")
        await asyncio.sleep(0.05)


async def started_admin(
    bootstrap: str, request_timeout_ms: int, security: KafkaSecurity | None = None
) -> AIOKafkaAdminClient:
    """A started admin client (close it); ``security`` None: the ``GANGLINE_KAFKA_*`` environment."""
    admin = AIOKafkaAdminClient(
        **client_options(security), bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms
    )
    try:
        await admin.start()
    except BaseException:
        await admin.close()
        raise
    return admin


async def ensure_topics(
    bootstrap: str,
    specs: Sequence[TopicSpec],
    *,
    replication_factor: int | None = None,
    timeout_s: float = 30.0,
    security: KafkaSecurity | None = None,
) -> list[str]:
    """Create the topics of `specs` that do not exist yet; return the names created (possibly none).

    ``replication_factor`` None: sized from the brokers the cluster has now (:func:`replication_for`),
    so wait for all of them first (:func:`wait_until_ready` ``min_brokers``). A replicated topic also
    gets its ``min.insync.replicas``. Idempotent and safe to run concurrently: a topic created by
    someone else meanwhile counts as done. On return every topic of `specs` is in the broker's
    metadata with a leader for each partition.
    """
    timeout_ms = int(timeout_s * 1000)
    admin = await started_admin(bootstrap, timeout_ms, security)
    try:
        if replication_factor is None:
            replication_factor, min_insync = replication_for(len((await admin.describe_cluster())["brokers"]))
        else:
            min_insync = replication_for(replication_factor)[1]
        replicated = {"min.insync.replicas": str(min_insync)} if replication_factor > 1 else {}
        existing = {t["topic"]: t for t in await admin.describe_topics()}
        for spec in specs:
            found = existing.get(spec.name)
            if found is not None and len(found["partitions"]) != spec.partitions:
                log.warning(
                    "topic %s has %d partitions, the catalogue says %d; left as it is",
                    spec.name,
                    len(found["partitions"]),
                    spec.partitions,
                )
        wanted = [s for s in specs if s.name not in existing]
        if not wanted:
            return []
        response = await admin.create_topics(
            [
                NewTopic(
                    name=s.name,
                    num_partitions=s.partitions,
                    replication_factor=replication_factor,
                    topic_configs=s.broker_configs() | replicated,
                )
                for s in wanted
            ],
            timeout_ms=timeout_ms,
        )
        created: list[str] = []
        failures: list[str] = []
        for topic, code, message in _topic_errors(response):
            if code == 0:
                created.append(topic)
            elif code != _TOPIC_ALREADY_EXISTS:
                failures.append(f"{topic}: error {code} {message or ''}".rstrip())
        if failures:
            raise KafkaError("could not create topics: " + "; ".join(failures))
        await _await_metadata(admin, [s.name for s in wanted], present=True, timeout_s=timeout_s)
        return created
    finally:
        await admin.close()


async def delete_topics(
    bootstrap: str, names: Sequence[str], *, timeout_s: float = 30.0, security: KafkaSecurity | None = None
) -> None:
    """Delete topics, waiting until the broker's metadata no longer has them; a missing one is no error."""
    if not names:
        return
    timeout_ms = int(timeout_s * 1000)
    admin = await started_admin(bootstrap, timeout_ms, security)
    try:
        response = await admin.delete_topics(list(names), timeout_ms=timeout_ms)
        failures = [
            f"{topic}: error {code}"
            for topic, code, _ in _topic_errors(response)
            if code not in (0, _UNKNOWN_TOPIC_OR_PARTITION)
        ]
        if failures:
            raise KafkaError("could not delete topics: " + "; ".join(failures))
        await _await_metadata(admin, names, present=False, timeout_s=timeout_s)
    finally:
        await admin.close()


async def wait_until_ready(
    bootstrap: str, *, timeout_s: float = 60.0, security: KafkaSecurity | None = None, min_brokers: int = 1
) -> None:
    """Return once the cluster answers a metadata request with a live controller and at least
    ``min_brokers`` registered brokers; raise TimeoutError if not."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            admin = await started_admin(bootstrap, request_timeout_ms=5000, security=security)
            try:
                cluster = await admin.describe_cluster()
            finally:
                await admin.close()
            if cluster.get("controller_id", -1) >= 0 and len(cluster.get("brokers") or ()) >= min_brokers:
                return
            last_error = RuntimeError(f"no controller or fewer than {min_brokers} brokers yet: {cluster}")
        except (KafkaError, OSError) as exc:
            last_error = exc
        await asyncio.sleep(0.2)
    raise TimeoutError(f"Kafka at {bootstrap} not ready after {timeout_s}s: {last_error}")


async def _create_topics(
    bootstrap: str, specs: Sequence[TopicSpec], replication_factor: int | None, wait_s: float, brokers: int
) -> list[str]:
    if wait_s > 0:
        await wait_until_ready(bootstrap, timeout_s=wait_s, min_brokers=brokers)
    return await ensure_topics(bootstrap, specs, replication_factor=replication_factor)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gangline.bus.admin", description="Create catalogue topics; wait for a broker."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create-topics", help="create the catalogue's topics that do not exist")
    create.add_argument("--bootstrap", required=True)
    create.add_argument("--catalogue", required=True, type=Path)
    create.add_argument(
        "--replication-factor", type=int, default=None, help="default: from the cluster's size (up to 3)"
    )
    create.add_argument("--brokers", type=int, default=1, help="with --wait-s: wait for this many brokers")
    create.add_argument("--wait-s", type=float, default=0.0, help="first wait this long for the broker")
    create.add_argument(
        "--access", type=Path, default=None, help="then write the ACLs of this access file (gangline.bus.acl)"
    )
    wait = sub.add_parser("wait", help="wait until the broker answers a metadata request")
    wait.add_argument("--bootstrap", required=True)
    wait.add_argument("--timeout-s", type=float, default=60.0)
    wait.add_argument("--brokers", type=int, default=1, help="wait until this many brokers are registered")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "wait":
            asyncio.run(wait_until_ready(args.bootstrap, timeout_s=args.timeout_s, min_brokers=args.brokers))
            return 0
        specs = load_catalogue(args.catalogue)
        created = asyncio.run(
            _create_topics(args.bootstrap, specs, args.replication_factor, args.wait_s, args.brokers)
        )
        names = ", ".join(created) or "none"
        print(f"topics: {len(specs)} in the catalogue, {len(created)} created ({names})")
        if args.access is not None:
            from gangline.bus.acl import apply_access, load_access  # acl builds on this module

            bindings = asyncio.run(apply_access(args.bootstrap, load_access(args.access), specs))
            print(f"acls: {len(bindings)} bindings written")
    except (CatalogueError, KafkaError, TimeoutError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
