"""Placement's snapshots on the real broker: written in its transactions, loaded at a start, and a state
loaded from one and read on to the end of the log is the state rebuilt from the whole log, deciding the
same. An unreadable snapshot means a full rebuild, with a log line."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta

import pytest
from aiokafka import AIOKafkaProducer
from service_kafka_helpers import T0, envelope, on_topics, running

import gangline.bus.snapshots as snapshot_format
from gangline.bus.producer import EventProducer
from gangline.bus.security import client_options
from gangline.bus.snapshots import MANIFEST_KEY, Snapshot, read_latest
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted
from gangline.events.base import Envelope, make_envelope
from gangline.events.jobs import JobAdmitted, JobCompleted, JobSpec
from gangline.events.types import JobId
from gangline.fold.cluster import FOLDED_EVENTS
from services.common import shell
from services.common.env import processor_settings
from services.common.select import select_types
from services.common.shell import WarmStandby, read_to_end
from services.common.snapshots import StateSnapshots, decode_state, encode_state
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState, end_batch, fold_event
from services.placement.settings import PlacementSettings
from services.placement.wiring import SERVICE, main, new_state, snapshot_config

pytestmark = pytest.mark.kafka


def restore_topics(topics: TopicNames) -> list[str]:
    return [topics.inventory, topics.health, topics.operator, topics.events, topics.allocations]


def snapshots_of(state: PlacementState, settings: PlacementSettings, topics: TopicNames) -> StateSnapshots:
    found = settings.state_snapshots(
        state,
        topic=topics.snapshots(SERVICE),
        service=SERVICE,
        restore_topics=restore_topics(topics),
        config=snapshot_config(state),
    )
    assert found is not None
    return found


def admitted(job: str, at: float) -> Envelope:
    spec = JobSpec(queue="default", workers=1, gpus_per_worker=2)
    return envelope(JobAdmitted(job_id=JobId(job), spec=spec), at)


async def grants(bootstrap: str, topics: TopicNames, at_least: int) -> list[AllocationGranted]:
    found: list[AllocationGranted] = []

    def keep(event: Envelope) -> None:
        if isinstance(event.data, AllocationGranted):
            found.append(event.data)

    for _ in range(300):
        found.clear()
        await read_to_end(bootstrap, [topics.allocations], keep, service="test")
        if len(found) >= at_least:
            return list(found)
        await asyncio.sleep(0.2)
    raise AssertionError(f"{len(found)} grants, not {at_least}")


async def latest_snapshot(bootstrap: str, topics: TopicNames, *, covering: int) -> Snapshot:
    """The latest snapshot once it covers at least ``covering`` records of jobs.events."""
    for _ in range(300):
        found = await read_latest(bootstrap, topics.snapshots(SERVICE))
        events = sum(
            o for (t, _), o in (found.manifest.positions.items() if found else ()) if t == topics.events
        )
        if found is not None and events >= covering:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError("no snapshot covering the events")


async def rebuilt(
    settings: PlacementSettings, topics: TopicNames, *, snapshot: bool
) -> tuple[PlacementState, int]:
    """A state as a start builds it: from the latest snapshot and the tail, or from the whole log."""
    state = new_state(settings)
    start = await snapshots_of(state, settings, topics).load(settings.kafka_bootstrap) if snapshot else {}
    assert bool(start) == snapshot
    events = await read_to_end(
        settings.kafka_bootstrap,
        restore_topics(topics),
        state.restore,
        service=SERVICE,
        select=select_types(dict.fromkeys(FOLDED_EVENTS, True)),
        start=start,
    )
    return state, events


def saved(state: PlacementState) -> object:
    return decode_state(encode_state(state), PlacementState.SNAPSHOT_FIELDS)


def next_decisions(state: PlacementState) -> list[Envelope]:
    now = T0 + timedelta(hours=1)
    for k in range(3):
        fold_event(
            make_envelope(admitted(f"next{k}", 3600).data, event_id=f"n{k}", source="t", time=now),
            state,
            now=now,
        )
    return [e for _, e in end_batch(state, cause="next", now=now)]


async def test_a_restart_from_placements_snapshot_and_the_tail_decides_as_one_from_the_whole_log(
    kafka_bootstrap: str, service_topics: TopicNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small chunks: even this state spans several records, put back together on load.
    monkeypatch.setattr(snapshot_format, "CHUNK_BYTES", 2048)
    settings = PlacementSettings(
        **on_topics(kafka_bootstrap, service_topics),
        gated=False,
        snapshot_every_events=4,
    )
    spec = ClusterSpec(
        name="snap",
        groups=(
            NodeGroup(
                name="a", count=2, gpu_model="H100-SXM5-80GB", gpus_per_node=8, memory_mib=81920, leaf="l"
            ),
        ),
    )
    async with running(main(settings)), EventProducer(kafka_bootstrap) as producer:
        for node in spec.registrations():
            await producer.publish(service_topics.inventory, envelope(node, 0))
        for k in range(6):
            await producer.publish(service_topics.events, admitted(f"j{k}", 1 + k))
        first = await grants(kafka_bootstrap, service_topics, 6)
        await latest_snapshot(kafka_bootstrap, service_topics, covering=6)
        # After the snapshot: two jobs end (placement releases them) and three more come.
        for k, granted in enumerate(first[:2]):
            done = JobCompleted(job_id=granted.job_id, allocation_id=granted.allocation_id)
            await producer.publish(service_topics.events, envelope(done, 10 + k))
        for k in range(6, 9):
            await producer.publish(service_topics.events, admitted(f"j{k}", 20 + k))
        await grants(kafka_bootstrap, service_topics, 9)
    latest = await read_latest(kafka_bootstrap, service_topics.snapshots(SERVICE))
    assert latest is not None and latest.manifest.chunks > 1
    from_snapshot, tail = await rebuilt(settings, service_topics, snapshot=True)
    from_log, whole = await rebuilt(settings, service_topics, snapshot=False)
    assert tail < whole
    assert saved(from_snapshot) == saved(from_log)
    decided = next_decisions(from_snapshot)
    assert any(isinstance(e.data, AllocationGranted) for e in decided)
    assert decided == next_decisions(from_log)


async def test_a_snapshot_of_an_unknown_format_means_a_full_rebuild_with_a_log_line(
    kafka_bootstrap: str, service_topics: TopicNames, caplog: pytest.LogCaptureFixture
) -> None:
    settings = PlacementSettings(
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=service_topics.prefix,
        instance_id="i0",
        metrics_port=None,
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, **client_options())
    await producer.start()
    try:
        await producer.send_and_wait(
            service_topics.snapshots(SERVICE), b'{"format": 99, "chunks": 1}', key=MANIFEST_KEY, partition=0
        )
    finally:
        await producer.stop()
    state = new_state(settings)
    with caplog.at_level(logging.WARNING, logger="services.common.snapshots"):
        start = await snapshots_of(state, settings, service_topics).load(kafka_bootstrap)
    assert start == {}
    assert "rebuilding from the whole log" in caplog.text and "format 99" in caplog.text
    assert not state.jobs and not state.nodes


async def test_a_missing_snapshot_topic_means_a_full_rebuild_and_no_snapshots(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topics = TopicNames(prefix=f"t-nosnap-{uuid.uuid4().hex[:8]}.")
    settings = PlacementSettings(
        kafka_bootstrap=kafka_bootstrap, topic_prefix=topics.prefix, instance_id="i0", metrics_port=None
    )
    state = new_state(settings)
    snapshots = snapshots_of(state, settings, topics)
    with caplog.at_level(logging.WARNING, logger="services.common.snapshots"):
        assert await snapshots.load(kafka_bootstrap) == {}
    assert "snapshot topic unusable" in caplog.text
    assert snapshots.records({(topics.events, 0): 1}, 1_000_000, {}) == []


async def test_a_warm_standby_keeps_its_state_read_to_the_logs_end_and_it_is_the_rebuild(
    kafka_bootstrap: str,
    service_topics: TopicNames,
) -> None:
    """The standby restores while it waits for the lock (no snapshot yet: the whole log), reads what the
    log gains, and, told to finish, stops after the pass in hand: its state is the rebuild from the whole
    log, and where it got to is the log's end (the leader it becomes reads nothing more)."""
    settings = PlacementSettings(
        **on_topics(kafka_bootstrap, service_topics),
        gated=False,
    )
    select = select_types(dict.fromkeys(FOLDED_EVENTS, True))
    state = new_state(settings)
    warm = WarmStandby(
        processor_settings(settings, SERVICE, restore_topics(service_topics)),
        state,
        restore_topics(service_topics),
        select,
        snapshots_of(state, settings, service_topics),
    )
    async with EventProducer(kafka_bootstrap) as producer:
        for k in range(5):
            await producer.publish(service_topics.events, admitted(f"j{k}", k))
        warming = asyncio.create_task(warm.run())
        for _ in range(300):
            if warm.events >= 5:
                break
            await asyncio.sleep(0.05)
        assert warm.events == 5 and not warming.done()
        for k in range(5, 8):
            await producer.publish(service_topics.events, admitted(f"j{k}", k))
        for _ in range(300):  # it keeps reading what the log gains
            if warm.events >= 8:
                break
            await asyncio.sleep(0.05)
        await warm.finish(warming)
        assert warm.events == 8
        # Written after it finished (the predecessor's last transactions): the leader's tail.
        for k in range(8, 10):
            await producer.publish(service_topics.events, admitted(f"j{k}", k))
    tail = await read_to_end(
        kafka_bootstrap,
        restore_topics(service_topics),
        state.restore,
        service=SERVICE,
        select=select,
        start=warm.positions,
    )
    cold, events = await rebuilt(settings, service_topics, snapshot=False)
    assert (tail, events) == (2, 10)
    assert saved(state) == saved(cold)


class _LockClaimed(Exception):
    """Ends the seat at its lock claim (the test needs nothing after it)."""


async def test_a_home_seat_restores_to_the_logs_end_before_it_claims_its_lock(
    kafka_bootstrap: str, service_topics: TopicNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home claim takes the lock from its holder at once (services.common.leader): the home seat reads
    the snapshot and the log to its end first, so the pool waits for the fence and the tail only."""
    claimed_with: list[int] = []

    class Lock:
        def __init__(self, *args: object, **kwargs: object) -> None:
            assert kwargs["home"] is True
            self.lost = asyncio.Event()

        async def acquire(self) -> None:
            claimed_with.append(len(state.jobs))
            raise _LockClaimed

        async def release(self) -> None:
            pass

    monkeypatch.setattr(shell, "Leadership", Lock)
    topics = service_topics
    settings = PlacementSettings(**on_topics(kafka_bootstrap, topics), gated=False)
    async with EventProducer(kafka_bootstrap) as producer:
        for k in range(5):
            await producer.publish(topics.events, admitted(f"j{k}", k))
    state = new_state(settings)
    select = select_types(dict.fromkeys(FOLDED_EVENTS, True))
    with pytest.raises(_LockClaimed):
        await shell.restore_and_process(
            processor_settings(settings, SERVICE, restore_topics(topics)),
            state,
            lambda envelope, meta: [],
            restore_topics=restore_topics(topics),
            select=select,
            lock_topic=topics.inventory,
            lock_home=True,
            record_inputs=True,
            snapshots=snapshots_of(state, settings, topics),
        )
    assert claimed_with == [5]
