"""Placement's decisions replayed from a recorded log: identical when untouched; a tampered grant or a
dropped input is named (position, job, field). The log is written the way the shell and processor
write it (no Kafka): inputs on partitions, one cycle per batch, outputs stamped with input positions."""

from __future__ import annotations

import json
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import T0, cluster, env, standin_registration

from gangline.bus.positions import INCARNATION_HEADER, INPUTS_HEADER, Partition, format_positions, merged
from gangline.core.defaults import default_profile
from gangline.events.allocations import AllocationReleased
from gangline.events.base import Envelope
from gangline.events.chain import ChainWriter
from gangline.events.codec import encode
from gangline.events.jobs import JobAdmitted, JobCancelRequested, JobCompleted, JobQueued, JobSpec
from gangline.events.types import AllocationId, JobId, QueueName, Seconds
from gangline.fold.cluster import FOLDED_EVENTS
from gangline.replay.log import LogRecord, write_jsonl
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState, end_batch, fold_event
from services.placement.replay import LIVE_EVENTS, main, replay_placement

TOPICS = TopicNames()
JOB_PARTITIONS = 3
GRANTED = "gangline.allocation.granted.v1"


def _kind(record: LogRecord) -> str:
    return ".".join(record.type.split(".")[1:-1])


class Recorder:
    """Placement as the shell runs it, writing the log it would leave (offsets, times, headers)."""

    def __init__(self, *, gated: bool = False) -> None:
        self.gated = gated
        self.records: list[LogRecord] = []
        self.ends: dict[Partition, int] = {}
        self.chains: dict[tuple[int, str], ChainWriter] = {}
        self.clock = T0
        self.runs = 0
        self.start()

    def start(self) -> None:
        """A (re)start: a fresh state restored from the log as it stands, a new incarnation."""
        self.runs += 1
        self.incarnation = f"run-{self.runs}"
        self.state = PlacementState(topics=TOPICS, profile=default_profile(), gated=self.gated)
        restore = (TOPICS.inventory, TOPICS.health, TOPICS.events, TOPICS.allocations)
        for topic in restore:
            for r in sorted(
                (r for r in self.records if r.topic == topic), key=lambda r: (r.partition, r.offset)
            ):
                if _kind(r) in FOLDED_EVENTS:
                    self.state.restore(self._envelope(r))
        self.folded = {tp: end for tp, end in self.ends.items() if tp[0] in restore}
        # The consumer goes on from the committed offsets: what the restore read comes again (no change).
        self.consumed: dict[Partition, int] = getattr(self, "consumed", {})

    @staticmethod
    def _envelope(r: LogRecord) -> Envelope:
        from gangline.events.codec import decode, dumps

        return decode(dumps(r.envelope))

    def _tick(self) -> None:
        self.clock += timedelta(milliseconds=7)

    def _append(self, topic: str, envelope: Envelope, headers: dict[str, str] | None = None) -> LogRecord:
        partitions = JOB_PARTITIONS if topic in (TOPICS.events, TOPICS.allocations, TOPICS.requests) else 1
        partition = zlib.crc32(envelope.subject.encode()) % partitions
        offset = self.ends.get((topic, partition), 0)
        self.ends[(topic, partition)] = offset + 1
        self._tick()
        body = json.loads(encode(envelope))
        if topic == TOPICS.allocations:  # the allocations log is hash-chained per partition and writer
            chain = self.chains.setdefault((partition, envelope.source), ChainWriter())
            headers = {**(headers or {}), **chain.headers_for(body)}
        record = LogRecord(
            topic=topic,
            partition=partition,
            offset=offset,
            key=envelope.subject,
            envelope=body,
            headers=headers or {},
            timestamp_ms=int(self.clock.timestamp() * 1000),
        )
        self.records.append(record)
        return record

    def produce(self, topic: str, envelope: Envelope) -> LogRecord:
        return self._append(topic, envelope)

    def poll(self) -> list[Outgoing]:
        """One batch of everything not consumed yet: fold each as the live select does, then one cycle."""
        batch = [r for r in self.records if r.offset >= self.consumed.get((r.topic, r.partition), 0)]
        batch = [r for r in batch if r.topic in (*self.folded_topics(), TOPICS.requests, TOPICS.heartbeats)]
        if not batch:
            return []
        positions = merged(self.folded, {(r.topic, r.partition): r.offset + 1 for r in batch})
        outputs: list[tuple[str, Envelope]] = []
        given: list[Envelope] = []
        for r in batch:
            kind = _kind(r)
            if r.topic == TOPICS.requests and kind != "job.cancel_requested":
                continue
            if r.topic != TOPICS.requests and kind not in LIVE_EVENTS:
                continue
            envelope = self._envelope(r)
            given.append(envelope)
            self._tick()
            for topic, out in fold_event(envelope, self.state, now=self.clock):
                outputs.append((topic, out.model_copy(update={"causationid": envelope.id})))
        if given:
            self._tick()
            cause = given[-1].id
            for topic, out in end_batch(self.state, cause=cause, now=self.clock):
                outputs.append((topic, out.model_copy(update={"causationid": cause})))
        headers = {INPUTS_HEADER: format_positions(positions), INCARNATION_HEADER: self.incarnation}
        for topic, out in outputs:
            self._append(topic, out, headers)
        self.folded = positions
        self.consumed = {(r.topic, r.partition): r.offset + 1 for r in batch} | {
            tp: offset
            for tp, offset in self.consumed.items()
            if tp not in {(r.topic, r.partition) for r in batch}
        }
        return outputs

    @staticmethod
    def folded_topics() -> tuple[str, ...]:
        return (TOPICS.inventory, TOPICS.health, TOPICS.events, TOPICS.allocations)


Outgoing = tuple[str, Envelope]


def admitted(job_id: str, *, at: float, **spec: object) -> Envelope:
    fields: dict[str, object] = {"queue": "default", "workers": 1, "gpus_per_worker": 1, **spec}
    return env(JobAdmitted(job_id=JobId(job_id), spec=JobSpec.model_validate(fields)), at=at)


def granted(records: list[LogRecord]) -> list[LogRecord]:
    return [r for r in records if r.type == GRANTED]


def release_of(grant: LogRecord) -> Envelope:
    data = grant.envelope["data"]
    return env(
        AllocationReleased(
            job_id=JobId(data["job_id"]),
            allocation_id=AllocationId(data["allocation_id"]),
            reason="completed",
        )
    )


def recorded_log() -> Recorder:
    """Jobs come, some wait, releases let others run, placement restarts, a running job is cancelled."""
    rec = Recorder()
    for node in cluster(("a", 2, 8)).registrations():
        rec.produce(TOPICS.inventory, env(node))
    for k in range(5):
        rec.produce(TOPICS.events, admitted(f"j{k}", gpus_per_worker=4, at=k))
    assert rec.poll()
    rec.produce(TOPICS.allocations, release_of(granted(rec.records)[0]))
    rec.produce(TOPICS.events, admitted("j5", workers=2, gpus_per_worker=2, priority=5, at=10))
    assert rec.poll()
    rec.start()  # kill -9 and start: state restored from the log; waiting jobs are told why again
    rec.produce(TOPICS.events, admitted("j6", gpus_per_worker=8, at=20))
    assert rec.poll()
    rec.produce(TOPICS.allocations, release_of(granted(rec.records)[1]))
    rec.produce(TOPICS.requests, env(JobCancelRequested(job_id=JobId("j3"), reason="no longer needed")))
    assert rec.poll()
    rec.produce(TOPICS.events, admitted("j7", gpus_per_worker=1, at=30))
    rec.produce(TOPICS.events, env(JobQueued(job_id=JobId("j7"), queue=QueueName("default"))))
    rec.poll()
    return rec


def test_an_untouched_log_replays_identical_across_a_restart() -> None:
    rec = recorded_log()
    outputs = [r for r in rec.records if INPUTS_HEADER in r.headers]
    assert len(granted(rec.records)) >= 5

    result = replay_placement(rec.records, topics=TOPICS, gated=False)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2
    assert result.transactions >= 4
    assert result.compared == len(outputs)


def tampered(records: list[LogRecord], target: LogRecord, edit: Any) -> list[LogRecord]:
    out = []
    for r in records:
        if r is target:
            envelope: dict[str, Any] = json.loads(json.dumps(r.envelope))
            edit(envelope)
            r = LogRecord(r.topic, r.partition, r.offset, r.key, envelope, r.headers, r.timestamp_ms)
        out.append(r)
    return out


def test_a_grant_with_a_changed_gpu_is_named_with_its_position_job_and_field() -> None:
    records = recorded_log().records
    target = granted(records)[1]
    real = target.envelope["data"]["placements"][0]["gpus"][0]

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["placements"][0]["gpus"][0] = "gpu99"

    result = replay_placement(tampered(records, target, forge), topics=TOPICS, gated=False)

    assert not result.ok
    first = result.first
    assert first is not None
    assert first.where == target.where
    assert first.job_id == target.envelope["data"]["job_id"]
    assert first.field == "data.placements[0].gpus[0]"
    assert (first.recorded, first.replayed) == ('"gpu99"', json.dumps(real))


def test_a_dropped_input_is_named_as_the_decision_it_changes() -> None:
    records = recorded_log().records
    dropped = next(r for r in records if r.type == "gangline.allocation.released.v1")
    [freed_for] = [r for r in granted(records) if r.envelope["data"]["job_id"] == "j5"]
    kept = [r for r in records if r is not dropped]

    result = replay_placement(kept, topics=TOPICS, gated=False)

    # Without the release j5's gang does not fit: its recorded grant is not decided.
    first = result.first
    assert first is not None
    assert (first.where, first.job_id, first.field) == (freed_for.where, "j5", GRANTED)
    assert first.replayed == "not decided by the replay"


def test_outputs_without_input_positions_cannot_be_verified() -> None:
    records = recorded_log().records
    target = granted(records)[0]
    stripped = [
        LogRecord(r.topic, r.partition, r.offset, r.key, r.envelope, {}, r.timestamp_ms) if r is target else r
        for r in records
    ]

    result = replay_placement(stripped, topics=TOPICS, gated=False)

    assert [(d.where, d.field) for d in result.differences[:1]] == [(target.where, "headers")]


def test_the_command_line_exits_0_when_identical_and_1_on_a_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = recorded_log().records
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_jsonl(records, good)

    def forge(envelope: dict[str, Any]) -> None:
        envelope["data"]["placements"][0]["node"] = "a-9"

    write_jsonl(tampered(records, granted(records)[0], forge), bad)

    assert main(["--from", str(good), "--ungated"]) == 0
    assert "identical" in capsys.readouterr().out
    assert main(["--from", str(bad), "--ungated"]) == 1
    assert "data.placements[0].node" in capsys.readouterr().out


def test_gangline_replay_verifies_with_the_placement_service_as_decider(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.tools.cli import main as gangline_main

    records = recorded_log().records
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_jsonl(records, good)
    dropped = next(r for r in records if r.type == "gangline.allocation.released.v1")
    write_jsonl([r for r in records if r is not dropped], bad)
    argv = ["replay", "--verify", "--decider", "placement-service", "--ungated", "--from"]

    assert gangline_main([*argv, str(good)]) == 0
    out = capsys.readouterr().out
    # 9: j6 waits for jobs with no known end (its earliest start is unknown, not beyond the default
    # profile's reservation horizon), so it holds its GPUs and j7 gets a pending reason.
    assert "hash chain: 9 chained records in 4 chain(s): OK" in out
    assert "5 transactions in 2 run(s)" in out
    assert gangline_main([*argv, str(bad)]) == 1
    assert (
        "job j5: gangline.allocation.granted.v1: recorded sent, replayed not decided"
        in capsys.readouterr().out
    )


def completion_of(grant: LogRecord) -> Envelope:
    data = grant.envelope["data"]
    return env(
        JobCompleted(
            job_id=JobId(data["job_id"]),
            allocation_id=AllocationId(data["allocation_id"]),
            gpu_seconds=Seconds(60),
        )
    )


def test_releases_of_ended_jobs_replay_identical_including_one_found_at_restore() -> None:
    # The agents report ends on jobs.events; placement writes the releases, one of them for a job that
    # ended while it was down (found by the restore, released by the first batch after it).
    rec = Recorder()
    for node in cluster(("a", 1, 8)).registrations():
        rec.produce(TOPICS.inventory, env(node))
    for k in range(3):
        rec.produce(TOPICS.events, admitted(f"j{k}", gpus_per_worker=4, at=k))
    assert rec.poll()
    first, second = granted(rec.records)[:2]
    rec.produce(TOPICS.events, completion_of(first))
    assert rec.poll()
    rec.produce(TOPICS.events, completion_of(second))  # placement is down
    rec.start()
    rec.produce(TOPICS.events, admitted("j3", gpus_per_worker=4, at=20))
    assert rec.poll()
    assert len(granted(rec.records)) == 4  # j2 and j3 got the freed GPUs
    rec.produce(TOPICS.events, completion_of(granted(rec.records)[3]))
    assert [type(e.data) for _, e in rec.poll()] == [AllocationReleased]  # nothing waits: no cycle
    released = [r for r in rec.records if r.type == "gangline.allocation.released.v1"]
    assert [(r.envelope["data"]["job_id"], r.envelope["source"]) for r in released] == [
        (first.envelope["data"]["job_id"], "gangline/placement"),
        (second.envelope["data"]["job_id"], "gangline/placement"),
        ("j3", "gangline/placement"),
    ]

    result = replay_placement(rec.records, topics=TOPICS, gated=False)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2
    # A release the replay would not have decided is named.
    bad = tampered(rec.records, released[1], lambda body: body["data"].update(reason="failed"))
    assert not replay_placement(bad, topics=TOPICS, gated=False).ok


def test_a_log_with_a_refused_node_and_mig_grants_replays_identical() -> None:
    rec = Recorder()
    for node in cluster(("a", 1, 8)).registrations():
        rec.produce(TOPICS.inventory, env(node))
    rec.produce(TOPICS.inventory, env(standin_registration("pcie-a30-mig", "a30-0")))
    rec.produce(TOPICS.inventory, env(standin_registration("dgx-a100-mig", "mig-0")))
    rec.produce(TOPICS.events, admitted("s1", gpus_per_worker=0, mig_profile="1g.10gb", workers=3, at=1))
    rec.produce(TOPICS.events, admitted("w1", gpus_per_worker=8, at=2))
    outputs = rec.poll()
    assert [out.data.node for _, out in outputs if out.type == "gangline.node.rejected.v1"] == ["a30-0"]
    rec.start()  # restored: the rejection is in the log, so it is not sent again
    rec.produce(TOPICS.events, admitted("s2", gpus_per_worker=0, mig_profile="3g.40gb", at=3))
    assert all(out.type != "gangline.node.rejected.v1" for _, out in rec.poll())
    # a later batch of the same run: another refused node, then work that still lands
    rec.produce(TOPICS.inventory, env(standin_registration("pcie-a30-mig", "a30-1")))
    rec.produce(TOPICS.events, admitted("s3", gpus_per_worker=0, mig_profile="2g.20gb", at=4))
    assert [out.data.node for _, out in rec.poll() if out.type == "gangline.node.rejected.v1"] == ["a30-1"]
    assert len(granted(rec.records)) == 4

    result = replay_placement(rec.records, topics=TOPICS, gated=False)

    assert result.ok, [d.message for d in result.differences]
    assert result.incarnations == 2
