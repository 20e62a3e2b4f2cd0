"""The web dashboard in a real browser (Debian's chromium, driven by Playwright), against a running system.

One system for the module, on private topics and a scratch database (so the map holds this test's nodes
only): the decision services, the ledger, simulated H100 and L40S nodes under two leaves of one spine,
a node agent on the NVML stand-in of a DGX A100 carved by MIG under another spine, and the API (its
live feed included) under uvicorn on a free port. Three tenants: an admin, team A and team B.

Each page is loaded and checked against the API's own JSON; a job is watched moving from pending to
running with no reload (server-sent events fed from Kafka); a tenant's stream is shown never to carry
another tenant's jobs; the screenshots the README shows are saved under docs/dashboard/.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
import uvicorn
from opentelemetry.sdk.trace import TracerProvider

from e2e.harness import Proc, Tasks, fake_cluster, private_topics, service_env, start_pipeline
from gangline.agent.node import NodeAgent
from gangline.agent.settings import AgentTopics, NodeAgentSettings
from gangline.agent.simulated import SimulatedRunner
from gangline.bus import EventProducer
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.nvml.spec import load_builtin_spec
from gangline.nvml.standin import NvmlStandIn
from gangline.store.migrate import migrate
from gangline.store.pool import create_pool
from services.api.app import Resources, create_app
from services.api.auth import Authenticator, Tenant, TokenConfig
from services.api.live import LiveFeed
from services.api.settings import ApiSettings
from services.common.queues import load_queues
from services.ledger.settings import LedgerSettings
from services.ledger.wiring import Ledger

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is a dev dependency")

H100, L40S = "H100-SXM5-80GB", "L40S-48GB"
# The screenshots go to a scratch folder, so a test run leaves the checkout as it was; `make screenshots`
# points GANGLINE_SCREENSHOTS at docs/dashboard/ to refresh the ones the README shows.
SHOTS = Path(os.environ.get("GANGLINE_SCREENSHOTS") or Path(tempfile.gettempdir()) / "gangline-shots")
SHOTS.mkdir(parents=True, exist_ok=True)
WAIT_MS = 60_000
"""The longest any wait for the page may take (a bound, not a timed assertion)."""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = "Debian's chromium is not installed (make test installs it: apt-get install chromium)"
        print(f"SKIP: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class QuietServer(uvicorn.Server):
    """uvicorn as a task of the test's loop: the test runner keeps its own signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class System:
    url: str
    run: str
    tokens: dict[str, str]
    queues: dict[str, str]
    tasks: Tasks
    feed: LiveFeed
    api: httpx.AsyncClient
    nodes: list[str]
    analytics: Proc

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    async def get(self, path: str, who: str = "admin") -> Any:
        self.tasks.check()
        response = await self.api.get(path, headers=self.headers(who))
        assert response.status_code == 200, response.text
        return response.json()

    async def submit(self, who: str, **job: Any) -> str:
        response = await self.api.post("/v1/jobs", json=job, headers=self.headers(who))
        assert response.status_code == 202, response.text
        return str(response.json()["job_id"])

    async def until(
        self, what: Callable[[], Any], ok: Callable[[Any], bool], *, timeout_s: float = 60
    ) -> Any:
        """Polls the API until ``ok(await what())``; fails after ``timeout_s`` (a bound)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self.tasks.check()
            value = await what()
            if ok(value):
                return value
            assert loop.time() < deadline, f"the API never showed it: {value}"
            await asyncio.sleep(0.2)

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict((await self.get(f"/v1/jobs/{job_id}"))["job"])


@contextlib.asynccontextmanager
async def scratch_database(pg_dsn: str, run: str) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    name = f"t_dashboard_{run}"
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        dsn = pg_dsn.rsplit("/", 1)[0] + f"/{name}"
        pool = await create_pool(dsn, min_size=1, max_size=8)
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
            yield dsn, pool
        finally:
            await pool.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def system(
    kafka_bootstrap: str, pg_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[System]:
    run = uuid.uuid4().hex[:6]
    tmp = tmp_path_factory.mktemp("dashboard")
    queues = {"a": f"team-a-{run}", "b": f"team-b-{run}"}
    queues_file = tmp / "queues.yaml"
    quotas = f"{{{H100}: {{nominal: 8}}, {L40S}: {{nominal: 4}}}}"
    queues_file.write_text(
        f"cohorts:\n  - name: lab-{run}\nqueues:\n  - name: default\n    unlimited: true\n"
        + "".join(f"  - name: {q}\n    cohort: lab-{run}\n    quotas: {quotas}\n" for q in queues.values()),
        encoding="utf-8",
    )
    tokens = {who: f"tok-{who}-{uuid.uuid4().hex}" for who in ("admin", "a", "b")}
    auth = Authenticator(
        TokenConfig(
            tenants=(
                Tenant.with_token(f"ops-{run}", tokens["admin"], admin=True),
                Tenant.with_token(f"tenant-a-{run}", tokens["a"], queues=[queues["a"]]),
                Tenant.with_token(f"tenant-b-{run}", tokens["b"], queues=[queues["b"]]),
            )
        )
    )
    spec = ClusterSpec(
        name=f"dash-{run}",
        groups=(
            NodeGroup(
                name=f"h100-{run}",
                count=2,
                gpu_model=H100,
                gpus_per_node=8,
                memory_mib=81920,
                leaf="leaf-a",
                spine="spine-0",
            ),
            NodeGroup(
                name=f"l40s-{run}",
                count=2,
                gpu_model=L40S,
                gpus_per_node=4,
                memory_mib=49152,
                nvlink="none",
                leaf="leaf-b",
                spine="spine-0",
            ),
        ),
    )
    async with (
        scratch_database(pg_dsn, run) as (dsn, pool),
        private_topics(kafka_bootstrap, "dash") as topics,
        EventProducer(kafka_bootstrap) as producer,
    ):
        env = service_env(kafka_bootstrap, topics, queues_file=str(queues_file), status_interval_s="0.5")
        cluster = fake_cluster(kafka_bootstrap, topics, spec, heartbeat_s=0.5)
        ledger = Ledger(
            LedgerSettings.from_env(
                {},
                kafka_bootstrap=kafka_bootstrap,
                topic_prefix=topics.prefix,
                group_prefix=topics.prefix + "ledger",
                pg_dsn=dsn,
                poll_timeout_ms=100,
            ),
            pool,
        )
        feed = LiveFeed(bootstrap=kafka_bootstrap, topics=topics, pool=pool)
        port, analytics_port = free_port(), free_port()
        analytics = Proc(
            "services.analytics",
            {
                **env,
                "GANGLINE_ANALYTICS_PORT": str(analytics_port),
                "GANGLINE_ANALYTICS_DATA_DIR": str(tmp / "faust"),
            },
            tmp / "analytics.log",
        )
        settings = ApiSettings.from_env(
            {},
            kafka_bootstrap=kafka_bootstrap,
            topic_prefix=topics.prefix,
            pg_dsn=dsn,
            analytics_url=f"http://127.0.0.1:{analytics_port}",
        )
        app = create_app(
            settings,
            resources=Resources(pool, producer, feed),
            queues=load_queues(queues_file),
            authenticator=auth,
            tracer_provider=TracerProvider(),  # the API's requests start traces: the job page shows the id
        )
        server = QuietServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
        mig_node = f"mig-{run}"
        agent = NodeAgent(
            NodeAgentSettings(
                node=mig_node,
                leaf="leaf-c",
                spine="spine-1",
                checkpoint_root=tmp / "ckpt",
                log_dir=tmp / "logs",
                kafka_bootstrap=kafka_bootstrap,
                topics=AgentTopics.prefixed(topics.prefix),
                heartbeat_interval_s=0.5,
                peer_address="127.0.0.1",
            ),
            nvml_api=NvmlStandIn(load_builtin_spec("dgx-a100-mig", node=mig_node)),
            runner=SimulatedRunner(default_duration_s=86_400),  # runs until released
            producer=producer,
        )
        tasks = Tasks()
        try:
            analytics.start()
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            await agent.start()
            tasks.start("ledger", ledger.run())
            start_pipeline(tasks, env)
            tasks.start("live-feed", feed.run())
            tasks.start("api", server.serve())
            await asyncio.wait_for(feed.ready.wait(), timeout=60)
            while not server.started:
                tasks.check()
                await asyncio.sleep(0.05)
            url = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=url, timeout=10) as api:
                nodes = sorted([*cluster.nodes, mig_node])
                found = System(url, run, tokens, queues, tasks, feed, api, nodes, analytics)

                async def listed() -> set[str]:
                    return {n["node"] for n in (await found.get("/v1/nodes"))["items"]}

                await found.until(listed, lambda names: set(nodes) <= names)
                yield found
        finally:
            server.should_exit = True
            analytics.terminate()
            await agent.stop()
            await tasks.stop()
            ledger.request_stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    path = chromium()
    async with playwright_api.async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield launched
        finally:
            await launched.close()


@contextlib.asynccontextmanager
async def signed_in(browser: Any, system: System, who: str, page_path: str = "#/map") -> AsyncIterator[Any]:
    """A fresh browser context, signed in as ``who`` through the login form, on ``page_path``."""
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        await page.goto(f"{system.url}/dashboard/{page_path}")
        await page.fill("#token", system.tokens[who])
        await page.click("#login-form button[type=submit]")
        await page.wait_for_selector("#live[data-state=live]", timeout=WAIT_MS)
        yield page
        assert errors == [], errors
    finally:
        await context.close()


async def section_loaded(page: Any, name: str) -> None:
    await page.wait_for_selector(f"#page-{name}[data-loaded=true]:not([hidden])", timeout=WAIT_MS)


async def test_root_redirects_to_the_dashboard_and_its_files_are_served(system: System) -> None:
    root = await system.api.get("/", follow_redirects=True)
    assert root.status_code == 200 and "<title>Gangline</title>" in root.text
    for name, kind in (("app.js", "javascript"), ("style.css", "css")):
        served = await system.api.get(f"/dashboard/{name}")
        assert served.status_code == 200 and kind in served.headers["content-type"], name


async def test_the_cluster_map_shows_every_gpu_grouped_by_spine_and_leaf(
    browser: Any, system: System
) -> None:
    a, b = system.queues["a"], system.queues["b"]
    held = [
        await system.submit("a", job_id=f"map-a-{system.run}", queue=a, workers=1, gpus_per_worker=4),
        await system.submit(
            "b", job_id=f"map-b-{system.run}", queue=b, workers=1, gpus_per_worker=2, gpu_type=L40S
        ),
        await system.submit(
            "admin",
            job_id=f"map-mig-{system.run}",
            queue="default",
            workers=1,
            gpus_per_worker=0,
            mig_profile="1g.10gb",
            gpu_type="A100-SXM4-80GB",
        ),
    ]
    for job_id in held:
        await system.until(lambda j=job_id: system.job(j), lambda job: job["state"] == "running")
    nodes = {n["node"]: n for n in (await system.get("/v1/nodes"))["items"]}
    allocations = (await system.get("/v1/allocations?held=true&limit=500"))["items"]

    async with signed_in(browser, system, "admin", "#/map") as page:
        await section_loaded(page, "map")
        await page.wait_for_function(
            "n => document.querySelectorAll('#map .gpu[data-state=queue]').length >= n",
            arg=sum(len(a["gpus"]) for a in allocations if a["node"] in system.nodes),
            timeout=WAIT_MS,
        )
        for name in system.nodes:
            node = nodes[name]
            where = f'.spine[data-spine="{node["spine"]}"] .leaf[data-leaf="{node["leaf"]}"]'
            box = page.locator(f'{where} .node[data-node="{name}"]')
            assert await box.count() == 1, name
            assert await box.locator(".gpu").count() == len(node["gpus"]), name
            for gpu in node["gpus"]:
                if gpu.get("mig_enabled") and gpu.get("mig_instances"):
                    slices = box.locator(f'.gpu[data-gpu="{gpu["id"]}"] .slice')
                    assert await slices.count() == len(gpu["mig_instances"]), (name, gpu["id"])
        for row in allocations:
            if row["node"] not in system.nodes:
                continue
            for gpu in row["gpus"]:
                cell = page.locator(f'.node[data-node="{row["node"]}"] .gpu[data-gpu="{gpu}"]')
                assert await cell.get_attribute("data-state") == "queue", (row, gpu)
                assert await cell.get_attribute("data-queue") == row["queue"], (row, gpu)
        mig_held = [r for r in allocations if r["node"].startswith("mig-")]
        assert mig_held, allocations
        taken = page.locator(f'.node[data-node="{mig_held[0]["node"]}"] .slice[data-queue="default"]')
        assert await taken.count() == len(mig_held)
        await page.screenshot(path=str(SHOTS / "cluster.png"), full_page=True)


async def test_a_pending_job_turns_running_live_and_its_page_says_why_it_waited(
    browser: Any, system: System
) -> None:
    a = system.queues["a"]
    blocker = await system.submit("a", job_id=f"blocker-{system.run}", queue=a, workers=1, gpus_per_worker=8)
    await system.until(lambda: system.job(blocker), lambda job: job["state"] == "running")
    # A gang of two 8-GPU workers: the H100s are held (the blocker, the map's job), so it waits.
    gang = await system.submit(
        "a", job_id=f"gang-{system.run}", queue=a, workers=2, gpus_per_worker=8, gpu_type=H100
    )
    pending = await system.until(lambda: system.job(gang), lambda job: job["state"] == "pending")

    async with signed_in(browser, system, "a", f"#/jobs/{gang}") as page:
        await section_loaded(page, "job")
        assert await page.inner_text("#job-state") == "pending"
        view = await system.get(f"/v1/jobs/{gang}", "a")
        assert await page.inner_text("#job-why .why-summary") == view["why"]["summary"]
        for reason in view["why"]["reasons"]:
            item = page.locator(f'#job-why li[data-code="{reason["code"]}"]')
            assert reason["message"] in await item.first.inner_text()
            if reason.get("unblock"):
                assert reason["unblock"] in await item.first.inner_text()
        assert pending["reason"]
        timeline = await page.locator("#job-timeline li").evaluate_all(
            "items => items.map(i => i.dataset.type)"
        )
        assert timeline == [e["type"].split(".", 1)[1].rsplit(".", 1)[0] for e in view["events"]]
        assert timeline[:2] == ["job.requested", "job.admitted"]
        trace = next(e["traceparent"] for e in view["events"] if e["traceparent"])
        assert await page.inner_text("#job-trace") == trace.split("-")[1]
        await page.screenshot(path=str(SHOTS / "job-pending.png"), full_page=True)

        # Free the GPUs: the gang is placed and starts, and the page shows it with no reload.
        marker = await page.evaluate("() => (window.__noReload = true)")
        assert marker is True
        await system.api.post(f"/v1/jobs/{blocker}/cancel", headers=system.headers("a"))
        await system.api.post(f"/v1/jobs/map-a-{system.run}/cancel", headers=system.headers("a"))
        await page.wait_for_function(
            "() => document.querySelector('#job-state').innerText === 'running'", timeout=WAIT_MS
        )
        assert await page.evaluate("() => window.__noReload") is True  # the same document: no reload
        await page.wait_for_selector("#job-timeline li[data-type='job.started']", timeout=WAIT_MS)
        for step in ("requested", "admitted", "queued", "placed", "started"):
            await page.wait_for_selector(f"#job-steps li.done[data-step='job.{step}']", timeout=WAIT_MS)
        await page.wait_for_function(
            "() => document.querySelectorAll('#job-placement tbody tr').length === 2", timeout=WAIT_MS
        )
        view = await system.get(f"/v1/jobs/{gang}", "a")
        assert view["job"]["state"] == "running"
        placed = sorted((r["node"], r["rank"]) for r in view["allocations"])
        shown = await page.locator("#job-placement tbody tr").evaluate_all(
            "rows => rows.map(r => [r.children[2].innerText, Number(r.children[1].innerText)])"
        )
        assert sorted(tuple(s) for s in shown) == placed
        await page.screenshot(path=str(SHOTS / "job-running.png"), full_page=True)


async def test_the_jobs_list_matches_the_api_and_searches(browser: Any, system: System) -> None:
    async with signed_in(browser, system, "admin", "#/jobs") as page:
        await section_loaded(page, "jobs")
        listed = (await system.get("/v1/jobs?active=true&limit=500"))["items"]
        await page.wait_for_function(
            "n => document.querySelectorAll('#jobs-table tbody tr').length === n",
            arg=len(listed),
            timeout=WAIT_MS,
        )
        shown = await page.locator("#jobs-table tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.job)"
        )
        assert shown == [j["job_id"] for j in listed]
        await page.fill("#job-search", f"map-b-{system.run}")
        await page.wait_for_function(
            "() => document.querySelectorAll('#jobs-table tbody tr').length === 1", timeout=WAIT_MS
        )
        row = page.locator("#jobs-table tbody tr")
        assert await row.get_attribute("data-job") == f"map-b-{system.run}"
        await page.fill("#job-search", "")
        await page.screenshot(path=str(SHOTS / "jobs.png"), full_page=True)


async def test_the_queues_page_shows_quotas_figures(browser: Any, system: System) -> None:
    a, b = system.queues["a"], system.queues["b"]

    async def reported() -> dict[str, Any]:
        return {q["queue"]: q for q in (await system.get("/v1/queues"))["items"]}

    queues = await system.until(reported, lambda qs: all(qs[q]["reported"] == "quota" for q in (a, b)))
    async with signed_in(browser, system, "admin", "#/queues") as page:
        await section_loaded(page, "queues")
        for name in (a, b):
            item = queues[name]
            for resource, quota in item["quota"].items():
                row = page.locator(f'#queues-table tr[data-queue="{name}"][data-resource="{resource}"]')
                assert await row.locator("[data-k=nominal]").inner_text() == str(quota["nominal"])
                lent = item["lent"].get(resource, 0)
                assert float(await row.locator("[data-k=lent]").inner_text()) == pytest.approx(lent, abs=0.01)
            first = page.locator(f'#queues-table tr[data-queue="{name}"]').first
            share = await first.locator("[data-k=share]").inner_text()
            assert float(share) == pytest.approx(item["dominant_share"], abs=1e-3)
            assert await first.locator("[data-k=position]").inner_text() == f"{item['position']}/{item['of']}"
        await page.screenshot(path=str(SHOTS / "queues.png"), full_page=True)


async def test_a_tenant_sees_and_hears_only_its_own_jobs(browser: Any, system: System) -> None:
    a, b = system.queues["a"], system.queues["b"]
    async with signed_in(browser, system, "a", "#/jobs") as page:
        await section_loaded(page, "jobs")
        # Besides the page's own stream, one opened as the page opens it records every notice it carries.
        granted = await system.api.post("/v1/stream-token", headers=system.headers("a"))
        await page.evaluate(
            """t => { window.__heard = [];
                      const s = new EventSource('/v1/stream?token=' + encodeURIComponent(t));
                      s.addEventListener('notice', m => window.__heard.push(JSON.parse(m.data)));
                      window.__probe = s; }""",
            granted.json()["token"],
        )
        await page.wait_for_function("() => window.__probe.readyState === 1", timeout=WAIT_MS)
        theirs = await system.submit(
            "b",
            job_id=f"theirs-{system.run}",
            queue=b,
            workers=1,
            gpus_per_worker=1,
            gpu_type=L40S,
            duration_hint_s=1,
        )
        ours = await system.submit(
            "a",
            job_id=f"ours-{system.run}",
            queue=a,
            workers=1,
            gpus_per_worker=1,
            gpu_type=L40S,
            duration_hint_s=1,
        )
        for job_id in (theirs, ours):
            await system.until(lambda j=job_id: system.job(j), lambda job: job["state"] == "completed")
        # Tenant A's stream carries its own job to the end; by then B's, submitted first, has ended too.
        await page.wait_for_function(
            "j => window.__heard.some(n => n.job_id === j && n.type === 'allocation.released')",
            arg=ours,
            timeout=WAIT_MS,
        )
        heard = await page.evaluate("() => window.__heard")
        jobs_heard = {n["job_id"] for n in heard if n["job_id"]}
        assert ours in jobs_heard
        assert all(n["queue"] in (a, "default") for n in heard if n["job_id"]), heard
        assert theirs not in jobs_heard

        # What the pages show: team A's jobs only, and B's GPUs as another tenant's.
        await page.click("#job-active")  # every job, finished ones too
        await page.wait_for_selector(f'#jobs-table tr[data-job="{ours}"]', timeout=WAIT_MS)
        shown = await page.locator("#jobs-table tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.job)"
        )
        listed = [j["job_id"] for j in (await system.get("/v1/jobs?limit=500", "a"))["items"]]
        assert shown == listed and theirs not in shown
        await page.goto(f"{system.url}/dashboard/#/queues")
        await section_loaded(page, "queues")
        assert await page.locator(f'#queues-table tr[data-queue="{b}"]').count() == 0
        assert await page.locator(f'#queues-table tr[data-queue="{a}"]').count() > 0
        # While one of B's jobs runs, the map shows its GPU as another tenant's, unnamed.
        holding = await system.submit(
            "b",
            job_id=f"theirs-long-{system.run}",
            queue=b,
            workers=1,
            gpus_per_worker=1,
            gpu_type=L40S,
            duration_hint_s=600,
        )
        await system.until(lambda: system.job(holding), lambda job: job["state"] == "running")
        await page.goto(f"{system.url}/dashboard/#/map")
        await section_loaded(page, "map")
        assert await page.locator(f'.gpu[data-queue="{b}"]').count() == 0
        assert await page.locator('.node .gpu[data-state="other"]').count() > 0  # not the legend's
        cancelled = await system.api.post(f"/v1/jobs/{holding}/cancel", headers=system.headers("b"))
        assert cancelled.status_code == 202, cancelled.text
        await system.until(lambda: system.job(holding), lambda job: job["state"] == "cancelled")

    # The stream refuses a token it did not sign (expiry and forgeries: tests/unit/services/test_api_live.py).
    assert (await system.api.get("/v1/stream", params={"token": "forged.token"})).status_code == 401


async def test_the_allocation_log_is_live(browser: Any, system: System) -> None:
    async with signed_in(browser, system, "admin", "#/log") as page:
        await section_loaded(page, "log")
        rows = (await system.get("/v1/allocations?limit=500"))["items"]
        granted = page.locator("#log li[data-type='allocation.granted']")
        assert await granted.count() == len(rows)
        job_id = await system.submit(
            "admin",
            job_id=f"log-{system.run}",
            queue="default",
            workers=1,
            gpus_per_worker=1,
            gpu_type=L40S,
            duration_hint_s=1,
        )
        for kind in ("granted", "released"):
            await page.wait_for_selector(
                f"#log li[data-type='allocation.{kind}'][data-job='{job_id}']", timeout=WAIT_MS
            )
        await page.screenshot(path=str(SHOTS / "allocation-log.png"), full_page=True)


async def test_the_charts_draw_the_analytics_figures_and_say_when_the_app_is_away(
    browser: Any, system: System
) -> None:
    async def figures() -> tuple[Any, Any]:
        hours = await system.api.get("/v1/analytics/gpu-hours?window=hour", headers=system.headers("admin"))
        waits = await system.api.get("/v1/analytics/waits", headers=system.headers("admin"))
        assert system.analytics.alive(), "the analytics app exited"
        assert hours.status_code == waits.status_code == 200, (hours.text, waits.text)
        if not (hours.json()["available"] and waits.json()["available"]):
            return [], []  # the app is still starting
        return hours.json()["figures"], waits.json()["figures"]

    # The jobs ended so far (cancelled in A, completed in B and default) are in the hourly GPU-hours.
    hours, waits = await system.until(
        figures,
        lambda f: (
            {r["queue"] for r in f[0]} >= {system.queues["a"], system.queues["b"], "default"} and bool(f[1])
        ),
        timeout_s=120,
    )
    assert all(r["gpu_hours"] > 0 for r in hours) and all(w["count"] > 0 for w in waits)
    own = (await system.api.get("/v1/analytics/gpu-hours", headers=system.headers("a"))).json()
    assert own["available"] and own["figures"]
    assert {r["queue"] for r in own["figures"]} == {system.queues["a"]}  # a tenant: its own queues' rows

    async with signed_in(browser, system, "admin", "#/analytics") as page:
        await section_loaded(page, "analytics")
        status = page.locator("#analytics-status")
        assert await status.get_attribute("data-state") == "available"
        drawn = await page.locator("#chart-utilisation rect[data-series]").evaluate_all(
            "bars => bars.map(b => b.dataset.series)"
        )
        later, _ = await figures()  # the app may have counted more since: every series drawn is in it

        def series(rows: list[dict[str, Any]]) -> set[str]:
            return {f"{r['queue']} {r['gpu_model']}" for r in rows}

        assert series(hours) <= set(drawn) <= series(later)
        waited = await page.locator("#waits-latest tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.series)"
        )
        assert series(waits) <= set(waited) and set(waited) <= series((await figures())[1])
        await page.screenshot(path=str(SHOTS / "analytics.png"), full_page=True)

        # The analytics app goes away: the charts say so, the rest of the dashboard stays live.
        system.analytics.terminate()
        answer = await system.api.get("/v1/analytics/gpu-hours", headers=system.headers("admin"))
        assert answer.status_code == 200 and answer.json()["available"] is False, answer.text
        await page.click("#nav a[data-page=map]")
        await section_loaded(page, "map")
        await page.click("#nav a[data-page=analytics]")
        await page.wait_for_selector("#analytics-status[data-state=unavailable]", timeout=WAIT_MS)
        assert "Analytics unavailable" in await status.inner_text()
        assert await page.locator("#live[data-state=live]").count() == 1
