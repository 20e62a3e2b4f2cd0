"""node_health's snapshots on the real broker: written in its transactions, loaded at a start, and a state
loaded from one and read on to the end of the log is the state rebuilt from the whole log (neither reads
heartbeats), deciding the same."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
from service_kafka_helpers import T0, envelope, on_topics, running

import gangline.bus.snapshots as snapshot_format
from gangline.bus.producer import EventProducer
from gangline.bus.snapshots import Snapshot, read_latest
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope
from gangline.events.jobs import JobAdmitted, JobSpec
from gangline.events.nodes import GpuErrorReported, GpuHealthChanged, HealthCause, NodeFailed, NodeHeartbeat
from gangline.events.types import AllocationId, GpuId, JobId, NodeId
from services.common.select import select_types
from services.common.shell import read_to_end
from services.common.snapshots import decode_state, encode_state
from services.common.topics import TopicNames
from services.node_health.handlers import SOURCE, NodeHealthState, decide
from services.node_health.settings import NodeHealthSettings
from services.node_health.wiring import (
    NODE_HEALTH_EVENTS,
    SERVICE,
    main,
    new_state,
    restore_topics,
    state_snapshots,
)

pytestmark = pytest.mark.kafka

XID = HealthCause(kind="xid", message="xid.13: graphics engine exception", xid=13)
SPEC = ClusterSpec(
    name="nhsnap",
    groups=(
        NodeGroup(name="n", count=3, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="l"),
    ),
)


def granted(job: str, node: str, at: float) -> Envelope:
    placement = Placement(rank=0, node=NodeId(node), gpus=(GpuId("gpu0"),))
    event = AllocationGranted(
        job_id=JobId(job), allocation_id=AllocationId(f"{job}.1"), queue="default", placements=(placement,)
    )
    return envelope(event, at)


def xid(node: str, gpu: str, at: float) -> Envelope:
    return envelope(GpuErrorReported(node=NodeId(node), gpu=GpuId(gpu), state="healthy", cause=XID), at)


async def node_health_said(bootstrap: str, topics: TopicNames, *, released: int, degraded: int) -> None:
    """Until node_health released at least ``released`` allocations and drained ``degraded`` GPUs."""
    counts = {AllocationReleased: 0, GpuHealthChanged: 0}

    def keep(event: Envelope) -> None:
        for kind in counts:
            if isinstance(event.data, kind) and event.source == SOURCE:
                counts[kind] += 1

    for _ in range(300):
        counts.update(dict.fromkeys(counts, 0))
        await read_to_end(bootstrap, [topics.allocations, topics.health], keep, service="test")
        if counts[AllocationReleased] >= released and counts[GpuHealthChanged] >= degraded:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"node_health wrote {counts}")


async def latest_snapshot(bootstrap: str, topics: TopicNames, *, covering: int) -> Snapshot:
    """The latest snapshot once it covers at least ``covering`` records of nodes.health."""
    for _ in range(300):
        found = await read_latest(bootstrap, topics.snapshots(SERVICE))
        events = sum(
            o for (t, _), o in (found.manifest.positions.items() if found else ()) if t == topics.health
        )
        if found is not None and events >= covering:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError("no snapshot covering the events")


async def rebuilt(
    settings: NodeHealthSettings, topics: TopicNames, started: datetime, *, snapshot: bool
) -> tuple[NodeHealthState, int]:
    """A state as a start at ``started`` builds it: from the latest snapshot and the tail, or the log."""
    state = new_state(settings, now=started)
    snapshots = state_snapshots(settings, state)
    assert snapshots is not None
    start = await snapshots.load(settings.kafka_bootstrap) if snapshot else {}
    assert bool(start) == snapshot
    events = await read_to_end(
        settings.kafka_bootstrap,
        restore_topics(topics),
        state.restore,
        service=SERVICE,
        select=select_types(dict.fromkeys(NODE_HEALTH_EVENTS, True)),
        start=start,
    )
    return state, events


def comparable(state: NodeHealthState, at: datetime) -> tuple[dict[str, object], object, object]:
    """The saved fields (the error windows judged at ``at``: a query drops what left them), and
    what a start sets besides (tests/unit/services/test_node_health_snapshots.py)."""
    windows = state.rates._windows
    for key in windows.recorded():
        windows.verdict(key, at)
    fields = decode_state(encode_state(state), NodeHealthState.SNAPSHOT_FIELDS)
    fields["rates._windows"] = (
        {kind: (c._times, c._counts) for kind, c in windows._counters.items()},
        windows._xid_times,
        windows._xids,
    )
    return fields, state.last_seen, state.last_seq


def next_decisions(state: NodeHealthState, started: datetime) -> list[Envelope]:
    """Two more job-fault XIDs on n-1/gpu1 (its third drains it), then n-0 alone heard past the silence."""
    out: list[Envelope] = []
    causes = [xid("n-1", "gpu1", 200), xid("n-1", "gpu1", 201)]
    start = (started - T0).total_seconds()
    # Beats closer than the outage gap (half the silence): the bus counts as heard all along.
    causes += [envelope(NodeHeartbeat(node=NodeId("n-0"), seq=100 + k), start + 1500 * k) for k in range(4)]
    for k, cause in enumerate(causes):
        cause = cause.model_copy(update={"id": f"next{k}"})
        out += [e for _, e in decide(cause, state, now=max(started, cause.time))]
    return out


async def test_a_restart_from_node_healths_snapshot_and_the_tail_decides_as_one_from_the_whole_log(
    kafka_bootstrap: str, service_topics: TopicNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_format, "CHUNK_BYTES", 2048)
    settings = NodeHealthSettings(
        **on_topics(kafka_bootstrap, service_topics),
        silence_s=3600,
        snapshot_every_events=4,
    )
    async with running(main(settings)), EventProducer(kafka_bootstrap) as producer:
        for node in SPEC.registrations():
            await producer.publish(service_topics.inventory, envelope(node, 0))
        for k, node in enumerate(("n-0", "n-1", "n-2")):
            spec = JobSpec(queue="default", workers=1, gpus_per_worker=1)
            await producer.publish(
                service_topics.events, envelope(JobAdmitted(job_id=JobId(f"j{k}"), spec=spec), 1)
            )
            await producer.publish(service_topics.allocations, granted(f"j{k}", node, 2 + k))
        # Three job-fault XIDs drain n-0/gpu3; one on n-1/gpu1; n-2 fails (its gang released).
        for k in range(3):
            await producer.publish(service_topics.health, xid("n-0", "gpu3", 10 + k))
        await producer.publish(service_topics.health, xid("n-1", "gpu1", 14))
        await node_health_said(kafka_bootstrap, service_topics, released=0, degraded=1)
        failed = NodeFailed(node=NodeId("n-2"), code="agent_reported", reason="it died")
        await producer.publish(service_topics.health, envelope(failed, 15))
        await node_health_said(kafka_bootstrap, service_topics, released=1, degraded=1)
        await latest_snapshot(kafka_bootstrap, service_topics, covering=5)
        # After the snapshot: n-0 fails too, and n-2 registers again.
        failed = NodeFailed(node=NodeId("n-0"), code="agent_reported", reason="psu")
        await producer.publish(service_topics.health, envelope(failed, 20))
        await producer.publish(service_topics.inventory, envelope(SPEC.registrations()[2], 21))
        await node_health_said(kafka_bootstrap, service_topics, released=2, degraded=1)
    latest = await read_latest(kafka_bootstrap, service_topics.snapshots(SERVICE))
    assert latest is not None and latest.manifest.chunks > 1
    started = T0 + timedelta(hours=1)
    from_snapshot, tail = await rebuilt(settings, service_topics, started, snapshot=True)
    from_log, whole = await rebuilt(settings, service_topics, started, snapshot=False)
    assert tail < whole
    (fields, *rest), (rebuilt_fields, *rebuilt_rest) = (
        comparable(from_snapshot, started),
        comparable(from_log, started),
    )
    assert [name for name in fields if fields[name] != rebuilt_fields[name]] == []
    assert rest == rebuilt_rest
    decided = next_decisions(from_snapshot, started)
    assert {type(e.data) for e in decided} >= {GpuHealthChanged, NodeFailed}
    assert decided == next_decisions(from_log, started)
