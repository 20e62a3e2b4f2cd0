"""An API app on the real database and broker, topics under a prefix of the module's own."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest_asyncio
from fastapi import FastAPI

from gangline.bus import Delivery, EventProducer, RecordMeta
from gangline.bus.admin import delete_topics, ensure_topics
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.registry import default_registry
from gangline.events.topics import topic_for
from services.api.app import Resources, create_app
from services.api.auth import Authenticator, Tenant, TokenConfig
from services.api.settings import ApiSettings
from services.common.queues import QueuesFile, queues_of
from services.common.topics import TopicNames
from services.ledger.store import project_batch

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class World:
    """The app under test and who may call it."""

    client: httpx.AsyncClient
    prefix: str
    research: str  # a queue only the research tenant (and admins) may use
    vision: str  # a queue only the vision tenant may use
    research_token: str
    vision_token: str
    admin_token: str
    app: FastAPI

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


@pytest_asyncio.fixture(loop_scope="session")
async def api_prefix(kafka_bootstrap: str) -> AsyncIterator[str]:
    prefix = f"t-api-{uuid.uuid4().hex[:8]}."
    specs = TopicNames(prefix=prefix).specs()
    await ensure_topics(kafka_bootstrap, specs)
    try:
        yield prefix
    finally:
        await delete_topics(kafka_bootstrap, [s.name for s in specs])


@pytest_asyncio.fixture(loop_scope="session")
async def world(
    kafka_bootstrap: str, api_prefix: str, pg_dsn: str, pg_pool: asyncpg.Pool
) -> AsyncIterator[World]:
    run = uuid.uuid4().hex[:6]
    research, vision = f"research-{run}", f"vision-{run}"
    tokens = {name: f"tok-{name}-{uuid.uuid4().hex}" for name in ("research", "vision", "ops")}
    auth = Authenticator(
        TokenConfig(
            tenants=(
                Tenant.with_token("research", tokens["research"], queues=(research,)),
                Tenant.with_token("vision", tokens["vision"], queues=(vision,)),
                Tenant.with_token("ops", tokens["ops"], admin=True),
            )
        )
    )
    queues = queues_of(
        QueuesFile.model_validate(
            {
                "cohorts": [{"name": f"lab-{run}"}],
                "queues": [
                    {"name": "default", "unlimited": True},
                    {
                        "name": research,
                        "cohort": f"lab-{run}",
                        "weight": 2,
                        "quotas": {"H100": {"nominal": 8}},
                    },
                    {
                        "name": vision,
                        "cohort": f"lab-{run}",
                        "quotas": {"H100": {"nominal": 2, "borrowing_limit": 2}},
                    },
                ],
            }
        )
    )
    settings = ApiSettings.from_env(
        {},
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=api_prefix,
        pg_dsn=pg_dsn,
        rate_limit_per_s=10_000,  # the rate limit has tests of its own (test_limits.py)
        rate_limit_burst=10_000,
    )
    async with EventProducer(kafka_bootstrap) as producer:
        app = create_app(settings, resources=Resources(pg_pool, producer), queues=queues, authenticator=auth)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield World(
                client,
                api_prefix,
                research,
                vision,
                tokens["research"],
                tokens["vision"],
                tokens["ops"],
                app,
            )


def envelopes(*events: tuple[int, Event]) -> list[Envelope]:
    return [
        make_envelope(e, event_id=str(uuid.uuid4()), source="tests/api", time=T0 + timedelta(seconds=s))
        for s, e in events
    ]


async def seed(pool: asyncpg.Pool, envs: Sequence[Envelope]) -> None:
    """Write events through the ledger's own projection code, as if it had read them from Kafka."""
    deliveries = [
        Delivery(env, RecordMeta(topic_for(env.data), 0, i, env.subject.encode(), 0, ()))
        for i, env in enumerate(envs)
    ]
    async with pool.acquire() as conn, conn.transaction():
        await project_batch(conn, deliveries, default_registry())
