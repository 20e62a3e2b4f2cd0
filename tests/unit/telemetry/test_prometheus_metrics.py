"""The metrics catalogue and the asyncio /metrics server."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gangline.telemetry.metrics import FAMILIES, METRICS_PORTS, Figures, gauge, new_registry, serving


def test_the_catalogue_names_counters_with_total_and_every_service_has_a_port() -> None:
    for family in FAMILIES.values():
        assert family.name.startswith("gangline_")
        assert family.name.endswith("_total") == (family.kind == "counter"), family.name
        assert set(family.services) <= set(METRICS_PORTS), family.name
    assert len(set(METRICS_PORTS.values())) == len(METRICS_PORTS)
    # The agent families say which DCGM field each one is.
    assert all(f.dcgm for f in FAMILIES.values() if f.services == ("agent",))


async def test_the_server_answers_metrics_and_a_taken_port_leaves_the_service_running() -> None:
    registry = new_registry(process=False)
    level = {"now": 3.0}

    def figures() -> list[object]:
        fair = gauge("gangline_fair_share")
        fair.add_metric(["team-a"], level["now"])
        return [fair]

    registry.register(Figures(figures))  # type: ignore[arg-type]
    async with serving(registry, host="127.0.0.1", port=0) as port, httpx.AsyncClient() as client:
        assert port is not None
        first = await client.get(f"http://127.0.0.1:{port}/metrics")
        level["now"] = 5.0  # computed at scrape time
        second = await client.get(f"http://127.0.0.1:{port}/metrics")
        missing = await client.get(f"http://127.0.0.1:{port}/nothing")
        posted = await client.post(f"http://127.0.0.1:{port}/metrics")
        # The port is taken: a second server logs it and yields None instead of raising.
        async with serving(registry, host="127.0.0.1", port=port) as again:
            assert again is None
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/plain")
    values = [
        [s.value for f in text_string_to_metric_families(r.text) for s in f.samples] for r in (first, second)
    ]
    assert values == [[3.0], [5.0]]
    assert (missing.status_code, posted.status_code) == (404, 405)
    async with serving(registry, host="127.0.0.1", port=port) as reopened:  # closed: a restart binds again
        assert reopened == port


async def test_a_failing_figure_drops_its_families_not_the_scrape() -> None:
    registry = new_registry(process=False)

    def broken() -> list[object]:
        raise RuntimeError("state moved under us")

    registry.register(Figures(broken))  # type: ignore[arg-type]
    async with serving(registry, host="127.0.0.1", port=0) as port, httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200 and response.text == ""


async def test_readyz_answers_from_the_readiness_and_healthz_only_that_it_runs() -> None:
    state = {"ready": False}

    def readiness() -> tuple[bool, str]:
        return state["ready"], "processing" if state["ready"] else "restoring its state from the log"

    registry = new_registry(process=False)
    async with (
        serving(registry, host="127.0.0.1", port=0, readiness=readiness) as port,
        httpx.AsyncClient() as client,
    ):
        base = f"http://127.0.0.1:{port}"
        not_yet = await client.get(f"{base}/readyz")
        assert (not_yet.status_code, not_yet.text) == (503, "not ready: restoring its state from the log\n")
        assert (await client.get(f"{base}/healthz")).status_code == 200  # alive all the same
        state["ready"] = True
        ready = await client.get(f"{base}/readyz")
        assert (ready.status_code, ready.text) == (200, "ready: processing\n")
    async with serving(registry, host="127.0.0.1", port=0) as port, httpx.AsyncClient() as client:
        assert (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200  # no readiness: ready
