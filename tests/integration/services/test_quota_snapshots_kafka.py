"""Quota's snapshots on the real broker: written in its transactions, loaded at a start, and a state loaded
from one and read on to the end of the log (queues.status whole) is the state rebuilt from the whole log,
deciding the same."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from service_kafka_helpers import T0, envelope, on_topics, running

import gangline.bus.snapshots as snapshot_format
from gangline.bus.producer import EventProducer
from gangline.bus.snapshots import Snapshot, read_latest
from gangline.cluster_spec import ClusterSpec, NodeGroup
from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope
from gangline.events.jobs import JobAdmitted, JobPending, JobQueued, JobSpec
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.shell import read_to_end
from services.common.snapshots import decode_state, encode_state
from services.common.topics import TopicNames
from services.quota.handlers import QuotaState, decide
from services.quota.settings import QuotaSettings
from services.quota.wiring import (
    RESTORE_EVENTS,
    SERVICE,
    main,
    new_state,
    quota_select,
    restore_topics,
    state_snapshots,
)

pytestmark = pytest.mark.kafka

H100 = "H100-SXM5-80GB"
QUEUES = f"""
cohorts:
  - name: lab
queues:
  - name: team-a
    cohort: lab
    quotas: {{{H100}: {{nominal: 8}}}}
  - name: team-b
    cohort: lab
    quotas: {{{H100}: {{nominal: 8}}}}
  - name: default
    unlimited: true
"""


def admitted(job: str, queue: str, gpus: int, at: float) -> Envelope:
    spec = JobSpec(queue=queue, workers=1, gpus_per_worker=gpus)
    return envelope(JobAdmitted(job_id=JobId(job), spec=spec), at)


def granted(job: str, queue: str, at: float) -> Envelope:
    placement = Placement(rank=0, node=NodeId("q-0"), gpus=("g0",))
    allocation = AllocationId(f"{job}.1")
    return envelope(
        AllocationGranted(job_id=JobId(job), allocation_id=allocation, queue=queue, placements=(placement,)),
        at,
    )


def released(job: str, at: float) -> Envelope:
    allocation = AllocationId(f"{job}.1")
    return envelope(AllocationReleased(job_id=JobId(job), allocation_id=allocation, reason="completed"), at)


async def quota_said(bootstrap: str, topics: TopicNames, *, queued: int, pending: int) -> None:
    """Until quota wrote at least ``queued`` job.queued and ``pending`` job.pending."""
    counts = {JobQueued: 0, JobPending: 0}

    def keep(event: Envelope) -> None:
        for kind in counts:
            if isinstance(event.data, kind):
                counts[kind] += 1

    for _ in range(300):
        counts.update(dict.fromkeys(counts, 0))
        await read_to_end(bootstrap, [topics.events], keep, service="test")
        if counts[JobQueued] >= queued and counts[JobPending] >= pending:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"quota wrote {counts}")


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


async def rebuilt(settings: QuotaSettings, topics: TopicNames, *, snapshot: bool) -> tuple[QuotaState, int]:
    """A state as a start builds it: from the latest snapshot and the tail, or from the whole log."""
    state = new_state(settings)
    snapshots = state_snapshots(settings, state)
    assert snapshots is not None
    start = await snapshots.load(settings.kafka_bootstrap) if snapshot else {}
    assert bool(start) == snapshot
    assert topics.queue_status not in {t for t, _ in start}  # read whole: the board is not in a snapshot
    events = await read_to_end(
        settings.kafka_bootstrap,
        list(restore_topics(topics)),
        state.restore,
        service=SERVICE,
        select=quota_select(topics, state.retired, RESTORE_EVENTS),
        start=start,
    )
    return state, events


def comparable(state: QuotaState) -> object:
    """The saved fields as quota reads them (tests/unit/services/test_quota_snapshots.py), and what the
    state works out or reads besides them."""
    fields = dict(decode_state(encode_state(state), QuotaState.SNAPSHOT_FIELDS))
    fields["cluster.retired"] = sorted(state.cluster.retired)
    ledger = {q: state.ledger.usage_vector(q) for q in state.queues.tree.queue_names()}
    board = (state.status.published, state.status.published_at)
    return fields, ledger, board, sorted(state.stranded)


def next_decisions(state: QuotaState) -> list[Envelope]:
    now = T0 + timedelta(hours=1)
    out: list[Envelope] = []
    for k, cause in enumerate(
        [
            admitted("next-a", "team-a", 4, 3600),
            admitted("next-b", "team-b", 8, 3601),
            released("a0", 3602),
            released("b0", 3603),
        ]
    ):
        cause = cause.model_copy(update={"id": f"next{k}"})
        out += [e for _, e in decide(cause, state, now=now)]
    return out


async def test_a_restart_from_quotas_snapshot_and_the_tail_decides_as_one_from_the_whole_log(
    kafka_bootstrap: str, service_topics: TopicNames, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Small chunks: even this state spans several records, put back together on load.
    monkeypatch.setattr(snapshot_format, "CHUNK_BYTES", 2048)
    queues_file = tmp_path / "queues.yaml"
    queues_file.write_text(QUEUES)
    settings = QuotaSettings(
        **on_topics(kafka_bootstrap, service_topics),
        queues_file=queues_file,
        fair_share_half_life_s=600,  # the decayed usage a restore rebuilds is the snapshot's
        status_interval_s=0,
        snapshot_every_events=4,
    )
    spec = ClusterSpec(
        name="qsnap",
        groups=(NodeGroup(name="q", count=2, gpu_model=H100, gpus_per_node=8, memory_mib=81920, leaf="l"),),
    )
    async with running(main(settings)), EventProducer(kafka_bootstrap) as producer:
        for node in spec.registrations():
            await producer.publish(service_topics.inventory, envelope(node, 0))
        # team-a's 8 GPUs: a0 and a1 go, a2 waits; team-b's b0 goes and b1 borrows nothing.
        for k, (job, queue, gpus) in enumerate(
            [("a0", "team-a", 4), ("a1", "team-a", 4), ("a2", "team-a", 4), ("b0", "team-b", 8)]
        ):
            await producer.publish(service_topics.events, admitted(job, queue, gpus, 1 + k))
        await producer.publish(service_topics.events, admitted("u0", "default", 2, 5))
        await quota_said(kafka_bootstrap, service_topics, queued=3, pending=1)
        for k, job in enumerate(("a0", "a1", "b0")):
            await producer.publish(service_topics.allocations, granted(job, f"team-{job[0]}", 6 + k))
        await latest_snapshot(kafka_bootstrap, service_topics, covering=5)
        # After the snapshot: a1 ends (a2 goes), more jobs come (one waits).
        await producer.publish(service_topics.allocations, released("a1", 10))
        await producer.publish(service_topics.events, admitted("a3", "team-a", 8, 11))
        await producer.publish(service_topics.events, admitted("b1", "team-b", 4, 12))
        await quota_said(kafka_bootstrap, service_topics, queued=4, pending=2)
    latest = await read_latest(kafka_bootstrap, service_topics.snapshots(SERVICE))
    assert latest is not None and latest.manifest.chunks > 1
    from_snapshot, tail = await rebuilt(settings, service_topics, snapshot=True)
    from_log, whole = await rebuilt(settings, service_topics, snapshot=False)
    assert tail < whole
    assert comparable(from_snapshot) == comparable(from_log)
    assert from_snapshot.status.published  # the board, read whole from queues.status
    decided = next_decisions(from_snapshot)
    assert any(isinstance(e.data, JobQueued) for e in decided)
    assert decided == next_decisions(from_log)
