"""The demo on the real broker, under a private topic prefix and with no services: it feeds its jobs,
reads the nodes and quota's figures written before it started, and prints its table and its done: line."""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gangline.bus import EventProducer
from gangline.bus.admin import delete_topics, ensure_topics
from gangline.events.base import make_envelope
from gangline.events.nodes import GpuInfo, NodeRegistered
from gangline.events.queues import QueueResource, QueueStatus
from services.agent.demo import feed_and_watch
from services.common.env import ServiceSettings, topic_names

pytestmark = pytest.mark.kafka

PHILLY = Path(__file__).resolve().parents[4] / "shared/traces/pollux-philly/philly.csv"


@pytest.mark.skipif(not PHILLY.exists(), reason="the Philly trace is not in shared/traces")
async def test_the_demo_shows_the_cluster_it_reads_and_ends_with_its_done_line(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = ServiceSettings.from_env(topic_prefix=f"it-demo-{uuid.uuid4().hex[:8]}.")
    topics = topic_names(settings)
    specs = topics.specs()
    await ensure_topics(kafka_bootstrap, specs)
    try:
        node = NodeRegistered(
            node="h100-0",
            address="10.0.0.1",
            gpus=tuple(
                GpuInfo(id=f"gpu{i}", index=i, uuid=f"h100-0-{i}", model="H100-SXM5-80GB", memory_mib=81_559)
                for i in range(8)
            ),
            nvlink_domain="h100-0",
            leaf="l0",
            spine="s0",
        )
        status = QueueStatus(
            queue="default",
            cohort="root",
            weight=1.0,
            dominant_share=0.0,
            position=1,
            of=1,
            resources={"H100-SXM5-80GB": QueueResource(used=0, nominal=8, borrowed=0, lendable=0)},
            as_of=datetime.now(UTC),
        )
        async with EventProducer(kafka_bootstrap) as producer:
            now = datetime.now(UTC)
            registered = make_envelope(node, event_id="n0", source="test", time=now)
            await producer.publish(topics.inventory, registered)
            await producer.publish(
                topics.queue_status, make_envelope(status, event_id="q0", source="test", time=now)
            )
        args = argparse.Namespace(philly=str(PHILLY), jobs=2, spread_s=0.5, urgent_after_s=0.5, max_s=8.0)
        await feed_and_watch(args, settings)
    finally:
        await delete_topics(kafka_bootstrap, [s.name for s in specs])

    out = capsys.readouterr().out
    assert "\x1b" not in out  # not a terminal: plain tables
    final = out[out.rindex("gangline demo") :]
    gpus = {line.split()[0]: line.split()[1:] for line in final.splitlines() if line.startswith("H100")}
    assert gpus["H100-SXM5-80GB"] == ["8", "0", "0", "0", "8"]  # free, nothing granted: no services run
    queue = next(line.split() for line in final.splitlines() if line.startswith("default"))
    assert queue[-2:] == ["0/8", "1/1"]
    assert "requested=6 " in final  # two Philly jobs, three gangs, the urgent gang
    assert out.splitlines()[-1].startswith("done: 0 of 6 jobs finished;")
    assert "Analytics: http://127.0.0.1:" in out
