"""The people's CLI against the real API and ledger processes (``python -m services.api|ledger``)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from e2e.harness import wait_healthy

from gangline.bus import EventProducer
from gangline.bus.admin import delete_topics, ensure_topics
from gangline.events import jobs, nodes
from gangline.events.base import Event, make_envelope
from gangline.events.topics import topic_for
from services.api.auth import hash_token
from services.common.topics import TopicNames
from services.tools.cli import main as cli

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Stack:
    url: str
    prefix: str
    bootstrap: str
    queue: str
    token: str
    other_token: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def stack(
    kafka_bootstrap: str, pg_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    run = uuid.uuid4().hex[:8]
    prefix = f"t-cli-{run}."
    specs = TopicNames(prefix=prefix).specs()
    await ensure_topics(kafka_bootstrap, specs)
    queue = f"team-{run}"
    tokens = {"team": f"team-token-{run}", "other": f"other-token-{run}"}
    config = tmp_path_factory.mktemp("cli")
    (config / "tokens.yaml").write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {"name": "team", "token_sha256": hash_token(tokens["team"]), "queues": [queue]},
                    {"name": "other", "token_sha256": hash_token(tokens["other"]), "queues": []},
                ]
            }
        )
    )
    (config / "queues.yaml").write_text(
        yaml.safe_dump(
            {
                "queues": [
                    {"name": queue, "weight": 1, "quotas": {"H100": {"nominal": 8}}},
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
        "GANGLINE_TOPIC_PREFIX": prefix,
        "GANGLINE_GROUP_PREFIX": prefix + "g",
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
    try:
        await wait_healthy(url, procs)
        yield Stack(url, prefix, kafka_bootstrap, queue, tokens["team"], tokens["other"])
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(p.wait(), 30) for p in procs]
        await delete_topics(kafka_bootstrap, [s.name for s in specs])
    # uvicorn re-raises the signal once its graceful shutdown (lifespan included) is done.
    assert codes[0] == 0 and codes[1] in (0, -signal.SIGTERM), f"unclean stop on SIGTERM: {codes}"


@pytest.fixture
def as_team(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    monkeypatch.setenv("GANGLINE_API_URL", stack.url)
    monkeypatch.setenv("GANGLINE_TOKEN", stack.token)
    return stack


def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.2)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def publish(stack: Stack, *events: Event) -> None:
    async with EventProducer(stack.bootstrap) as producer:
        for e in events:
            env = make_envelope(e, event_id=str(uuid.uuid4()), source="tests/cli", time=datetime.now(UTC))
            await producer.publish(stack.prefix + topic_for(e), env)


async def test_submit_then_status_and_why_through_the_api_and_the_ledger(
    as_team: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_id = f"cli-{uuid.uuid4().hex[:8]}"
    job_file.write_text(
        f"job_id: {job_id}\nqueue: {as_team.queue}\nworkers: 2\ngpus_per_worker: 4\ngpu_type: H100\n"
        "topology: {level: nvlink, mode: required}\n"
    )
    code, out, err = run_cli(capsys, "submit", str(job_file))
    assert code == 0, err
    assert out.startswith(f"submitted {job_id} to queue {as_team.queue}")

    until(lambda: run_cli(capsys, "status", job_id)[0] == 0)
    code, out, _ = run_cli(capsys, "status", job_id)
    lines = out.splitlines()
    assert lines[0].split() == ["JOB", "QUEUE", "STATE", "PRIORITY", "GPUS", "ATTEMPT", "SUBMITTED", "REASON"]
    assert lines[1].split()[:5] == [job_id, as_team.queue, "requested", "0", "2x4"]
    assert "job.requested" in out
    assert run_cli(capsys, "why", job_id)[1] == f"{job_id}: waiting for admission\n"

    reason = jobs.PendingReason(
        code="topology",
        constraint="topology",
        message="needs 8 GPUs in one NVLink domain; largest free is 6",
        unblock="wait for 2 more GPUs in one domain",
    )
    await publish(as_team, jobs.JobPending(job_id=job_id, reasons=(reason,)))
    until(lambda: "largest free is 6" in run_cli(capsys, "why", job_id)[1])
    out = run_cli(capsys, "why", job_id)[1]
    assert out.splitlines()[0] == f"{job_id}: needs 8 GPUs in one NVLink domain; largest free is 6"
    assert out.splitlines()[2].split()[:2] == ["CODE", "CONSTRAINT"]
    assert out.splitlines()[3].split()[:2] == ["topology", "topology"]


async def test_refusals_are_printed_with_their_reason_and_exit_1(
    as_team: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"queue: {as_team.queue}\nworkers: 0\ngpus_per_worker: 1\n")
    code, _, err = run_cli(capsys, "submit", str(job_file))
    assert (code, err) == (1, "error (422): workers: must be >= 1 (got 0)\n")
    job_file.write_text(f"queue: {as_team.queue}\nworkers: 1\ngpus_per_worker: 1\n")
    monkeypatch.setenv("GANGLINE_TOKEN", as_team.other_token)
    code, _, err = run_cli(capsys, "submit", str(job_file))
    assert (code, err) == (1, f"error (403): tenant 'other' may not act on queue '{as_team.queue}'\n")
    monkeypatch.setenv("GANGLINE_API_URL", f"http://127.0.0.1:{free_port()}")
    code, _, err = run_cli(capsys, "queues")
    assert code == 1 and err.startswith("error: cannot reach the API")


async def test_queues_and_nodes_print_tables(as_team: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    gpus = tuple(
        nodes.GpuInfo(id=f"gpu{i}", index=i, uuid=f"GPU-{node}-{i}", model="H100", memory_mib=81920)
        for i in range(8)
    )
    await publish(
        as_team,
        nodes.NodeRegistered(
            node=node, address="10.1.0.7", gpus=gpus, nvlink_domain=node, leaf="leaf3", spine="s1"
        ),
    )
    until(lambda: node in run_cli(capsys, "nodes")[1])
    out = run_cli(capsys, "nodes")[1]
    row = next(line for line in out.splitlines() if line.startswith(node))
    assert row.split()[:6] == [node, "ready", "H100", "0/8", "-", f"{node}/leaf3/s1"]

    code, out, _ = run_cli(capsys, "queues")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["QUEUE", "COHORT", "WEIGHT", "QUOTA"]
    mine = next(line.split() for line in lines if line.startswith(as_team.queue))
    assert mine[:4] == [as_team.queue, "-", "1.0", "H100=8"]
    assert mine[8] == "not-reported"  # quota has published no figure for it; the CLI shows none of its own
    open_queue = next(line.split() for line in lines if line.startswith("default "))
    assert open_queue[:4] == ["default", "-", "1.0", "unlimited"]
    assert open_queue[8] == "unlimited"
