"""With pools a node agent writes its node's records and its jobs' reports to its pool's partition."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from agent_node_fakes import FakeBus, make_agent

from gangline.core.pools import PoolLayoutError
from gangline.events.base import make_envelope
from gangline.events.jobs import JobStarted
from gangline.events.types import AllocationId, JobId


async def test_an_agent_sends_to_the_partition_of_its_nodes_pool(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, FakeBus(), pools="spine=spine-x,spine-0")  # the node is under spine-0
    await agent.start()
    try:
        partition_of = agent._pool_partition()
        assert partition_of is not None
        started = make_envelope(
            JobStarted(job_id=JobId("j"), allocation_id=AllocationId("j.1")),
            event_id="e",
            source="t",
            time=datetime.now(UTC),
        )
        topics = agent.settings.topics
        assert [partition_of(t, started) for t in (topics.events, topics.heartbeats, topics.inventory)] == [
            1,
            1,
            1,
        ]
        assert partition_of(topics.allocations, started) is None  # not written by agents
    finally:
        await agent.stop()
    assert make_agent(tmp_path / "b", FakeBus())._pool_partition() is None  # no pools: by key


async def test_a_node_in_no_pool_is_refused(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, FakeBus(), pools="spine=spine-x,spine-y")
    await agent.start()
    try:
        with pytest.raises(PoolLayoutError, match="names no pool"):
            agent._pool_partition()
    finally:
        await agent.stop()
