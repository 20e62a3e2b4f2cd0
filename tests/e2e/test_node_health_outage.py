"""node_health over the real broker: a pause in every node's heartbeats shorter than the silence (the bus
was down, for node_health's purposes: nothing got into the log) fails none of the nodes heard a few
seconds late after it, while a node silent for good is still failed; and the decisions replay identical.

The outage is simulated by pausing the heartbeat producers (the fake nodes), not by stopping the shared
broker."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from e2e.harness import LogReader, Tasks, fake_cluster, private_topics, service_env, start_pipeline
from e2e.test_stories import h100_nodes
from gangline.events.nodes import NodeFailed, NodeHeartbeat
from gangline.events.types import NodeId
from gangline.replay.kafka import KafkaSource
from services.node_health.replay import decider_topics, replay_node_health
from services.node_health.settings import NodeHealthSettings

pytestmark = pytest.mark.kafka

SILENCE_S = 8.0
OUTAGE_S = 6.0
"""Shorter than the silence and longer than the outage gap (2 s; the nodes beat every 0.3 s)."""
LATE_S = 3.5
"""How much later than the first node the others are heard after the outage: 9.5 s of wall-clock silence."""


async def test_a_short_outage_fails_no_node_heard_late_after_it(kafka_bootstrap: str) -> None:
    async with private_topics(kafka_bootstrap, "outage") as topics:
        settings = {"silence_s": str(SILENCE_S), "check_every_s": "0.2", "outage_gap_s": "2"}
        env = service_env(kafka_bootstrap, topics, **settings)
        cluster = fake_cluster(kafka_bootstrap, topics, h100_nodes(4), heartbeat_s=0.3)
        first, late, doomed = NodeId("n-0"), [NodeId("n-1"), NodeId("n-2")], NodeId("n-3")
        tasks = Tasks()
        try:
            tasks.start("fake-nodes", cluster.run())
            await cluster.ready.wait()
            start_pipeline(tasks, env, only=("node_health",))
            async with LogReader(kafka_bootstrap, [topics.health, topics.heartbeats]) as log:

                def failed() -> list[str]:
                    return [f.node for f in log.of(topics.health, NodeFailed)]

                # node_health judges silence: a node silent from the start is failed.
                await cluster.fail_node(doomed)
                await log.until(lambda: failed() == [doomed], timeout_s=60, check=tasks.check)

                # Every node's heartbeats stop (as when the broker is down), then n-0 is heard first and
                # the others LATE_S later.
                cluster.silent.update(cluster.nodes)
                await asyncio.sleep(OUTAGE_S)
                cluster.silent.discard(first)
                await asyncio.sleep(LATE_S)
                cluster.silent.difference_update(late)
                beats = len(log.of(topics.heartbeats, NodeHeartbeat))
                await log.until(
                    lambda: {b.node for b in log.of(topics.heartbeats, NodeHeartbeat)[beats:]} >= set(late),
                    timeout_s=60,
                    check=tasks.check,
                )
                assert failed() == [doomed]

                # Still judging after the outage: n-2 goes silent for good and is failed, n-1 is not.
                cluster.silent.add(late[1])
                await log.until(lambda: len(failed()) == 2, timeout_s=60, check=tasks.check)
            assert failed() == [doomed, late[1]]
            # In wall time the nodes heard late were silent for longer than the limit (what failed them).
            for node in late:
                times = [e.time for e in log.events[topics.heartbeats] if e.subject == node]
                longest = max((b - a).total_seconds() for a, b in itertools.pairwise(times))
                assert longest > SILENCE_S, (node, longest)
        finally:
            await tasks.stop()

        records = await KafkaSource(kafka_bootstrap).fetch(decider_topics(topics.prefix))
        result = replay_node_health(
            records,
            NodeHealthSettings(topic_prefix=topics.prefix, **settings),  # type: ignore[arg-type]
        )
        assert result.ok, [d.message for d in result.differences]
        assert result.compared > 0
