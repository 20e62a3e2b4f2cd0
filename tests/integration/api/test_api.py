"""The API with httpx against the real database and broker: auth, validation, publishing, reads, paging."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
from aiokafka import AIOKafkaConsumer
from api_helpers import T0, World, envelopes, seed

from gangline.bus import EventProducer
from gangline.bus.security import client_options
from gangline.events import allocations, jobs, nodes, queues
from gangline.events.base import make_envelope
from gangline.events.codec import decode
from services.api.app import Resources, create_app
from services.api.auth import Authenticator, TokenConfig
from services.api.settings import ApiSettings


def uid(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:10]}"


async def read_topic(bootstrap: str, topic: str, want: int) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, **client_options(), auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        found: list[Any] = []
        for _ in range(50):
            batch = await consumer.getmany(timeout_ms=200)
            found += [decode(r.value) for rs in batch.values() for r in rs]
            if len(found) >= want:
                break
        return found
    finally:
        await consumer.stop()


async def test_every_endpoint_but_health_and_docs_needs_a_valid_token(world: World) -> None:
    for path in ("/v1/jobs", "/v1/queues", "/v1/nodes", "/v1/allocations", "/v1/jobs/x"):
        assert (await world.client.get(path)).status_code == 401
        assert (await world.client.get(path, headers=world.auth("wrong-token-123"))).status_code == 401
    assert (await world.client.get("/healthz")).json() == {"status": "ok"}
    spec = (await world.client.get("/openapi.json")).json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/queues", "/v1/nodes"} <= set(
        spec["paths"]
    )
    assert (await world.client.get("/docs")).status_code == 200


async def test_a_submitted_job_is_published_as_job_requested_by_its_tenant(
    world: World, kafka_bootstrap: str
) -> None:
    job_id = uid("job")
    body = {"job_id": job_id, "queue": world.research, "workers": 2, "gpus_per_worker": 8, "priority": 3}
    response = await world.client.post("/v1/jobs", json=body, headers=world.auth(world.research_token))
    assert response.status_code == 202, response.text
    assert response.json()["status_url"] == f"/v1/jobs/{job_id}"
    published = [
        e for e in await read_topic(kafka_bootstrap, world.prefix + "jobs.requests", 1) if e.subject == job_id
    ]
    assert len(published) == 1
    event = published[0]
    assert isinstance(event.data, jobs.JobRequested)
    assert (event.data.workers, event.data.gpus_per_worker, event.data.priority) == (2, 8, 3)
    assert event.data.submitted_by == "research" and event.source == "gangline/api"
    assert event.id == response.json()["event_id"]


async def test_an_invalid_job_is_refused_with_422_naming_the_field(world: World) -> None:
    body = {"queue": world.research, "workers": 0, "gpus_per_worker": 8, "colour": "blue"}
    response = await world.client.post("/v1/jobs", json=body, headers=world.auth(world.research_token))
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert (problem["type"], problem["title"], problem["status"]) == (
        "urn:gangline:problem:invalid",
        "Invalid request",
        422,
    )
    problems = {p["field"]: p["message"] for p in problem["errors"]}
    assert problem["detail"] == "; ".join(p["message"] for p in problem["errors"])
    assert problems["workers"] == "workers: must be >= 1 (got 0)"
    assert problems["colour"] == "colour: is not a field of this event"


async def test_a_tenant_may_submit_to_its_own_queues_and_default_only(world: World) -> None:
    def body(queue: str) -> dict[str, object]:
        return {"queue": queue, "workers": 1, "gpus_per_worker": 1}

    refused = await world.client.post(
        "/v1/jobs", json=body(world.vision), headers=world.auth(world.research_token)
    )
    assert refused.status_code == 403
    assert refused.json()["detail"] == f"tenant 'research' may not act on queue '{world.vision}'"
    for token in (world.research_token, world.vision_token):
        assert (
            await world.client.post("/v1/jobs", json=body("default"), headers=world.auth(token))
        ).status_code == 202
    admin = await world.client.post(
        "/v1/jobs", json=body(world.vision), headers=world.auth(world.admin_token)
    )
    assert admin.status_code == 202


async def test_a_job_shows_its_events_and_why_it_is_pending(world: World, pg_pool: asyncpg.Pool) -> None:
    job_id = uid("job")
    request = jobs.JobRequested(job_id=job_id, queue=world.research, workers=2, gpus_per_worker=8)
    reason = jobs.PendingReason(
        code="topology",
        constraint="topology",
        message="needs 16 GPUs in one NVLink domain; largest free is 8",
        details={"needed_gpus": 16, "largest_free_domain": 8},
        unblock="wait for a free NVLink domain or relax topology to leaf",
    )
    await seed(
        pg_pool,
        envelopes(
            (0, request),
            (1, jobs.JobAdmitted(job_id=job_id, spec=request.spec())),
            (2, jobs.JobQueued(job_id=job_id, queue=world.research)),
            (3, jobs.JobPending(job_id=job_id, reasons=(reason,))),
        ),
    )
    response = await world.client.get(f"/v1/jobs/{job_id}", headers=world.auth(world.research_token))
    assert response.status_code == 200
    body = response.json()
    assert body["job"]["state"] == "pending"
    assert [e["type"] for e in body["events"]] == [
        "gangline.job.requested.v1",
        "gangline.job.admitted.v1",
        "gangline.job.queued.v1",
        "gangline.job.pending.v1",
    ]
    assert body["why"]["pending"] is True
    assert body["why"]["summary"] == "needs 16 GPUs in one NVLink domain; largest free is 8"
    assert body["why"]["reasons"][0]["details"] == {"needed_gpus": 16, "largest_free_domain": 8}
    other = await world.client.get(f"/v1/jobs/{job_id}", headers=world.auth(world.vision_token))
    assert other.status_code == 403 and world.research in other.json()["detail"]
    assert (
        await world.client.get(f"/v1/jobs/{job_id}", headers=world.auth(world.admin_token))
    ).status_code == 200
    missing = await world.client.get(f"/v1/jobs/{uid('nope')}", headers=world.auth(world.admin_token))
    assert missing.status_code == 404


async def test_a_job_shows_its_size_history_across_elastic_resizes(
    world: World, pg_pool: asyncpg.Pool
) -> None:
    """A 1..4-worker job granted 1 worker, grown to 4, shrunk to 2: three sizes, the live one now."""
    job_id = uid("el")
    request = jobs.JobRequested(
        job_id=job_id, queue=world.research, workers=1, min_workers=1, max_workers=4, gpus_per_worker=1
    )

    def grant(n: int, workers: int) -> allocations.AllocationGranted:
        ranks = tuple(allocations.Placement(rank=r, node="n0", gpus=(f"gpu{r}",)) for r in range(workers))
        return allocations.AllocationGranted(
            job_id=job_id,
            allocation_id=f"{job_id}.{n}",
            queue=world.research,
            placements=ranks,
            resizes=f"{job_id}.{n - 1}" if n > 1 else None,
        )

    def resized(n: int) -> allocations.AllocationReleased:
        return allocations.AllocationReleased(job_id=job_id, allocation_id=f"{job_id}.{n}", reason="resized")

    await seed(
        pg_pool,
        envelopes(
            (0, request),
            (1, jobs.JobAdmitted(job_id=job_id, spec=request.spec())),
            (2, grant(1, 1)),
            (3, resized(1)),
            (3, grant(2, 4)),
            (4, resized(2)),
            (4, grant(3, 2)),
        ),
    )
    response = await world.client.get(f"/v1/jobs/{job_id}", headers=world.auth(world.research_token))
    assert response.status_code == 200
    body = response.json()
    assert [(s["workers"], s["release_reason"], s["resizes"]) for s in body["sizes"]] == [
        (1, "resized", None),
        (4, "resized", f"{job_id}.1"),
        (2, None, f"{job_id}.2"),
    ]
    assert body["job"]["workers_now"] == 2
    assert len(body["allocations"]) == 1 + 4 + 2


async def test_cancel_publishes_a_cancel_request_for_a_job_the_caller_may_act_on(
    world: World, pg_pool: asyncpg.Pool, kafka_bootstrap: str
) -> None:
    job_id = uid("job")
    await seed(
        pg_pool,
        envelopes((0, jobs.JobRequested(job_id=job_id, queue=world.vision, workers=1, gpus_per_worker=1))),
    )
    refused = await world.client.post(f"/v1/jobs/{job_id}/cancel", headers=world.auth(world.research_token))
    assert refused.status_code == 403
    response = await world.client.post(
        f"/v1/jobs/{job_id}/cancel", json={"reason": "wrong dataset"}, headers=world.auth(world.vision_token)
    )
    assert response.status_code == 202
    found = [
        e for e in await read_topic(kafka_bootstrap, world.prefix + "jobs.requests", 1) if e.subject == job_id
    ]
    assert [(type(e.data).__name__, e.data.reason, e.data.requested_by) for e in found] == [
        ("JobCancelRequested", "wrong dataset", "vision")
    ]
    duplicate = await world.client.post(
        "/v1/jobs",
        json={"job_id": job_id, "queue": world.vision, "workers": 1, "gpus_per_worker": 1},
        headers=world.auth(world.vision_token),
    )
    assert duplicate.status_code == 409


async def test_jobs_page_newest_first_without_gaps_or_repeats_and_filter_by_state(
    world: World, pg_pool: asyncpg.Pool
) -> None:
    ids = [uid("page") for _ in range(5)]
    await seed(
        pg_pool,
        envelopes(
            *[
                (i, jobs.JobRequested(job_id=j, queue=world.research, workers=1, gpus_per_worker=1))
                for i, j in enumerate(ids)
            ]
        ),
    )
    await seed(
        pg_pool,
        envelopes((10, jobs.JobRejected(job_id=ids[0], code="unknown_queue", reason="no such queue"))),
    )
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"queue": world.research, "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (
            await world.client.get("/v1/jobs", params=params, headers=world.auth(world.research_token))
        ).json()
        seen += [j["job_id"] for j in page["items"] if j["job_id"].startswith("page-")]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [j for j in seen if j in ids] == list(reversed(ids))
    rejected = await world.client.get(
        "/v1/jobs",
        params={"queue": world.research, "state": "rejected"},
        headers=world.auth(world.research_token),
    )
    assert [j["job_id"] for j in rejected.json()["items"]] == [ids[0]]
    garbage = await world.client.get(
        "/v1/jobs", params={"cursor": "garbage"}, headers=world.auth(world.admin_token)
    )
    assert garbage.status_code == 422 and garbage.headers["content-type"] == "application/problem+json"
    # Any cursor of the pattern is a position in the list: before the first job ever, nothing is left.
    before_all = await world.client.get(
        "/v1/jobs", params={"cursor": "0~0"}, headers=world.auth(world.admin_token)
    )
    assert before_all.status_code == 200 and before_all.json() == {"items": [], "next_cursor": None}
    other = await world.client.get("/v1/jobs", headers=world.auth(world.vision_token))
    assert not {j["job_id"] for j in other.json()["items"]} & set(ids)


FIGURES = (
    "as_of",
    "dominant_share",
    "dominant_resource",
    "position",
    "of",
    "charged",
    "borrowed",
    "lendable",
)
"""Quota's figures in a /v1/queues item."""


def quota_status(queue: str, *, as_of: int, share: float, used: int, position: int) -> queues.QueueStatus:
    return queues.QueueStatus(
        queue=queue,
        cohort="lab",
        weight=2.0,
        dominant_share=share,
        dominant_resource="H100",
        position=position,
        of=2,
        resources={"H100": queues.QueueResource(used=used, nominal=8, borrowed=max(0, used - 8), lendable=4)},
        as_of=T0 + timedelta(seconds=as_of),
    )


async def test_queues_report_quotas_latest_figure(world: World, pg_pool: asyncpg.Pool) -> None:
    older = quota_status(world.research, as_of=10, share=0.4, used=6, position=2)
    latest = quota_status(world.research, as_of=20, share=0.375, used=12, position=1)
    sent = [
        make_envelope(status, event_id=str(uuid.uuid4()), source="gangline/quota", time=status.as_of)
        for status in (latest, older)  # the older read last changes nothing
    ]
    await seed(pg_pool, sent)

    listed = (await world.client.get("/v1/queues", headers=world.auth(world.research_token))).json()
    research = {q["queue"]: q for q in listed["items"]}[world.research]

    assert research["reported"] == "quota"
    assert {k: research[k] for k in FIGURES} == {
        "as_of": "2026-03-01T12:00:20Z",
        "dominant_share": 0.375,
        "dominant_resource": "H100",
        "position": 1,
        "of": 2,
        "charged": {"H100": 12},
        "borrowed": {"H100": 4},
        "lendable": {"H100": 4},
    }
    assert research["usage"] == {} and research["jobs"] == {}  # the ledger's facts: nothing runs here


async def test_nodes_queues_and_the_allocation_log(world: World, pg_pool: asyncpg.Pool) -> None:
    run = uuid.uuid4().hex[:6]
    node_names = [f"node-{run}-{i}" for i in range(2)]
    gpus = tuple(
        nodes.GpuInfo(id=f"gpu{i}", index=i, uuid=f"GPU-{run}-{i}", model="H100", memory_mib=81920)
        for i in range(4)
    )
    job_id = uid("job")
    request = jobs.JobRequested(job_id=job_id, queue=world.research, workers=2, gpus_per_worker=2)
    borrower = jobs.JobRequested(job_id=uid("job"), queue=world.vision, workers=2, gpus_per_worker=2)
    retired = jobs.JobRequested(job_id=uid("job"), queue=f"retired-{run}", workers=1, gpus_per_worker=1)
    lent = tuple(allocations.Placement(rank=r, node=node_names[r], gpus=("gpu2", "gpu3")) for r in range(2))
    placements = tuple(
        allocations.Placement(rank=r, node=node_names[r], gpus=("gpu0", "gpu1")) for r in range(2)
    )
    await seed(
        pg_pool,
        envelopes(
            *[
                (
                    0,
                    nodes.NodeRegistered(
                        node=n, address="10.0.0.1", gpus=gpus, nvlink_domain=n, leaf="l0", spine="s0"
                    ),
                )
                for n in node_names
            ],
            (1, request),
            (2, jobs.JobAdmitted(job_id=job_id, spec=request.spec())),
            (
                3,
                allocations.AllocationGranted(
                    job_id=job_id, allocation_id=f"{job_id}-a", queue=world.research, placements=placements
                ),
            ),
            (4, jobs.JobStarted(job_id=job_id, allocation_id=f"{job_id}-a")),
            (5, borrower),
            (
                6,
                allocations.AllocationGranted(
                    job_id=borrower.job_id,
                    allocation_id=f"{borrower.job_id}-a",
                    queue=world.vision,
                    placements=lent,
                ),
            ),
            (7, retired),
            (8, jobs.JobAdmitted(job_id=retired.job_id, spec=retired.spec())),
        ),
    )
    listed = (await world.client.get("/v1/nodes", headers=world.auth(world.research_token))).json()["items"]
    mine = {n["node"]: n for n in listed if n["node"] in node_names}
    assert {n: (v["state"], v["gpu_count"], v["gpus_held"]) for n, v in mine.items()} == {
        node_names[0]: ("ready", 4, 4),
        node_names[1]: ("ready", 4, 4),
    }

    queues = (await world.client.get("/v1/queues", headers=world.auth(world.research_token))).json()
    by_name = {q["queue"]: q for q in queues["items"]}
    assert set(by_name) == {world.research, "default"}  # the vision queue is not this tenant's to see
    research = by_name[world.research]
    assert research["usage"] == {"H100": 4} and research["jobs"] == {"running": 1}
    assert research["quota"] == {"H100": {"nominal": 8, "borrowing_limit": None, "lending_limit": None}}
    assert research["weight"] == 2 and research["configured"] and research["cohort"].startswith("lab-")
    # Quota has published nothing for it: no figure, and the API computes none of its own.
    assert research["reported"] == "not_reported_yet"
    assert {k: research[k] for k in FIGURES} == dict.fromkeys(FIGURES)
    default = by_name["default"]  # unlimited: outside the quota tree, no fair share to be held to
    assert (default["configured"], default["cohort"], default["quota"], default["reported"]) == (
        True,
        None,
        "unlimited",
        "unlimited",
    )
    assert default["dominant_share"] is None and "capacity" not in queues

    log = []
    cursor = None
    while True:
        params: dict[str, Any] = {"job_id": job_id, "limit": 1}
        if cursor:
            params["cursor"] = cursor
        page = (
            await world.client.get("/v1/allocations", params=params, headers=world.auth(world.research_token))
        ).json()
        log += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [(a["rank"], a["node"], a["gpus"], a["released_at"]) for a in log] == [
        (0, node_names[0], ["gpu0", "gpu1"], None),
        (1, node_names[1], ["gpu0", "gpu1"], None),
    ]
    everything = (await world.client.get("/v1/queues", headers=world.auth(world.admin_token))).json()
    vision = next(q for q in everything["items"] if q["queue"] == world.vision)
    # Holds 4 of a nominal 2: what it borrows is quota's figure, not reported for it here.
    assert (vision["usage"], vision["reported"], vision["borrowed"]) == (
        {"H100": 4},
        "not_reported_yet",
        None,
    )
    gone = next(q for q in everything["items"] if q["queue"] == f"retired-{run}")  # no longer in the file
    assert (gone["configured"], gone["quota"], gone["jobs"]) == (False, {}, {"admitted": 1})
    hidden = await world.client.get(
        "/v1/allocations", params={"job_id": job_id}, headers=world.auth(world.vision_token)
    )
    assert hidden.json()["items"] == []


async def test_health_says_503_while_the_producer_is_down(
    kafka_bootstrap: str, pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    settings = ApiSettings.from_env({}, kafka_bootstrap=kafka_bootstrap, pg_dsn=pg_dsn)
    stopped = EventProducer(kafka_bootstrap)
    app = create_app(
        settings, resources=Resources(pg_pool, stopped), authenticator=Authenticator(TokenConfig())
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        response = await client.get("/healthz")
    assert response.status_code == 503
    assert "not started" in response.json()["detail"]


async def test_cordon_drain_uncordon_are_admin_only_strict_and_published_on_nodes_operator(
    world: World, pg_pool: asyncpg.Pool, kafka_bootstrap: str
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    gpus = (nodes.GpuInfo(id="gpu0", index=0, uuid=f"GPU-{node}", model="H100", memory_mib=81920),)
    registered = nodes.NodeRegistered(
        node=node, address="10.0.0.9", gpus=gpus, nvlink_domain=node, leaf="l0", spine="s0"
    )
    await seed(pg_pool, envelopes((0, registered)))
    admin, tenant = world.auth(world.admin_token), world.auth(world.research_token)
    refused = await world.client.post(f"/v1/nodes/{node}/drain", json={"grace_s": 5}, headers=tenant)
    assert refused.status_code == 403
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["detail"] == "tenant 'research' may not drain nodes: only an admin token may"
    for body in (
        {"grace_s": "5"},
        {"grace_s": -1},
        {"grace_s": 8 * 86_400},
        {"reason": "x", "mode": "drain"},
    ):
        invalid = await world.client.post(f"/v1/nodes/{node}/drain", json=body, headers=admin)
        assert invalid.status_code == 422, body
        assert invalid.headers["content-type"] == "application/problem+json"
    missing = await world.client.post("/v1/nodes/no-such-node/cordon", headers=admin)
    assert (missing.status_code, missing.json()["type"]) == (404, "urn:gangline:problem:not-found")
    bad_name = await world.client.post("/v1/nodes/bad%20name/cordon", headers=admin)
    assert bad_name.status_code == 422

    answers = [
        await world.client.post(f"/v1/nodes/{node}/cordon", json={"reason": "bios"}, headers=admin),
        await world.client.post(f"/v1/nodes/{node}/drain", headers=admin),  # the default grace
        await world.client.post(f"/v1/nodes/{node}/uncordon", headers=admin),
    ]
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert [a.json()["action"] for a in answers] == ["cordon", "drain", "uncordon"]
    assert answers[1].json()["drain_grace_s"] == nodes.DEFAULT_DRAIN_GRACE_S == 600
    published = await read_topic(kafka_bootstrap, world.prefix + "nodes.operator", want=3)
    mine = [e for e in published if e.subject == node]
    assert [(type(e.data).__name__, getattr(e.data, "mode", None)) for e in mine] == [
        ("NodeCordoned", "cordon"),
        ("NodeCordoned", "drain"),
        ("NodeUncordoned", None),
    ]
    assert [e.id for e in mine] == [a.json()["event_id"] for a in answers]
    assert all(e.data.requested_by == "ops" and e.source == "gangline/api" for e in mine)


async def test_history_shows_a_tenant_only_its_own_jobs_and_wants_a_zoned_since(
    world: World, pg_pool: asyncpg.Pool
) -> None:
    mine = jobs.JobRequested(job_id=uid("hist"), queue=world.research, workers=1, gpus_per_worker=2)
    theirs = jobs.JobRequested(job_id=uid("hist"), queue=world.vision, workers=1, gpus_per_worker=2)
    grant = allocations.AllocationGranted(
        job_id=mine.job_id,
        allocation_id=f"{mine.job_id}.1",
        queue=world.research,
        placements=(allocations.Placement(rank=0, node="n-hist", gpus=("gpu0", "gpu1")),),
    )
    released = allocations.AllocationReleased(
        job_id=mine.job_id, allocation_id=f"{mine.job_id}.1", reason="completed"
    )
    await seed(pg_pool, envelopes((0, mine), (1, theirs), (10, grant), (10 + 1800, released)))
    since = (T0 - timedelta(minutes=1)).isoformat()
    for token, want, hidden in (
        (world.research_token, mine.job_id, theirs.job_id),
        (world.vision_token, theirs.job_id, mine.job_id),
    ):
        answer = await world.client.get("/v1/history", params={"since": since}, headers=world.auth(token))
        assert answer.status_code == 200
        listed = {j["job_id"]: j for j in answer.json()["items"]}
        assert want in listed and hidden not in listed
    ours = await world.client.get(
        "/v1/history", params={"since": since}, headers=world.auth(world.research_token)
    )
    row = next(j for j in ours.json()["items"] if j["job_id"] == mine.job_id)
    assert row["gpu_hours"] == 1.0 and row["runs"] == 1 and row["nodes"] == ["n-hist"]  # 2 GPUs, 30 min
    naive = await world.client.get(
        "/v1/history", params={"since": "2026-03-01T11:59:00"}, headers=world.auth(world.research_token)
    )
    assert naive.status_code == 400 and naive.headers["content-type"] == "application/problem+json"
    for seconds in ("0.5", "1767225600"):  # a number is not RFC 3339, though pydantic takes it as Unix time
        number = await world.client.get(
            "/v1/history", params={"since": seconds}, headers=world.auth(world.research_token)
        )
        assert number.status_code == 422 and number.headers["content-type"] == "application/problem+json"
    other_queue = await world.client.get(
        "/v1/history", params={"queue": world.vision}, headers=world.auth(world.research_token)
    )
    assert other_queue.status_code == 403


async def test_with_pools_an_operators_word_goes_to_the_nodes_pools_partition(
    api_prefix: str, pg_pool: asyncpg.Pool, pg_dsn: str, kafka_bootstrap: str
) -> None:
    """A pool's owners read only its partition of nodes.operator: the API sends a cordon there."""
    from services.api.auth import Tenant

    # Both names hash to partition 2 of 3: by key, neither would reach its pool's partition.
    spines = {"pool-node-0": "s0", "pool-node-3": "s1"}
    gpus = (nodes.GpuInfo(id="gpu0", index=0, uuid="GPU-x", model="H100", memory_mib=81920),)
    await seed(
        pg_pool,
        envelopes(
            *(
                (
                    0,
                    nodes.NodeRegistered(
                        node=n, address="10.0.0.9", gpus=gpus, nvlink_domain=n, leaf="l", spine=s
                    ),
                )
                for n, s in spines.items()
            )
        ),
    )
    token = f"tok-ops-{uuid.uuid4().hex}"
    settings = ApiSettings.from_env(
        {}, kafka_bootstrap=kafka_bootstrap, topic_prefix=api_prefix, pg_dsn=pg_dsn, pools="spine=s0,s1"
    )
    auth = Authenticator(TokenConfig(tenants=(Tenant.with_token("ops", token, admin=True),)))
    async with EventProducer(kafka_bootstrap) as producer:
        app = create_app(settings, resources=Resources(pg_pool, producer), authenticator=auth)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            for node in spines:
                answer = await client.post(
                    f"/v1/nodes/{node}/cordon", headers={"Authorization": f"Bearer {token}"}
                )
                assert answer.status_code == 202
    consumer = AIOKafkaConsumer(
        api_prefix + "nodes.operator",
        bootstrap_servers=kafka_bootstrap,
        **client_options(),
        auto_offset_reset="earliest",
        group_id=None,
    )
    await consumer.start()
    try:
        where: dict[str, int] = {}
        for _ in range(50):
            batch = await consumer.getmany(timeout_ms=200)
            where |= {decode(r.value).subject: tp.partition for tp, rs in batch.items() for r in rs}
            if len(where) >= 2:
                break
    finally:
        await consumer.stop()
    assert where == {"pool-node-0": 0, "pool-node-3": 1}
