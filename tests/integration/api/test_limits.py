"""What the API takes, on the real database and broker: bounded bodies, a rate per tenant, strict types,
no NUL, and only problem documents as errors."""

from __future__ import annotations

import json
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from api_helpers import World, envelopes, seed

from gangline.bus import EventProducer
from gangline.bus.security import client_options
from gangline.events import jobs
from services.api.app import Resources, create_app
from services.api.auth import Authenticator, Tenant, TokenConfig
from services.api.settings import ApiSettings

MiB = 1024 * 1024
PROBLEM_KEYS = {"type", "title", "status", "detail"}


def uid(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:10]}"


def is_problem(response: httpx.Response, status: int, kind: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert set(body) >= PROBLEM_KEYS and body["status"] == status
    if kind is not None:
        assert body["type"] == f"urn:gangline:problem:{kind}"
    return body


class Streamed:
    """An ASGI request body of ``total`` bytes made chunk by chunk as it is read, counting what is read."""

    def __init__(self, total: int, chunk: int = 64 * 1024) -> None:
        self.total, self.chunk, self.read = total, chunk, 0
        self.piece = b" " * chunk

    async def receive(self) -> dict[str, Any]:
        if self.read >= self.total:
            return {"type": "http.disconnect"}
        size = min(self.chunk, self.total - self.read)
        self.read += size
        return {"type": "http.request", "body": self.piece[:size], "more_body": self.read < self.total}


async def call_asgi(
    world: World, body: Streamed, headers: list[tuple[bytes, bytes]]
) -> tuple[int, dict[str, str], bytes]:
    """POST /v1/jobs straight into the ASGI app with ``body``; the status, headers and body answered."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/jobs",
        "raw_path": b"/v1/jobs",
        "query_string": b"",
        "root_path": "",
        "server": ("api", 80),
        "client": ("127.0.0.1", 1234),
        "headers": [
            (b"host", b"api"),
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {world.research_token}".encode()),
            *headers,
        ],
    }
    await world.app(scope, body.receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, content


async def test_a_50_mb_body_that_says_its_length_is_refused_413_before_a_byte_is_read(world: World) -> None:
    body = Streamed(50 * MiB)
    status, headers, content = await call_asgi(world, body, [(b"content-length", str(body.total).encode())])
    assert status == 413 and headers["content-type"] == "application/problem+json"
    problem = json.loads(content)
    assert problem["type"] == "urn:gangline:problem:body-too-large" and problem["status"] == 413
    assert problem["detail"] == f"the request body ({50 * MiB} bytes) is over the limit of {MiB} bytes"
    assert body.read == 0


async def test_a_50_mb_chunked_body_is_refused_413_once_past_the_limit_in_bounded_memory(
    world: World,
) -> None:
    body = Streamed(50 * MiB)
    tracemalloc.start()
    try:
        status, _, content = await call_asgi(world, body, [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 413 and json.loads(content)["type"] == "urn:gangline:problem:body-too-large"
    # Read up to the limit and one chunk more, never the rest; what was held stays near the limit.
    assert MiB < body.read <= MiB + body.chunk
    assert peak < 8 * MiB, f"peak {peak / MiB:.1f} MiB while refusing a 50 MiB body"


async def test_a_body_under_the_limit_is_read_and_a_bad_content_length_is_400(world: World) -> None:
    fine = {"queue": world.research, "workers": 1, "gpus_per_worker": 1}
    accepted = await world.client.post("/v1/jobs", json=fine, headers=world.auth(world.research_token))
    assert accepted.status_code == 202
    for length in (b"-1", b"12x", b"1e3"):
        status, _, content = await call_asgi(world, Streamed(10), [(b"content-length", length)])
        assert (status, json.loads(content)["type"]) == (400, "urn:gangline:problem:bad-length")


@pytest.fixture
def ticking() -> list[float]:
    return [1000.0]


@pytest.fixture
async def limited(
    kafka_bootstrap: str, pg_dsn: str, pg_pool: asyncpg.Pool, ticking: list[float]
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """An app whose tenants may make 3 requests at once, then one every 2 s, on a clock the test moves."""
    tokens = {name: f"tok-{name}-{uuid.uuid4().hex}" for name in ("research", "vision")}
    auth = Authenticator(TokenConfig(tenants=tuple(Tenant.with_token(n, t) for n, t in tokens.items())))
    settings = ApiSettings.from_env(
        {}, kafka_bootstrap=kafka_bootstrap, pg_dsn=pg_dsn, rate_limit_per_s=0.5, rate_limit_burst=3
    )
    app = create_app(
        settings,
        resources=Resources(pg_pool, EventProducer(kafka_bootstrap)),
        authenticator=auth,
        monotonic=lambda: ticking[0],
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        yield client, {n: f"Bearer {t}" for n, t in tokens.items()}


async def test_a_tenant_over_its_rate_is_told_429_with_retry_after_and_others_are_not(
    limited: tuple[httpx.AsyncClient, dict[str, str]], ticking: list[float]
) -> None:
    client, bearer = limited
    research = {"Authorization": bearer["research"]}
    for _ in range(3):
        assert (await client.get("/v1/nodes", headers=research)).status_code == 200
    refused = await client.get("/v1/nodes", headers=research)
    problem = is_problem(refused, 429, "rate-limited")
    assert refused.headers["retry-after"] == "2"
    assert "'research' is over its rate limit of 0.5 requests per second (burst 3)" in problem["detail"]
    # Another tenant has its own bucket.
    assert (await client.get("/v1/nodes", headers={"Authorization": bearer["vision"]})).status_code == 200
    ticking[0] += 1.0  # half a token back: still refused, and told to wait the other second
    again = await client.get("/v1/nodes", headers=research)
    assert (again.status_code, again.headers["retry-after"]) == (429, "1")
    ticking[0] += 1.0
    assert (await client.get("/v1/nodes", headers=research)).status_code == 200
    # A refused request spends nothing: an unknown token is 401, not counted against anyone.
    assert (
        await client.get("/v1/nodes", headers={"Authorization": "Bearer nope-nope-nope"})
    ).status_code == 401


async def test_json_types_are_taken_as_they_are_never_coerced(world: World) -> None:
    base = {"queue": world.research, "workers": 1, "gpus_per_worker": 1}
    for field, value, kind in (
        ("workers", "1", "int_type"),
        ("gpus_per_worker", 1.5, "int_type"),
        ("priority", True, "int_type"),
        ("preemptible", "true", "bool_type"),
        ("preemptible", 1, "bool_type"),
        ("queue", 7, "string_type"),
    ):
        response = await world.client.post(
            "/v1/jobs", json={**base, field: value}, headers=world.auth(world.research_token)
        )
        problem = is_problem(response, 422, "invalid")
        assert [(e["field"], e["type"]) for e in problem["errors"]] == [(field, kind)], (field, value)
    # An integral number is an integer to JSON Schema, so to the OpenAPI: taken (schemathesis: refused).
    integral = await world.client.post(
        "/v1/jobs", json={**base, "gpus_per_worker": 1.0}, headers=world.auth(world.research_token)
    )
    assert integral.status_code == 202, integral.text
    cancel = await world.client.post(
        f"/v1/jobs/{uid('job')}/cancel", json={"reason": 5}, headers=world.auth(world.research_token)
    )
    assert [e["type"] for e in is_problem(cancel, 422)["errors"]] == ["string_type"]


async def test_a_nul_byte_anywhere_in_a_request_is_a_4xx_never_a_500(world: World) -> None:
    token = world.auth(world.research_token)
    for method, url in (
        ("GET", "/v1/jobs/a%00b"),
        ("POST", "/v1/jobs/a%00b/cancel"),
        ("GET", "/v1/jobs?queue=a%00b"),
        ("GET", "/v1/jobs?state=%00"),
        ("GET", "/v1/jobs?cursor=%00"),
        ("GET", "/v1/allocations?job_id=%00"),
        ("GET", "/v1/allocations?node=n%00"),
        ("GET", "/v1/queues?x=%00"),
        ("GET", "/v1/nodes/%00"),
    ):
        response = await world.client.request(method, url, headers=token)
        is_problem(response, 400, "nul-byte")
    for body in (
        {"queue": world.research, "workers": 1, "gpus_per_worker": 1, "command": ["run\x00"]},
        {"queue": world.research, "workers": 1, "gpus_per_worker": 1, "env": {"A": "b\x00"}},
        {"queue": world.research, "workers": 1, "gpus_per_worker": 1, "job_id": "j\x00"},
        {"queue": "team\x00", "workers": 1, "gpus_per_worker": 1},
    ):
        is_problem(await world.client.post("/v1/jobs", json=body, headers=token), 422, "invalid")
    is_problem(
        await world.client.post(f"/v1/jobs/{uid('j')}/cancel", json={"reason": "a\x00"}, headers=token), 422
    )


async def test_every_error_is_a_problem_document_and_every_route_documents_its_problems(
    world: World,
) -> None:
    is_problem(await world.client.get("/v1/jobs"), 401, "unauthenticated")
    is_problem(await world.client.get("/v1/nope", headers=world.auth(world.research_token)), 404)
    refused = await world.client.delete("/v1/jobs", headers=world.auth(world.research_token))
    is_problem(refused, 405)
    assert refused.headers["allow"] == "GET, HEAD, POST"  # every method of the path, not the first route's
    is_problem(
        await world.client.get("/v1/jobs", params={"limit": 0}, headers=world.auth(world.research_token)),
        422,
    )
    text = await world.client.post(
        "/v1/jobs",
        content=b"workers=1",
        headers={**world.auth(world.research_token), "content-type": "text/plain"},
    )
    is_problem(text, 415, "not-json")
    deep = await world.client.post(
        "/v1/jobs", content=b"[" * 10_000 + b"]" * 10_000, headers=world.auth(world.research_token)
    )
    is_problem(deep, 422, "invalid")
    spec = (await world.client.get("/openapi.json")).json()
    assert spec["components"]["schemas"]["Problem"]["required"] == ["type", "title", "status", "detail"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            errors = {code: r for code, r in operation["responses"].items() if code.startswith(("4", "5"))}
            assert {"400", "413"} <= set(errors), (method, path)
            if path != "/healthz":
                assert {"401", "422", "429"} <= set(errors), (method, path)
            for code, response in errors.items():
                assert list(response["content"]) == ["application/problem+json"], (method, path, code)


async def test_in_default_a_tenant_sees_and_cancels_only_the_jobs_it_submitted(
    world: World, pg_pool: asyncpg.Pool
) -> None:
    research, vision = world.auth(world.research_token), world.auth(world.vision_token)
    # One job the API accepted a moment ago (the ledger may not have it yet), one the ledger has.
    fresh = uid("fresh")
    submitted = await world.client.post(
        "/v1/jobs",
        json={"job_id": fresh, "queue": "default", "workers": 1, "gpus_per_worker": 1},
        headers=research,
    )
    assert submitted.status_code == 202
    recorded = uid("recorded")
    await seed(
        pg_pool,
        envelopes(
            (
                0,
                jobs.JobRequested(
                    job_id=recorded, queue="default", workers=1, gpus_per_worker=1, submitted_by="research"
                ),
            )
        ),
    )
    for job_id in (fresh, recorded):
        mine = await world.client.get(f"/v1/jobs/{job_id}", headers=research)
        assert mine.status_code == 200 and mine.json()["job"]["state"] == "requested"
        # To another tenant the job is not there at all: not readable, not cancellable.
        is_problem(await world.client.get(f"/v1/jobs/{job_id}", headers=vision), 404, "not-found")
        is_problem(await world.client.post(f"/v1/jobs/{job_id}/cancel", headers=vision), 404, "not-found")
        assert (
            await world.client.get(f"/v1/jobs/{job_id}", headers=world.auth(world.admin_token))
        ).status_code == 200
    assert (await world.client.post(f"/v1/jobs/{recorded}/cancel", headers=research)).status_code == 202
    listed = await world.client.get("/v1/jobs", params={"queue": "default", "limit": 500}, headers=research)
    assert recorded in {j["job_id"] for j in listed.json()["items"]}
    for params in ({"queue": "default", "limit": 500}, {"limit": 500}):
        others = await world.client.get("/v1/jobs", params=params, headers=vision)
        assert recorded not in {j["job_id"] for j in others.json()["items"]}
    # The same id again, before the ledger has the first: 409, not a second request.
    again = await world.client.post(
        "/v1/jobs",
        json={"job_id": fresh, "queue": "default", "workers": 1, "gpus_per_worker": 1},
        headers=vision,
    )
    is_problem(again, 409, "conflict")


async def test_an_event_over_the_logs_size_limit_is_413_not_503(
    kafka_bootstrap: str, pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    prefix = f"t-api-small-{uuid.uuid4().hex[:8]}."
    topic = prefix + "jobs.requests"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, **client_options())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": "4096"})])
        token = f"tok-{uuid.uuid4().hex}"
        settings = ApiSettings.from_env(
            {}, kafka_bootstrap=kafka_bootstrap, pg_dsn=pg_dsn, topic_prefix=prefix
        )
        async with EventProducer(kafka_bootstrap) as producer:
            app = create_app(
                settings,
                resources=Resources(pg_pool, producer),
                authenticator=Authenticator(
                    TokenConfig(tenants=(Tenant.with_token("ops", token, admin=True),))
                ),
            )
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                body = {"queue": "default", "workers": 1, "gpus_per_worker": 1, "env": {"BIG": "x" * 8192}}
                response = await client.post(
                    "/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}
                )
        is_problem(response, 413, "event-too-large")
    finally:
        await admin.delete_topics([topic])
        await admin.close()
