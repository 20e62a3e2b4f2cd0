"""The operators' CLI (jobs, history, share, cordon/uncordon/drain, top) in every output format, against
the real API and ledger processes (``python -m services.api|ledger``) over the real broker and database."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
import yaml
from e2e.harness import LogReader, wait_healthy
from test_cli import ROOT, free_port, run_cli

from gangline.bus import EventProducer
from gangline.bus.admin import delete_topics, ensure_topics
from gangline.client.api_client import ApiClient
from gangline.client.operator import CLEAR, fetch_frame, run_top
from gangline.events import allocations, jobs, nodes, queues
from gangline.events.base import Event, make_envelope
from gangline.events.topics import topic_for
from services.api.auth import hash_token
from services.common.topics import TopicNames

H100 = "H100"


@dataclass(frozen=True)
class Ops:
    url: str
    topics: TopicNames
    bootstrap: str
    queue: str
    team_token: str
    other_token: str
    admin_token: str
    node: str
    free_node: str
    run: str

    def job(self, name: str) -> str:
        """A job id of this run (the ledger's database is shared: ids are unique per run)."""
        return f"{name}-{self.run}"


def registration(node: str, leaf: str) -> nodes.NodeRegistered:
    gpus = tuple(
        nodes.GpuInfo(id=f"gpu{i}", index=i, uuid=f"GPU-{node}-{i}", model=H100, memory_mib=81920)
        for i in range(8)
    )
    return nodes.NodeRegistered(
        node=node, address="10.1.0.7", gpus=gpus, nvlink_domain=node, leaf=leaf, spine="s1"
    )


async def publish(bootstrap: str, topics: TopicNames, *timed: tuple[datetime, Event]) -> None:
    async with EventProducer(bootstrap) as producer:
        for at, e in timed:
            env = make_envelope(e, event_id=str(uuid.uuid4()), source="tests/cli-ops", time=at)
            await producer.publish(topics.prefix + topic_for(e), env)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def ops(
    kafka_bootstrap: str, pg_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Ops]:
    run = uuid.uuid4().hex[:8]
    topics = TopicNames(prefix=f"t-cliops-{run}.")
    specs = topics.specs()
    await ensure_topics(kafka_bootstrap, specs)
    queue = f"team-{run}"
    tokens = {name: f"{name}-token-{run}" for name in ("team", "other", "ops")}
    config = tmp_path_factory.mktemp("cliops")
    (config / "tokens.yaml").write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {"name": f"team-{run}", "token_sha256": hash_token(tokens["team"]), "queues": [queue]},
                    {"name": f"other-{run}", "token_sha256": hash_token(tokens["other"]), "queues": []},
                    {"name": "ops", "token_sha256": hash_token(tokens["ops"]), "admin": True},
                ]
            }
        )
    )
    (config / "queues.yaml").write_text(
        yaml.safe_dump(
            {
                "queues": [
                    {"name": queue, "weight": 1, "quotas": {H100: {"nominal": 8}}},
                    {"name": "default", "unlimited": True},
                ]
            }
        )
    )
    port = free_port()
    env = {
        **os.environ,
        "GANGLINE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "GANGLINE_PG_DSN": pg_dsn,
        "GANGLINE_TOPIC_PREFIX": topics.prefix,
        "GANGLINE_GROUP_PREFIX": topics.prefix + "g",
        "GANGLINE_PORT": str(port),
        "GANGLINE_TOKENS_FILE": str(config / "tokens.yaml"),
        "GANGLINE_QUEUES_FILE": str(config / "queues.yaml"),
        "GANGLINE_LOG_LEVEL": "WARNING",
    }
    procs = [
        await asyncio.create_subprocess_exec(sys.executable, "-m", f"services.{name}", cwd=ROOT, env=env)
        for name in ("ledger", "api")
    ]
    url = f"http://127.0.0.1:{port}"
    node, free_node = f"busy-{run}", f"idle-{run}"
    try:
        await wait_healthy(url, procs)
        await seed(kafka_bootstrap, topics, queue, node, free_node, run)
        yield Ops(
            url,
            topics,
            kafka_bootstrap,
            queue,
            tokens["team"],
            tokens["other"],
            tokens["ops"],
            node,
            free_node,
            run,
        )
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            await asyncio.wait_for(p.wait(), 30)
        await delete_topics(kafka_bootstrap, [s.name for s in specs])


NOW = datetime.now(UTC).replace(microsecond=0)


def spec(queue: str, **more: object) -> jobs.JobSpec:
    return jobs.JobSpec.model_validate(
        {"queue": queue, "workers": 1, "gpus_per_worker": 8, "gpu_type": H100, **more}
    )


async def seed(bootstrap: str, topics: TopicNames, queue: str, node: str, free_node: str, run: str) -> None:
    """Two nodes; in the team's queue a job that ran 2 h on 8 GPUs and completed, one running for an
    hour on ``node``, one pending; another tenant's job in ``default``; quota's status of the queue."""
    t = NOW - timedelta(hours=3)

    def at(minutes: float) -> datetime:
        return t + timedelta(minutes=minutes)

    def grant(job: str, allocation: str) -> allocations.AllocationGranted:
        placement = allocations.Placement(rank=0, node=node, gpus=tuple(f"gpu{i}" for i in range(8)))
        return allocations.AllocationGranted(
            job_id=job, allocation_id=allocation, queue=queue, gpu_type=H100, placements=(placement,)
        )

    done, running, waiting, theirs = (f"{name}-{run}" for name in ("done", "run", "wait", "theirs"))
    team = spec(queue, submitted_by=f"team-{run}")
    limited = spec(queue, submitted_by=f"team-{run}", time_limit_s=7200)
    reason = jobs.PendingReason(
        code="quota", constraint="quota", message="queue is at its nominal quota of 8 H100"
    )
    await publish(
        bootstrap,
        topics,
        (at(0), registration(node, "leaf1")),
        (at(0), registration(free_node, "leaf2")),
        (at(1), jobs.JobRequested(job_id=done, **limited.model_dump())),
        (at(1), jobs.JobAdmitted(job_id=done, spec=limited)),
        (at(2), grant(done, f"{done}.1")),
        (at(2), jobs.JobStarted(job_id=done, allocation_id=f"{done}.1")),
        (at(122), jobs.JobCompleted(job_id=done, allocation_id=f"{done}.1")),
        (at(122), allocations.AllocationReleased(job_id=done, allocation_id=f"{done}.1", reason="completed")),
        (at(120), jobs.JobRequested(job_id=running, **team.model_dump())),
        (at(120), jobs.JobAdmitted(job_id=running, spec=spec(queue))),
        (at(123), grant(running, f"{running}.1")),
        (at(123), jobs.JobStarted(job_id=running, allocation_id=f"{running}.1")),
        (at(124), jobs.JobRequested(job_id=waiting, **team.model_dump())),
        (at(124), jobs.JobAdmitted(job_id=waiting, spec=spec(queue))),
        (at(125), jobs.JobPending(job_id=waiting, reasons=(reason,))),
        (
            at(126),
            jobs.JobRequested(job_id=theirs, **spec("default", submitted_by=f"other-{run}").model_dump()),
        ),
        (
            at(126),
            queues.QueueStatus(
                queue=queue,
                cohort="root",
                weight=1.0,
                dominant_share=0.25,
                dominant_resource=H100,
                position=1,
                of=1,
                resources={H100: queues.QueueResource(used=8, nominal=8, borrowed=0, lendable=0)},
                as_of=at(126),
            ),
        ),
    )


@pytest.fixture
def as_team(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> Ops:
    monkeypatch.setenv("GANGLINE_API_URL", ops.url)
    monkeypatch.setenv("GANGLINE_TOKEN", ops.team_token)
    return ops


def until(check: Callable[[], bool], show: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Poll ``check`` (the ledger projects asynchronously); on time-out fail showing ``show()``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in time; last: {show()!r}")
        time.sleep(0.2)


def cells(line: str) -> list[str]:
    """A table line's cells (two or more spaces apart)."""
    return [c.strip() for c in line.split("  ") if c.strip()]


def test_jobs_lists_like_squeue_in_every_format(as_team: Ops, capsys: pytest.CaptureFixture[str]) -> None:
    until(
        lambda: {as_team.job("wait"), as_team.job("run")} <= set(run_cli(capsys, "jobs")[1].split()),
        lambda: run_cli(capsys, "jobs"),
    )
    code, out, err = run_cli(capsys, "jobs")
    assert code == 0, err
    lines = out.splitlines()
    assert cells(lines[0]) == ["JOB", "QUEUE", "STATE", "GPUS", "NODES", "AGE", "REASON"]
    by_job = {cells(line)[0]: cells(line) for line in lines[1:]}
    # As squeue: the jobs not over yet; and not the other tenant's job in default.
    assert set(by_job) == {as_team.job("run"), as_team.job("wait")}
    assert by_job[as_team.job("run")][:5] == [
        as_team.job("run"),
        as_team.queue,
        "running",
        "1x8 H100",
        as_team.node,
    ]
    assert re.fullmatch(r"\d+(s|m\d\ds|h\d\dm|d\d+h)", by_job[as_team.job("run")][5])  # an age, e.g. 1h00m
    assert by_job[as_team.job("wait")][:4] == [as_team.job("wait"), as_team.queue, "pending", "1x8 H100"]
    assert by_job[as_team.job("wait")][-1] == "quota"  # squeue's reason column: the code
    finished = run_cli(capsys, "jobs", "--all")[1]
    assert next(cells(line) for line in finished.splitlines() if line.startswith(as_team.job("done")))[2] == (
        "completed"
    )

    wide = run_cli(capsys, "jobs", "-o", "wide")[1].splitlines()
    assert cells(wide[0])[:7] == ["JOB", "QUEUE", "STATE", "GPUS", "NODES", "AGE", "REASON"]
    assert cells(wide[0])[7:] == ["PRIORITY", "ATTEMPT", "USER", "SUBMITTED", "ALLOCATION", "WHY"]
    waiting = next(cells(line) for line in wide if line.startswith(as_team.job("wait")))
    assert waiting[-1] == "queue is at its nominal quota of 8 H100" and f"team-{as_team.run}" in waiting

    items = json.loads(run_cli(capsys, "jobs", "--all", "-o", "json")[1])["items"]
    assert {j["job_id"] for j in items} == {as_team.job("done"), as_team.job("run"), as_team.job("wait")}
    assert next(j for j in items if j["job_id"] == as_team.job("run"))["nodes"] == [as_team.node]

    only_pending = run_cli(capsys, "jobs", "--state", "pending", "-o", "json")[1]
    assert [j["job_id"] for j in json.loads(only_pending)["items"]] == [as_team.job("wait")]
    assert json.loads(run_cli(capsys, "jobs", "--queue", "default", "-o", "json")[1])["items"] == []


def test_history_accounts_gpu_hours_like_sacct(as_team: Ops, capsys: pytest.CaptureFixture[str]) -> None:
    until(lambda: as_team.job("done") in run_cli(capsys, "history")[1], lambda: run_cli(capsys, "history"))
    code, out, err = run_cli(capsys, "history")
    assert code == 0, err
    lines = out.splitlines()
    assert cells(lines[0]) == [
        "JOB", "QUEUE", "STATE", "CODE", "GPUS", "RUNS", "START", "END", "ELAPSED", "GPU-HOURS",
    ]  # fmt: skip
    done = next(cells(line) for line in lines if line.startswith(as_team.job("done")))
    assert done[2] == "completed" and done[4:6] == ["1x8 H100", "1"]
    assert done[-2:] == ["2h00m", "16.000"]  # 8 GPUs for 2 hours
    assert lines[-1].startswith("3 jobs, ")
    wide = run_cli(capsys, "history", "-o", "wide")[1].splitlines()
    assert cells(wide[0])[10:] == ["NODES", "USER", "SUBMITTED", "TIME LIMIT", "REASON"]
    done_wide = next(cells(line) for line in wide if line.startswith(as_team.job("done")))
    assert as_team.node in done_wide and "2h00m" in done_wide[10:]  # its time limit

    items = {j["job_id"]: j for j in json.loads(run_cli(capsys, "history", "-o", "json")[1])["items"]}
    assert items[as_team.job("done")]["gpu_hours"] == pytest.approx(16.0)
    assert items[as_team.job("done")]["time_limit_s"] == 7200 and items[as_team.job("done")]["runs"] == 1
    assert (
        items[as_team.job("run")]["gpu_hours"] >= 8 * 57 / 60
    )  # still held: counted to now (8 GPUs, 57 min ago)
    assert items[as_team.job("wait")]["gpu_hours"] == 0 and items[as_team.job("wait")]["started_at"] is None
    # --since: what was submitted or ended since then (done-1, submitted 3 h ago, ended 58 minutes ago).
    # (70 minutes before NOW, the world's clock, set when the module was imported: a late-running test
    # counts the minutes since then too.)
    minutes = 70 + int((datetime.now(UTC) - NOW).total_seconds() // 60)
    recent = json.loads(run_cli(capsys, "history", "--since", f"{minutes}m", "-o", "json")[1])["items"]
    assert {j["job_id"] for j in recent} == {as_team.job("done"), as_team.job("run"), as_team.job("wait")}
    since = (NOW - timedelta(minutes=30)).isoformat()
    assert json.loads(run_cli(capsys, "history", "--since", since, "-o", "json")[1])["items"] == []
    assert run_cli(capsys, "history", "--since", "soon")[0] == 1


def test_share_shows_quotas_fair_share_figures(as_team: Ops, capsys: pytest.CaptureFixture[str]) -> None:
    until(lambda: "0.2500" in run_cli(capsys, "share")[1], lambda: run_cli(capsys, "share"))
    code, out, err = run_cli(capsys, "share")
    assert code == 0, err
    lines = out.splitlines()
    assert cells(lines[0]) == ["QUEUE", "NOMINAL", "USED", "DECAYED SHARE", "FAIR POSITION"]
    mine = next(cells(line) for line in lines if line.startswith(as_team.queue))
    assert mine == [as_team.queue, "H100=8", "H100=8", "0.2500", "1/1"]
    opened = next(cells(line) for line in lines if line.startswith("default"))
    assert opened[-2:] == ["unlimited", "unlimited"]
    wide = run_cli(capsys, "share", "-o", "wide")[1].splitlines()
    assert cells(wide[0])[5:] == [
        "COHORT", "WEIGHT", "DOMINANT", "CHARGED", "BORROWED", "LENDABLE", "AS OF",
    ]  # fmt: skip
    items = {q["queue"]: q for q in json.loads(run_cli(capsys, "share", "-o", "json")[1])["items"]}
    assert (items[as_team.queue]["dominant_share"], items[as_team.queue]["position"]) == (0.25, 1)


async def test_cordon_drain_uncordon_are_admin_only_operator_events(
    as_team: Ops, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = as_team.free_node
    until(lambda: node in run_cli(capsys, "nodes")[1], lambda: run_cli(capsys, "nodes"))
    code, _, err = run_cli(capsys, "cordon", node, "--reason", "bios")
    refused = f"error (403): tenant 'team-{as_team.run}' may not cordon nodes: only an admin token may\n"
    assert (code, err) == (1, refused)
    monkeypatch.setenv("GANGLINE_TOKEN", as_team.admin_token)
    code, out, err = run_cli(capsys, "cordon", node, "--reason", "bios update")
    assert code == 0, err
    assert out.startswith(f"node {node} cordoned (event ")
    code, out, _ = run_cli(capsys, "drain", as_team.node, "--grace", "30", "--reason", "psu", "-o", "json")
    assert code == 0
    drained = json.loads(out)
    assert (drained["node"], drained["action"], drained["drain_grace_s"]) == (as_team.node, "drain", 30)
    code, out, _ = run_cli(capsys, "uncordon", as_team.node)
    assert code == 0 and out.startswith(f"node {as_team.node} uncordoned")
    assert run_cli(capsys, "drain", "no-such-node")[2] == "error (404): no node 'no-such-node'\n"

    topic = as_team.topics.operator
    async with LogReader(as_team.bootstrap, [topic]) as log:
        await log.until(lambda: len(log.events[topic]) >= 3, timeout_s=30)
    # nodes.operator has a partition per pool: two nodes' records are in the order they were made, by time.
    mine = sorted(
        (e for e in log.events[topic] if e.data.node in (node, as_team.node)),  # type: ignore[attr-defined]
        key=lambda e: e.time,
    )
    said = [(type(e.data).__name__, e.data.node, getattr(e.data, "mode", None)) for e in mine]
    assert said == [
        ("NodeCordoned", node, "cordon"),
        ("NodeCordoned", as_team.node, "drain"),
        ("NodeUncordoned", as_team.node, None),
    ]
    assert all(e.data.requested_by == "ops" for e in mine)  # type: ignore[attr-defined]
    assert mine[1].data.drain_grace_s == 30  # type: ignore[attr-defined]

    # top shows the cordoned node's GPUs as out of service, and the running job's as its queue's.
    until(lambda: "cordoned" in run_cli(capsys, "top", "--once")[1], lambda: run_cli(capsys, "top", "--once"))
    code, out, err = run_cli(capsys, "top", "--once")
    assert code == 0, err
    lines = out.splitlines()
    # The database is shared with other tests: only this run's nodes are looked at.
    assert lines[0].startswith("gangline top") and re.search(r"GPUs \d+/\d+ held", lines[0])
    busy = next(line for line in lines if line.strip().startswith(as_team.node))
    idle = next(line for line in lines if line.strip().startswith(node))
    letter = re.search(rf"(\w)={re.escape(as_team.queue)}\b", out)
    assert letter is not None and f"[{letter.group(1) * 8}]" in busy  # each GPU held by the team's queue
    assert "[########]" in idle and "cordoned" in idle
    assert re.search(rf"(\w)={re.escape(as_team.queue)}\b", out)
    assert any(cells(line)[:1] == ["QUEUE"] for line in lines)
    wide = run_cli(capsys, "top", "--once", "-o", "wide")[1]
    assert "cordoned: bios update" in wide
    frame = json.loads(run_cli(capsys, "top", "-o", "json")[1])
    cordons = {n["node"]: n["cordon"] for n in frame["nodes"]}
    assert cordons[node]["mode"] == "cordon" and cordons[node]["reason"] == "bios update"
    assert cordons[as_team.node] is None  # uncordoned again
    listed = run_cli(capsys, "nodes")[1]
    assert next(line for line in listed.splitlines() if line.startswith(node)).split()[1] == "ready,cordoned"
    held_here = {a["job_id"] for a in frame["allocations"] if a["node"] in (node, as_team.node)}
    assert held_here == {as_team.job("run")}


def test_cordon_drain_uncordon_answer_in_every_format(
    as_team: Ops, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = as_team.free_node
    until(lambda: node in run_cli(capsys, "nodes")[1], lambda: run_cli(capsys, "nodes"))
    monkeypatch.setenv("GANGLINE_TOKEN", as_team.admin_token)
    for action, done in (("cordon", "cordoned"), ("drain", "draining"), ("uncordon", "uncordoned")):
        code, table, err = run_cli(capsys, action, node, "--reason", "rack swap")
        assert code == 0, err
        assert re.fullmatch(rf"node {node} {done}.* \(event [0-9a-f-]+\)\n", table)
        code, wide, err = run_cli(capsys, action, node, "--reason", "rack swap", "-o", "wide")
        assert code == 0 and wide.startswith(f"node {node} {done}") and wide.endswith("; reason: rack swap\n")
        code, out, err = run_cli(capsys, action, node, "-o", "json")
        answer = json.loads(out)
        assert code == 0 and (answer["node"], answer["action"]) == (node, action) and answer["event_id"]
        assert answer["drain_grace_s"] == (600 if action == "drain" else None)


async def test_top_redraws_the_changed_cluster_each_interval_until_its_iterations(
    as_team: Ops, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refresh loop: each view fetched anew (a node cordoned between two views shows in the second),
    a clear-screen before each, ``--interval`` between them, and no more than ``-n`` views."""
    node = f"top-{as_team.run}"
    await publish(as_team.bootstrap, as_team.topics, (datetime.now(UTC), registration(node, "leaf3")))
    admin = ApiClient(as_team.url, as_team.admin_token)

    def cordon_of(name: str) -> object:
        return next((n.get("cordon") for n in fetch_frame(admin).nodes if n["node"] == name), "missing")

    until(lambda: cordon_of(node) is None, lambda: cordon_of(node))  # registered, in service
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # between two views: an operator cordons the node
        pauses.append(seconds)
        if len(pauses) == 1:
            admin.operate(node, "cordon", {"reason": "between two views"})
            until(lambda: cordon_of(node) is not None, lambda: cordon_of(node))

    out = io.StringIO()
    args = argparse.Namespace(once=False, output="table", interval=0.25, iterations=3)
    with admin, ApiClient(as_team.url, as_team.team_token) as team:
        run_top(team, args, out, datetime.now(UTC), pause=pause)
    views = out.getvalue().split(CLEAR)
    assert views[0] == "" and len(views) == 4  # three views, each drawn on a cleared screen
    rows = [next(line for line in view.splitlines() if line.strip().startswith(node)) for view in views[1:]]
    assert "cordoned" not in rows[0] and "[........]" in rows[0]  # 8 free GPUs
    assert all("cordoned" in row and "[########]" in row for row in rows[1:])
    assert pauses == [0.25, 0.25]  # the interval, between views only

    # Through the command line: -n bounds the loop.
    code, printed, err = run_cli(capsys, "top", "-n", "2", "--interval", "0")
    assert code == 0, err
    assert printed.count(CLEAR) == 2 and printed.count("gangline top  ") == 2
    with pytest.raises(SystemExit) as refused:
        run_cli(capsys, "top", "-n", "0")
    assert refused.value.code == 2 and "must be 1 or more" in capsys.readouterr().err


def test_queues_and_nodes_print_json_too(as_team: Ops, capsys: pytest.CaptureFixture[str]) -> None:
    until(lambda: as_team.node in run_cli(capsys, "nodes")[1], lambda: run_cli(capsys, "nodes"))
    listed = json.loads(run_cli(capsys, "nodes", "-o", "json")[1])["items"]
    mine = next(n for n in listed if n["node"] == as_team.node)
    assert (mine["gpu_count"], mine["leaf"], mine["gpus_held"]) == (8, "leaf1", 8)
    queues_listed = json.loads(run_cli(capsys, "queues", "-o", "json")[1])["items"]
    assert as_team.queue in {q["queue"] for q in queues_listed}
    assert run_cli(capsys, "queues", "-o", "wide")[1] == run_cli(capsys, "queues")[1]  # the table is wide
