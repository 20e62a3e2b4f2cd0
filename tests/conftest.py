"""Session fixtures for the real Kafka broker and PostgreSQL server.

Nothing starts unless a test asks for it: `kafka_bootstrap` and `pg_dsn` use what already answers
(started by `make infra-up`, or named by GANGLINE_KAFKA_BOOTSTRAP / GANGLINE_PG_DSN), and otherwise
start it with deploy/local/*.sh once for the session and stop it at the end. Ports follow
GANGLINE_KAFKA_PORT (9092) and GANGLINE_PG_PORT (55432). A test that uses these fixtures is marked
`kafka` / `postgres` automatically, so `pytest -m "not kafka and not postgres"` needs no infrastructure.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
import yaml

from gangline.bus.admin import CleanupPolicy, TopicSpec, delete_topics, ensure_topics
from gangline.store.migrate import migrate
from gangline.store.pool import create_pool
from services.common.topics import TopicNames

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "schemas" / "topics.yaml"

_KAFKA_FIXTURES = {"kafka_bootstrap", "topic_factory", "service_topics"}
_PG_FIXTURES = {"pg_dsn", "pg_pool"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _KAFKA_FIXTURES:
            item.add_marker(pytest.mark.kafka)
        if names & _PG_FIXTURES:
            item.add_marker(pytest.mark.postgres)


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


DEV_CREDENTIALS = ROOT / "deploy" / "kafka" / "credentials.dev.yaml"


def _authenticate_as_admin() -> None:
    """Test clients are the broker's super user (deploy/local/kafka.sh's dev credentials), unless the
    environment already names a principal or turns security off (GANGLINE_KAFKA_SECURITY_PROTOCOL=PLAINTEXT).
    Tests of the ACLs connect as other principals explicitly."""
    if (
        os.environ.get("GANGLINE_KAFKA_USERNAME")
        or os.environ.get("GANGLINE_KAFKA_SECURITY_PROTOCOL") == "PLAINTEXT"
    ):
        return
    credentials = yaml.safe_load(DEV_CREDENTIALS.read_text(encoding="utf-8"))
    os.environ["GANGLINE_KAFKA_USERNAME"] = "admin"
    os.environ["GANGLINE_KAFKA_PASSWORD"] = str(credentials["admin"])


TRUST_ACCESS = ROOT / "deploy" / "kafka" / "access.yaml"
TRUST_TOKENS = ROOT / "deploy" / "docker" / "api-tokens.dev.yaml"


def _trust_on(session_dir: Path) -> None:
    """Readers check who wrote each record (gangline.bus.trust), as in make up and compose: a fresh master
    key for the session, the project's access file and the dev tenants. The test process and every service
    it starts (tasks, or processes that inherit the environment) hold the master key, so what they write is
    signed as their principal (the session's: admin). GANGLINE_TRUST=off, or a GANGLINE_TRUST_ACCESS of the
    caller's own, leaves the environment as it is."""
    if os.environ.get("GANGLINE_TRUST") == "off" or os.environ.get("GANGLINE_TRUST_ACCESS"):
        return
    key = session_dir / "trust.key"
    key.write_text(secrets.token_hex(32))
    key.chmod(0o600)
    os.environ["GANGLINE_TRUST_ACCESS"] = str(TRUST_ACCESS)
    os.environ["GANGLINE_TRUST_KEY_FILE"] = str(key)
    os.environ["GANGLINE_TRUST_TOKENS_FILE"] = str(TRUST_TOKENS)


def _script(name: str, action: str) -> None:
    subprocess.run([str(ROOT / "deploy" / "local" / name), action], cwd=ROOT, check=True)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a ready Kafka broker whose catalogue topics exist; clients authenticate as the super
    user and readers check writers (:func:`_trust_on`)."""
    explicit = os.environ.get("GANGLINE_KAFKA_BOOTSTRAP")
    port = int(os.environ.get("GANGLINE_KAFKA_PORT", "9092"))
    bootstrap = explicit or f"127.0.0.1:{port}"
    _authenticate_as_admin()
    _trust_on(tmp_path_factory.mktemp("trust"))
    host, _, port_text = bootstrap.rpartition(":")
    started = False
    if not _answers(host, int(port_text)):
        if explicit:
            pytest.fail(f"GANGLINE_KAFKA_BOOTSTRAP={explicit} does not answer")
        _script("kafka.sh", "up")
        started = True
    elif CATALOGUE.exists():
        # Someone else's broker: make sure the catalogue topics are there (idempotent).
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gangline.bus.admin",
                "create-topics",
                "--bootstrap",
                bootstrap,
                "--catalogue",
                str(CATALOGUE),
            ],
            cwd=ROOT,
            check=True,
        )
    os.environ["GANGLINE_KAFKA_BOOTSTRAP"] = bootstrap
    try:
        yield bootstrap
    finally:
        if started:
            _script("kafka.sh", "down")


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of a migrated `gangline` database."""
    explicit = os.environ.get("GANGLINE_PG_DSN")
    port = int(os.environ.get("GANGLINE_PG_PORT", "55432"))
    dsn = explicit or f"postgresql://postgres@127.0.0.1:{port}/gangline"
    started = False
    if not explicit and not _answers("127.0.0.1", port):
        _script("postgres.sh", "up")
        started = True
    os.environ["GANGLINE_PG_DSN"] = dsn
    try:
        yield dsn
    finally:
        if started:
            _script("postgres.sh", "down")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pg_pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(pg_dsn, min_size=1, max_size=10)
    try:
        # Someone else's server may be behind on migrations (idempotent, serialised by a lock).
        async with pool.acquire() as conn:
            await migrate(conn)
        yield pool
    finally:
        await pool.close()


TopicFactory = Callable[..., Awaitable[TopicSpec]]


def _test_name(request: pytest.FixtureRequest, limit: int) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-")[:limit]


@pytest_asyncio.fixture(loop_scope="session")
async def service_topics(kafka_bootstrap: str, request: pytest.FixtureRequest) -> AsyncIterator[TopicNames]:
    """The catalogue's topics (what the services read and write) under a fresh prefix for this test,
    ``t-<test>-<uuid8>.``; deleted after the test."""
    topics = TopicNames(prefix=f"t-{_test_name(request, 40)}-{uuid.uuid4().hex[:8]}.")
    await ensure_topics(kafka_bootstrap, topics.specs())
    try:
        yield topics
    finally:
        await delete_topics(kafka_bootstrap, [s.name for s in topics.specs()])


@pytest_asyncio.fixture(loop_scope="session")
async def topic_factory(kafka_bootstrap: str, request: pytest.FixtureRequest) -> AsyncIterator[TopicFactory]:
    """`await topic_factory(partitions=3)` creates `t-<test>-<uuid8>` and its `.dlq` twin for this test.

    Returns the TopicSpec (its `dead_letter` names the twin); both are deleted after the test.
    """
    created: list[str] = []
    test_name = _test_name(request, 80)

    async def make(
        partitions: int = 1,
        *,
        cleanup_policy: CleanupPolicy = "delete",
        retention_ms: int | None = None,
        key: str = "job_id",
    ) -> TopicSpec:
        name = f"t-{test_name}-{uuid.uuid4().hex[:8]}"
        dlq = TopicSpec(name=f"{name}.dlq", key=key, partitions=1)
        spec = TopicSpec(
            name=name,
            key=key,
            partitions=partitions,
            cleanup_policy=cleanup_policy,
            retention_ms=retention_ms,
            dead_letter=dlq.name,
        )
        created.extend([spec.name, dlq.name])
        await ensure_topics(kafka_bootstrap, [spec, dlq])
        return spec

    try:
        yield make
    finally:
        await delete_topics(kafka_bootstrap, created)
